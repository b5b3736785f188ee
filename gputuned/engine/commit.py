"""One op committed: its old value journaled, the write, the read-back; on a failure, that op
put back and its journal entry dropped.

The order for every write: read the old value, append it to the journal and fsync, write,
read back. A crash anywhere leaves a journal naming everything that may have changed, so
``revert`` (or the next daemon start) can put it back. The order of many ops, their batched
fsyncs and the undo of a whole apply are :mod:`gputuned.engine.writer`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gputuned import errors
from gputuned.engine.journal import Journal
from gputuned.kernel import Kernel
from gputuned.settings.base import Op, ReadBackMismatch, SetBack
from gputuned.settings.registry import holds, setting, write

__all__ = ["already_held", "commit", "prepare", "restore_quietly", "write_one"]

# apply's log lines keep the name they had when this was part of engine/apply.py.
log = logging.getLogger("gputuned.engine.apply")


def prepare(
    kernel: Kernel, journal: Journal, op: Op, *, defer: bool = False
) -> tuple[str, bool] | None:
    """Journal ``op``'s old value. Returns (old value, journal entry is new), None if no-op.

    A process setting whose plan knows its origin (it shows what a placement passed on at
    fork: tuners/proctree.py origins()) journals that origin, not the value it shows.
    """
    kind = setting(op.kind)
    origin = op.data.get("origin") if kind.placement else None
    if already_held(kernel, op):
        # Already right: an IRQ inside the allowed set, or a process or thread that inherited
        # the value from a placed parent or thread. The latter still needs its original on
        # record, or revert would leave it tuned: the original of whoever passed the value on.
        if kind.placement and op.key not in journal:
            planned = op.data.get("planned_old")
            was = origin if origin is not None else planned
            if was is not None and was != op.value:
                journal.save(op, str(was), defer=defer)
        return None
    if origin is not None:
        return str(origin), journal.save(op, str(origin), defer=defer)
    old = kind.original(kernel, op)
    return old, journal.save(op, old, defer=defer)


def already_held(kernel: Kernel, op: Op) -> bool:
    """Does the machine hold ``op``'s value already (its kind's ``holds_already``)?"""
    return setting(op.kind).holds_already(kernel, op, op.value)


def commit(
    kernel: Kernel,
    journal: Journal,
    op: Op,
    old: str,
    new_entry: bool,
    started: Callable[[], None] | None = None,
) -> None:
    """Write ``op`` (its old value already durable in the journal) and read it back.
    ``started``: the write was started already (:func:`start_write`); finish it instead."""
    try:
        if started is None:
            write(kernel, op, op.value)
        else:
            started()
        ok, seen = holds(kernel, op, op.value, just_written=True)
        if not ok and setting(op.kind).set_back(kernel, op, old):
            raise SetBack(
                f"{op.target}: wrote {op.value!r}, and it was back on {seen!r} when read "
                "back: the process sets its own (a drift check repairs it; a process that keeps "
                "doing so is left to it: self_binding)",
                path=op.path,
            )
        if not ok:
            raise ReadBackMismatch(
                f"{op.target}: wrote {op.value!r}, reads back {seen!r}", path=op.path
            )
    except BaseException:
        if new_entry:
            restore_quietly(kernel, op, old)
            journal.drop(op.key)
        raise


def write_one(kernel: Kernel, journal: Journal, op: Op) -> tuple[str, bool] | None:
    """Journal and write one op. Returns (old value, journal entry is new), None if no-op."""
    done = prepare(kernel, journal, op)
    if done is not None:
        commit(kernel, journal, op, *done)
    return done


def restore_quietly(kernel: Kernel, op: Op, old: str) -> None:
    try:
        write(kernel, op, old)
    except errors.GputunedError as exc:
        log.debug("%s: %s: restore after a failed write failed too: %s", op.tuner, op.target, exc)
