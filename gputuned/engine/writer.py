"""The ops of one apply written in order, each through :mod:`gputuned.engine.commit`: runs of
IRQ affinity writes journaled with one fsync, a remount beside the ops that follow it, and
each failure sorted into skipped, not possible here or failed; a failure ends the apply with
this call's writes undone, newest first, unless --keep-going.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from gputuned import errors
from gputuned.changes import Change, labelled
from gputuned.engine.applyreport import ApplyError, ApplyReport
from gputuned.engine.commit import already_held, commit, prepare, restore_quietly, write_one
from gputuned.engine.journal import Journal
from gputuned.kernel import Kernel
from gputuned.settings.base import Op, Reused, SetBack
from gputuned.settings.registry import not_possible, setting, start_write, write

__all__ = ["Writer", "rollback"]

# apply's log lines keep the name they had when this was part of engine/apply.py.
log = logging.getLogger("gputuned.engine.apply")


@dataclass
class Writer:
    kernel: Kernel
    journal: Journal
    report: ApplyReport
    keep_going: bool
    undo: list[tuple[Op, str, bool]] = field(default_factory=list)
    # A remount under way (journaled, started, not yet read back): see one_by_one.
    pending: tuple[Change, Op, str, bool, Callable[[], None]] | None = None

    def one_by_one(self, ops: list[tuple[Change, Op]]) -> None:
        """Journal, write and read back each op in order. A remount runs beside the ops that
        follow it (switching favordynmods on waits for an RCU grace period in the kernel) until
        a process is to be moved, which is what it speeds up, or the end. A run of IRQ
        affinity writes (each its own file, none reading another) is journaled with one fsync
        (:meth:`batched`): an fsync each was a fifth of a full apply on the H200."""
        i = 0
        while i < len(ops):
            ch, op = ops[i]
            if self.pending is not None and setting(op.kind).placement:
                self.settle()
            if setting(op.kind).batched(op):
                j = i + 1
                while j < len(ops) and setting(ops[j][1].kind).batched(ops[j][1]):
                    j += 1
                self.batched(ops[i:j])
                i = j
                continue
            i += 1
            try:
                if setting(op.kind).in_background and self.pending is None:
                    done = prepare(self.kernel, self.journal, op)
                    if done is not None:
                        self.pending = (ch, op, *done, self.start(op, *done))
                    continue
                done = write_one(self.kernel, self.journal, op)
            except errors.GputunedError as exc:
                self.fail(ch, op, exc)
            else:
                if done is not None:
                    self.written(op, *done)
        self.settle()

    def start(self, op: Op, old: str, new_entry: bool) -> Callable[[], None]:
        try:
            return start_write(self.kernel, op, op.value)
        except BaseException:  # refused before it began: as commit does for a write
            if new_entry:
                restore_quietly(self.kernel, op, old)
                self.journal.drop(op.key)
            raise

    def settle(self) -> None:
        """Wait for the remount under way, read it back, and count it as written or failed."""
        if self.pending is None:
            return
        ch, op, old, new_entry, started = self.pending
        self.pending = None
        try:
            commit(self.kernel, self.journal, op, old, new_entry, started)
        except errors.GputunedError as exc:
            self.fail(ch, op, exc)
        else:
            self.written(op, old, new_entry)

    def batched(self, ops: list[tuple[Change, Op]]) -> None:
        prepared: list[tuple[Change, Op, str, bool]] = []
        for ch, op in ops:
            try:
                done = prepare(self.kernel, self.journal, op, defer=True)
            except errors.GputunedError as exc:
                if not self.keep_going:
                    self.journal.flush()  # harmless records: nothing they protect is written
                self.fail_unwritten(ch, op, exc, prepared)
            else:
                if done is not None:
                    prepared.append((ch, op, *done))
        try:
            self.journal.flush()
        except errors.GputunedError as exc:
            for ch, op, _old, _new in prepared:
                self.fail(ch, op, exc)
            return
        for n, (ch, op, old, new_entry) in enumerate(prepared):
            try:
                if already_held(self.kernel, op):
                    continue
                commit(self.kernel, self.journal, op, old, new_entry)
            except errors.GputunedError as exc:
                self.fail_unwritten(ch, op, exc, prepared[n + 1 :])
            else:
                self.written(op, old, new_entry)

    def fail_unwritten(
        self,
        ch: Change,
        op: Op,
        exc: errors.GputunedError,
        unwritten: list[tuple[Change, Op, str, bool]],
    ) -> None:
        """:meth:`fail`; when that ends the apply, also forget the journal records of
        ``unwritten`` (journaled by this batch, never written: nothing to restore)."""
        try:
            self.fail(ch, op, exc)
        except ApplyError:
            for _ch, uop, _old, new_entry in unwritten:
                if new_entry:
                    self.journal.drop(uop.key)
            raise

    def written(self, op: Op, old: str, new_entry: bool) -> None:
        self.undo.append((op, old, new_entry))
        self.report.written.append({"target": op.target, "old": old, "new": op.value})

    def fail(self, ch: Change, op: Op, exc: errors.GputunedError) -> None:
        """Record a failed op. Unless it is skipped (its process is gone, or it set its own
        value back at once: SetBack), not possible here, or ``keep_going``: undo this call's
        writes and raise ApplyError."""
        if isinstance(exc, (errors.TargetGone, Reused, SetBack)):
            if setting(op.kind).placement or setting(op.kind).borrowed:
                self.report.skipped.append({"target": op.target, "reason": str(exc)})
                return
            why = None
        else:
            why = not_possible(op, exc)
        if why is not None:
            self.report.not_possible[ch.key] = {"target": ch.target, "reason": why}
            return
        self.report.failed.append({"target": op.target, "error": str(exc)})
        if not self.keep_going:
            self.settle()  # a remount under way is undone with the rest (or fails itself)
            rollback(self.kernel, self.journal, self.undo)
            self.report.rolled_back = True
            raise ApplyError(
                f"{labelled(op.tuner, op.target)} failed: {exc}; the {len(self.undo)} write(s) "
                "before it were reverted (use --keep-going to keep them and continue)",
                self.report,
            ) from exc


def rollback(kernel: Kernel, journal: Journal, undo: list[tuple[Op, str, bool]]) -> None:
    for op, old, new_entry in reversed(undo):
        try:
            write(kernel, op, old)
        except errors.GputunedError as exc:
            log.error("%s: %s: rollback failed: %s (kept in the journal)", op.tuner, op.target, exc)
            continue
        if new_entry:
            journal.drop(op.key)
