"""apply and revert: journal, write, read back; undo on failure; restore newest first.

The order for every write: read the old value, append it to the journal and fsync, write,
read back. A crash anywhere leaves a journal naming everything that may have changed, so
``revert`` (or the next daemon start) can put it back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gputuned import errors
from gputuned.engine.changes import Change, Refusal
from gputuned.engine.journal import Journal
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.engine.revert import (
    RevertReport,
    forget_process,
    restore,
    restore_processes,
    revert_all,
)
from gputuned.kernel import Kernel
from gputuned.profile.model import Profile
from gputuned.settings.base import Op, ReadBackMismatch, Reused, SetBack
from gputuned.settings.registry import (
    expand,
    holds,
    not_possible,
    of_change,
    setting,
    start_write,
    write,
)
from gputuned.store.state import (
    ACTIVE,
    STATE,
    HostLock,
    check_state_files,
    read_optional_bytes,
    replace_durable,
)

__all__ = [
    "ApplyError",
    "ApplyReport",
    "RevertReport",
    "apply_profile",
    "apply_settings",
    "forget_process",
    "read_active",
    "read_state",
    "restore_processes",
    "revert_all",
]

log = logging.getLogger(__name__)


class ApplyError(errors.GputunedError):
    """An apply failed part-way; what it had written is reverted unless --keep-going."""

    def __init__(self, message: str, report: ApplyReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class ApplyReport:
    written: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # exited or reused processes
    not_possible: dict[str, dict[str, str]] = field(default_factory=dict)  # setting key -> why
    failed: list[dict[str, str]] = field(default_factory=list)
    restored: list[dict[str, str]] = field(default_factory=list)  # leftovers of another profile
    rolled_back: bool = False
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "skipped": self.skipped,
            "not_possible": self.not_possible,
            "failed": self.failed,
            "restored": self.restored,
            "rolled_back": self.rolled_back,
            "seconds": round(self.seconds, 4),
        }


def _prepare(
    kernel: Kernel, journal: Journal, op: Op, *, defer: bool = False
) -> tuple[str, bool] | None:
    """Journal ``op``'s old value. Returns (old value, journal entry is new), None if no-op.

    A process setting whose plan knows its origin (it shows what a placement passed on at
    fork: tuners/proctree.py origins()) journals that origin, not the value it shows.
    """
    kind = setting(op.kind)
    origin = op.data.get("origin") if kind.placement else None
    if _holds(kernel, op):
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


def _holds(kernel: Kernel, op: Op) -> bool:
    """Does the machine hold ``op``'s value already (its kind's ``holds_already``)?"""
    return setting(op.kind).holds_already(kernel, op, op.value)


def _commit(
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
            _restore_quietly(kernel, op, old)
            journal.drop(op.key)
        raise


def _one(kernel: Kernel, journal: Journal, op: Op) -> tuple[str, bool] | None:
    """Journal and write one op. Returns (old value, journal entry is new), None if no-op."""
    done = _prepare(kernel, journal, op)
    if done is not None:
        _commit(kernel, journal, op, *done)
    return done


def _restore_quietly(kernel: Kernel, op: Op, old: str) -> None:
    try:
        write(kernel, op, old)
    except errors.GputunedError as exc:
        log.debug("%s: %s: restore after a failed write failed too: %s", op.tuner, op.target, exc)


def managed_op_keys(settings: list[Change]) -> set[str]:
    return {op.key for ch in settings if not ch.report_only for op in expand(ch)}


def apply_profile(
    kernel: Kernel,
    profile: Profile,
    *,
    keep_going: bool = False,
    source: str = "",
    lock: bool = True,
    registered: dict[int, tuple[int, str]] | None = None,
    journal: Journal | None = None,
    reload_path: str | None = None,
    self_bound: Mapping[int, int] | None = None,
) -> tuple[PlanResult, ApplyReport]:
    """Make the host match ``profile``; only differences are written.

    ``source`` says where the profile came from (shown by status); ``reload_path`` is the file
    the daemon may read it again from at start and on SIGHUP, recorded only where root named it
    (a one-shot apply, the daemon's --profile, a profile directory): a profile sent over the
    control socket has none, and is re-applied from its stored copy (issue 14, finding 7).
    ``lock=False`` is for the daemon, which holds the host lock for its whole life.
    ``registered`` maps PIDs placed by hand (``gputunectl register``) to (start time, rule).
    ``journal``: the caller's open journal (the daemon keeps one for its whole life).
    ``self_bound``: processes whose CPUs the daemon leaves to them (pid -> start time).
    """
    t0 = time.monotonic()
    with HostLock(kernel) if lock else contextlib.nullcontext():
        check_state_files(kernel)  # before any write: a state file others could write is refused
        journal = journal if journal is not None else Journal(kernel)
        plan = plan_profile(
            kernel, profile, registered=registered, journal=journal, self_bound=self_bound
        )
        report = ApplyReport()
        managed = managed_op_keys(plan.settings)
        # A partition made in place that this plan no longer keeps (its unit stopped) gives
        # its CPUs back first: the partition this plan makes needs them (tuners/inplace.py).
        given_back = len(report.restored)
        _restore_leftovers(kernel, journal, managed, report, borrowed=True)
        if len(report.restored) > given_back:
            _controllers_again(kernel, plan)
        try:
            apply_settings(kernel, journal, plan.settings, report, keep_going=keep_going)
        except ApplyError as exc:
            report.seconds = time.monotonic() - t0
            raise ApplyError(f"apply {profile.name}: {exc}", report) from exc.__cause__
        _restore_leftovers(kernel, journal, managed, report)
        journal.compact()
        _record(kernel, profile, source, report, reload_path, plan.refused)
        report.seconds = time.monotonic() - t0
        return plan, report


def _controllers_again(kernel: Kernel, plan: PlanResult) -> None:
    """systemd realizes a unit's parents when its AllowedCPUs= goes, and writes "-cpuset"
    where no unit needs it, the root's too: a controller the plan found enabled is written
    again if it went. The rest of the plan stands (planning anew here, in the middle of a
    unit's restart, saw its new cgroup half made and moved the server out of it)."""
    for i, ch in enumerate(plan.settings):
        if ch.kind == "controller" and ch.in_sync and not ch.report_only:
            try:
                held = all(_holds(kernel, op) for op in expand(ch))
            except errors.GputunedError:
                held = False
            if not held:
                plan.settings[i] = replace(ch, in_sync=False)


def apply_settings(
    kernel: Kernel,
    journal: Journal,
    settings: list[Change],
    report: ApplyReport,
    *,
    keep_going: bool,
    batch: bool = False,
) -> None:
    """Write every setting that is not in sync (journal first, read back after).

    On a failure without ``keep_going``, what this call wrote is undone and ApplyError raised.
    ``batch=True`` journals every old value first with one fsync, then writes: for the daemon's
    placements, where an fsync per thread setting was most of the time from exec to placed.
    A setting that holds by the time its turn comes (a thread's CPUs narrowed by its process's
    move into the partition) is not written; its journaled original stays, as for inherited
    values.
    """
    # In-sync process settings still go through _prepare: a thread or a child process that
    # inherited its values needs its original journaled (nothing is written for it).
    ops = [
        (ch, op)
        for ch in settings
        if not (ch.report_only or (ch.in_sync and not of_change(ch).placement))
        for op in expand(ch)
    ]
    w = _Writer(kernel, journal, report, keep_going)
    if batch:
        w.batched(ops)
    else:
        w.one_by_one(ops)


def _irq_affinity(op: Op) -> bool:
    return op.tuner == "irq" and op.kind == "sysfs"


@dataclass
class _Writer:
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
            if _irq_affinity(op):
                j = i + 1
                while j < len(ops) and _irq_affinity(ops[j][1]):
                    j += 1
                self.batched(ops[i:j])
                i = j
                continue
            i += 1
            try:
                if setting(op.kind).in_background and self.pending is None:
                    done = _prepare(self.kernel, self.journal, op)
                    if done is not None:
                        self.pending = (ch, op, *done, self.start(op, *done))
                    continue
                done = _one(self.kernel, self.journal, op)
            except errors.GputunedError as exc:
                self.fail(ch, op, exc)
            else:
                if done is not None:
                    self.written(op, *done)
        self.settle()

    def start(self, op: Op, old: str, new_entry: bool) -> Callable[[], None]:
        try:
            return start_write(self.kernel, op, op.value)
        except BaseException:  # refused before it began: as _commit does for a write
            if new_entry:
                _restore_quietly(self.kernel, op, old)
                self.journal.drop(op.key)
            raise

    def settle(self) -> None:
        """Wait for the remount under way, read it back, and count it as written or failed."""
        if self.pending is None:
            return
        ch, op, old, new_entry, started = self.pending
        self.pending = None
        try:
            _commit(self.kernel, self.journal, op, old, new_entry, started)
        except errors.GputunedError as exc:
            self.fail(ch, op, exc)
        else:
            self.written(op, old, new_entry)

    def batched(self, ops: list[tuple[Change, Op]]) -> None:
        prepared: list[tuple[Change, Op, str, bool]] = []
        for ch, op in ops:
            try:
                done = _prepare(self.kernel, self.journal, op, defer=True)
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
                if _holds(self.kernel, op):
                    continue
                _commit(self.kernel, self.journal, op, old, new_entry)
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
            _rollback(self.kernel, self.journal, self.undo)
            self.report.rolled_back = True
            raise ApplyError(
                f"{op.tuner} {op.target} failed: {exc}; the {len(self.undo)} write(s) "
                "before it were reverted (use --keep-going to keep them and continue)",
                self.report,
            ) from exc


def _rollback(kernel: Kernel, journal: Journal, undo: list[tuple[Op, str, bool]]) -> None:
    for op, old, new_entry in reversed(undo):
        try:
            write(kernel, op, old)
        except errors.GputunedError as exc:
            log.error("%s: %s: rollback failed: %s (kept in the journal)", op.tuner, op.target, exc)
            continue
        if new_entry:
            journal.drop(op.key)


def _restore_leftovers(
    kernel: Kernel,
    journal: Journal,
    managed: set[str],
    report: ApplyReport,
    *,
    borrowed: bool = False,
) -> None:
    """Settings journaled by an earlier profile (or plan) that this one does not manage go
    back. ``borrowed``: only those of borrowed kinds (Setting.borrowed)."""
    todo = [
        e
        for e in journal.newest_first()
        if e.op.key not in managed and (not borrowed or setting(e.op.kind).borrowed)
    ]
    if todo:
        rep = RevertReport()
        restore(kernel, journal, todo, rep)
        report.restored += rep.restored
        report.failed += rep.failed


def _record(
    kernel: Kernel,
    profile: Profile,
    source: str,
    report: ApplyReport,
    reload_path: str | None,
    refused: list[Refusal],
) -> None:
    state = {
        "profile": profile.name,
        "source": source,
        "applied_at": time.time(),
        "not_possible": report.not_possible,
        # What the plan refused is not possible here either; status shows it with the rest
        # (it was lost after apply: issue 19, item 4).
        "refused": [{"tuner": r.tuner, "target": r.target, "reason": r.reason} for r in refused],
    }
    replace_durable(kernel, STATE, json.dumps(state, indent=1).encode())
    active: dict[str, Any] = {
        "source": source,
        "profile": profile.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    if reload_path is not None:
        active["path"] = reload_path
    replace_durable(kernel, ACTIVE, json.dumps(active, indent=1).encode(), mode=0o644)


def read_state(kernel: Kernel) -> dict[str, Any]:
    raw = read_optional_bytes(kernel, STATE)
    return dict(json.loads(raw)) if raw else {}


def read_active(kernel: Kernel) -> dict[str, Any] | None:
    raw = read_optional_bytes(kernel, ACTIVE)
    return dict(json.loads(raw)) if raw else None
