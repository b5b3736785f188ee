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
  that runs past it is stopped and the pattern is *suspended* until the profile is applied
  again: it is not run again, and it answers as the safe side would. A suspended
  ``match.cmdline`` matches nothing (the rule grants nothing new; processes it placed stay
  placed and their new children still follow them); a suspended ``exclude.cmdline`` leaves
  every new descendant out (it gets back what its ancestor had). The log, ``plan`` and
  ``gputunectl status`` name the rule and the process. So whatever the command lines, a
  pattern costs the daemon at most one budget per full plan.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

from gputuned.kernel.cpubudget import CpuBudget, Overrun

log = logging.getLogger(__name__)

#: CPU seconds one search may take. The shipped pattern takes about 0.1 ms on a 4 KiB line.
BUDGET_S = 0.05


# ---- at run time ----------------------------------------------------------------------------


class Searches:
    """Pattern searches under the CPU budget, and the patterns suspended for running past it.

    One per process (:data:`SEARCHES`): the daemon keeps suspensions across its placements
    until a profile is applied again (:meth:`reset`).
    """

    def __init__(self, budget_s: float = BUDGET_S) -> None:
        self.budget_s = budget_s
        #: pattern -> what happened (rule, key, process), for the log, plan and status.
        self.suspended: dict[str, str] = {}
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

    def search(self, pattern: str, text: str, *, what: str, pid: int, safe: bool) -> bool:
        """Does ``pattern`` occur in ``text``? ``safe``: the answer when the search cannot
        be finished within the budget, or the pattern is suspended (see the module doc)."""
        if pattern in self.suspended:
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
        self.suspended[pattern] = (
            f"{what} {why}: suspended until the profile is applied again "
            f"({'it matches nothing' if not safe else 'every new descendant is left out'}); "
            "rewrite the pattern so that it cannot backtrack (docs/profiles.md)"
        )
        log.error("process: %s", self.suspended[pattern])
        return safe

    def notes(self) -> list[str]:
        return list(self.suspended.values())


SEARCHES = Searches()
