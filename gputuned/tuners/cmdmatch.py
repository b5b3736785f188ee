"""`match.cmdline` and `exclude.cmdline`: a profile's regexes on command lines other users write.

Every local user chooses their own command line, of any length (the kernel allows 2 MiB with
the default stack limit), and renames their process as often as they like, and the daemon
matches the rules again at every start, exec and rename. Python's regex engine backtracks, so
a pattern searched in such a line can take time without end: with the first shipped pattern,
``python3`` and 40 ``-X`` options (128 bytes) took minutes, and a 1 MiB line stalled root's
``gputunectl status`` (issue 14, finding 5). Three limits, each stated in docs/profiles.md:

- Only the first :data:`~gputuned.kernel.proc.CMDLINE_BYTES` (4 KiB) of a command line are read
  and searched (gputuned/kernel/proc.py); a longer one is cut there.
- A pattern in which a repetition without an upper bound (``*``, ``+``, ``{m,}``) holds
  another one is refused at load (:func:`gputuned.profile.patterns.check_pattern`): such patterns can backtrack
  exponentially. Possessive (``*+``) and atomic (``(?>...)``) forms never give back what they
  matched and are accepted.
- Each search gets :data:`BUDGET_S` of CPU (:class:`~gputuned.kernel.cpubudget.CpuBudget`). One
  that runs past it is stopped and the pattern is *suspended for that process* (its PID and
  start time) until the profile is applied again: it is not searched in that command line
  again, and it answers as the safe side would. A suspended ``match.cmdline`` does not match
  the process (the rule grants it nothing); a suspended ``exclude.cmdline`` leaves it out (it
  gets back what its ancestor had). The log, ``plan`` and ``gputunectl status`` name the rule
  and the process.
- Suspending only for the process is what keeps one user from switching a rule off for
  everyone (issue 30): a pattern suspended for all processes let any user's crafted command
  line stop root's server from being placed. And a rule's owner keys (``user``, ``uid``,
  ``unit``, ``cgroup``: one stat or one read each) are checked before its pattern is searched
  (gputuned/tuners/proctree.py), so a rule that names an owner never searches another user's
  command line at all. The price: each crafted process may cost the daemon one budget (50 ms)
  for a rule without owner keys and a pattern slow enough; :data:`MAX_SUSPENDED` processes
  are remembered, the oldest forgotten first.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

from gputuned.kernel.cpubudget import CpuBudget, Overrun
from gputuned.userdocs import cite

log = logging.getLogger(__name__)

#: CPU seconds one search may take. The shipped pattern takes about 0.1 ms on a 4 KiB line.
BUDGET_S = 0.05
#: (pattern, process) suspensions remembered until the next apply; and listed in notes.
MAX_SUSPENDED = 1024
MAX_NOTES = 8


# ---- at run time ----------------------------------------------------------------------------


class Searches:
    """Pattern searches under the CPU budget, and the patterns suspended for running past it.

    One per process (:data:`SEARCHES`): the daemon keeps suspensions across its placements
    until a profile is applied again (:meth:`reset`).
    """

    def __init__(self, budget_s: float = BUDGET_S) -> None:
        self.budget_s = budget_s
        #: (pattern, pid, start time) -> what happened (rule, key, process), for the log,
        #: plan and status; oldest first.
        self.suspended: dict[tuple[str, int, int], str] = {}
        self._compiled: dict[str, re.Pattern[str]] = {}
        self._budget: CpuBudget | None = None

    def reset(self) -> None:
        self.suspended.clear()
        self._compiled.clear()

    @contextlib.contextmanager
    def budgeted(self) -> Iterator[None]:
        """Searches in this block are stopped at the budget (the signal handler is set once
        for the block; outside one a search is measured and judged after the fact)."""
        if self._budget is not None:
            yield
            return
        with CpuBudget(self.budget_s) as b:
            self._budget = b
            try:
                yield
            finally:
                self._budget = None

    def search(
        self, pattern: str, text: str, *, what: str, pid: int, start: int, safe: bool
    ) -> bool:
        """Does ``pattern`` occur in ``text``, the command line of process (``pid``,
        ``start``)? ``safe``: the answer when the search cannot be finished within the budget,
        or the pattern is suspended for this process (see the module doc)."""
        key = (pattern, pid, start)
        if key in self.suspended:
            return safe
        rx = self._compiled.get(pattern)
        if rx is None:
            rx = self._compiled[pattern] = re.compile(pattern)
        try:
            if self._budget is not None:
                return self._budget.run(lambda: rx.search(text) is not None)
            with CpuBudget(self.budget_s) as budget:  # outside budgeted(): a handler for this one
                return budget.run(lambda: rx.search(text) is not None)
        except Overrun as exc:
            why = f"{exc} on the command line of pid {pid} ({len(text)} characters)"
        except Exception as exc:  # the engine's own errors (SystemError, RecursionError)
            why = f"failed on the command line of pid {pid} ({type(exc).__name__}: {exc})"
        note = (
            f"{what} {why}: suspended for that process until the profile is applied again "
            f"({'it does not match it' if not safe else 'it is left out'}); other processes "
            "are still searched; rewrite the pattern so that it cannot backtrack "
            f"({cite('profiles.md')})"
        )
        if len(self.suspended) >= MAX_SUSPENDED:
            del self.suspended[next(iter(self.suspended))]
        self.suspended[key] = note
        log.error("process: %s", note)
        return safe

    def notes(self) -> list[str]:
        """The newest suspensions, at most :data:`MAX_NOTES`, and how many more there are."""
        notes = list(self.suspended.values())
        if len(notes) <= MAX_NOTES:
            return notes
        more = len(notes) - MAX_NOTES
        return [*notes[-MAX_NOTES:], f"process: {more} more suspended pattern searches"]


SEARCHES = Searches()
