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
  another one is refused at load (:func:`check_pattern`): such patterns can backtrack
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
import importlib
import logging
import re
from collections.abc import Iterator
from typing import Any

from gputuned.kernel.cpubudget import CpuBudget, Overrun

log = logging.getLogger(__name__)

#: CPU seconds one search may take. The shipped pattern takes about 0.1 ms on a 4 KiB line.
BUDGET_S = 0.05


# ---- at load --------------------------------------------------------------------------------


def check_pattern(pattern: str) -> None:
    """Raise ValueError, saying why and how to write it, for a pattern that can backtrack
    exponentially: an unbounded repetition inside another (``(a+)*``, ``(\\S+\\s+)*``)."""
    inner = _nested_unbounded(pattern)
    if inner is None:
        return
    raise ValueError(
        f"{pattern!r} repeats a part that itself holds {inner}: on a command line made for it "
        "(any local user writes their own) such a pattern backtracks exponentially, and 40 "
        "repeated options stalled matching for minutes. Make the outer repetition possessive "
        "('*+', '++', '{m,}+'; with non-capturing groups '(?:...)' inside it: Python 3.11 "
        "fails on capturing ones there) or atomic ('(?>...)*') so that it never gives back "
        "what it matched, bound it ('{0,16}'), or drop the inner repetition"
    )


def _nested_unbounded(pattern: str) -> str | None:
    """A description of the first unbounded repetition nested in another, or None.

    Walks the parse tree of Python's own parser (Lib/re/_parser.py; private, so a Python
    that lacks it skips this check and the CPU budget alone applies). The bodies of
    possessive repetitions, atomic groups and lookarounds are walked as if at the top: the
    engine never backtracks into them from outside.
    """
    try:
        parser = importlib.import_module("re._parser")
        consts = importlib.import_module("re._constants")
    except ImportError:  # pragma: no cover - CPython 3.11+ has both
        return None
    tree = parser.parse(pattern)
    return _walk(list(tree), consts, inside=False)


def _walk(items: list[tuple[Any, Any]], c: Any, *, inside: bool) -> str | None:
    for op, av in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT):
            lo, hi, body = av
            unbounded = hi == c.MAXREPEAT
            if unbounded and inside:
                return f"a repetition without an upper bound ({_quantifier(lo)})"
            found = _walk(list(body), c, inside=inside or unbounded)
        elif op == c.POSSESSIVE_REPEAT:
            found = _walk(list(av[2]), c, inside=False)
        elif op == c.ATOMIC_GROUP:
            found = _walk(list(av), c, inside=False)
        elif op in (c.ASSERT, c.ASSERT_NOT):
            found = _walk(list(av[1]), c, inside=False)
        elif op == c.SUBPATTERN:
            found = _walk(list(av[3]), c, inside=inside)
        elif op == c.BRANCH:
            found = next((f for b in av[1] if (f := _walk(list(b), c, inside=inside))), None)
        elif op == c.GROUPREF_EXISTS:
            arms = [a for a in av[1:] if a is not None]
            found = next((f for a in arms if (f := _walk(list(a), c, inside=inside))), None)
        else:
            continue
        if found:
            return found
    return None


def _quantifier(lo: int) -> str:
    return {0: "'*'", 1: "'+'"}.get(lo, f"'{{{lo},}}'")


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
