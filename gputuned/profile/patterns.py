"""A profile's regexes on other users' command lines, checked at load: no pattern that can
backtrack exponentially (the limits at run time: gputuned/tuners/cmdmatch.py)."""

from __future__ import annotations

import importlib
from typing import Any


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
