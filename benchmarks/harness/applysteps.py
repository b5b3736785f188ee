"""apply's steps wrapped from outside, for the benchmarks that time them (apply_revert.py,
daemon_trace.py), in this checkout or an earlier one they compare it with.

One op's steps live in gputuned/engine/commit.py and the order of many in engine/writer.py;
engine/apply.py and those two call each other's functions by the names they imported, so a
step is wrapped under every one of those names with the same wrapper. An earlier version has
them all in engine/apply.py, under their older ("_"-prefixed) names.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any


def modules() -> list[ModuleType]:
    """engine/apply.py and, where this version has them, engine/commit.py and writer.py."""
    import gputuned.engine.apply as apply_mod

    mods = [apply_mod]
    for part in ("commit", "writer"):
        with contextlib.suppress(ModuleNotFoundError):
            mods.append(importlib.import_module(f"gputuned.engine.{part}"))
    return mods


def find(mods: list[ModuleType], names: tuple[str, ...]) -> Any:
    """The object under the first of ``names`` that one of ``mods`` holds."""
    return next(vars(m)[n] for n in names for m in mods if n in vars(m))


def wrap(mods: list[ModuleType], names: tuple[str, ...], wrapper: Callable[[Any], Any]) -> None:
    """Replace the step known by ``names`` with ``wrapper(step)`` wherever it is looked up."""
    step = find(mods, names)
    wrapped = wrapper(step)
    for m in mods:
        for n in names:
            if vars(m).get(n) is step:
                setattr(m, n, wrapped)
