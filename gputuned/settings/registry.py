"""Every kind of setting, found from the classes: what the engine asks about an op or a change.

The registry imports each module of :mod:`gputuned.settings` and takes every
:class:`~gputuned.settings.base.Setting` subclass with a ``kind``: adding a kind is adding one
module (or one class). The functions below are what apply, revert, verify and the daemon call;
they never branch on a kind themselves.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING

import gputuned.settings
from gputuned import errors
from gputuned.settings.base import Op, Setting

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel import Kernel
    from gputuned.kernel.mounts import MountTable


@cache
def settings() -> dict[str, Setting]:
    """Op kind -> its setting, one instance each."""
    for mod in pkgutil.iter_modules(gputuned.settings.__path__):
        importlib.import_module(f"gputuned.settings.{mod.name}")
    out: dict[str, Setting] = {}
    todo = list(Setting.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.kind:
            assert cls.kind not in out, f"two settings of kind {cls.kind!r}"
            out[cls.kind] = cls()
    return dict(sorted(out.items()))


@cache
def change_kinds() -> dict[str, Setting]:
    """Change kind -> a setting that expands it (the per-thread kinds share "thread")."""
    return {s.change_kind: s for s in settings().values()}


def setting(kind: str) -> Setting:
    """The setting of op kind ``kind``; ValueError for a kind gputuned does not have."""
    try:
        return settings()[kind]
    except KeyError:
        raise ValueError(f"unknown op kind {kind!r}") from None


def of_change(ch: Change) -> Setting:
    try:
        return change_kinds()[ch.kind]
    except KeyError:
        raise ValueError(f"unknown change kind {ch.kind!r}") from None


@cache
def placement_kinds() -> frozenset[str]:
    """Op kinds of a placed process's settings (see Setting.placement)."""
    return frozenset(k for k, s in settings().items() if s.placement)


# -- what the engine calls ----------------------------------------------------------------------


def expand(ch: Change) -> list[Op]:
    """The ops that make ``ch`` true, in the order they must run."""
    return of_change(ch).ops(ch)


def held(kernel: Kernel, ch: Change) -> bool:
    """Does the machine hold every op of ``ch`` already? What plan, verify and the daemon's
    drift check call in sync, asked of the setting as apply asks it before each write; a
    target that cannot be read (not there yet, gone) is not in sync."""
    try:
        return all(setting(op.kind).holds_already(kernel, op, op.value) for op in expand(ch))
    except errors.GputunedError:
        return False


def impossible(ch: Change, mounts: MountTable) -> str:
    """Why apply cannot make ``ch`` here, known without writing (its first op's reason), or
    "": what plan lists as not possible here, and apply then does not try."""
    for op in expand(ch):
        why = setting(op.kind).impossible(op, mounts)
        if why is not None:
            return why
    return ""


def write(kernel: Kernel, op: Op, value: str) -> None:
    """Put ``value`` in place. Process ops check identity first."""
    setting(op.kind).write(kernel, op, value)


def start_write(kernel: Kernel, op: Op, value: str) -> Callable[[], None]:
    """:func:`write`, started: returns the function that finishes it (raising its error)."""
    return setting(op.kind).start(kernel, op, value)


def holds(kernel: Kernel, op: Op, value: str, *, just_written: bool = False) -> tuple[bool, str]:
    """Read back: does the machine hold ``value``? Returns (yes, what was read)."""
    return setting(op.kind).holds(kernel, op, value, just_written=just_written)


def not_possible(op: Op, exc: errors.GputunedError) -> str | None:
    """Why a failed write is a limit of this machine (skip it and say so), or None."""
    return setting(op.kind).not_possible(op, exc)
