"""apply: make the host match a profile (``apply_profile``: lock, plan, write, leftovers of
another profile restored, record) or write a list of settings (``apply_settings``: the daemon's
placements).

Where the rest lives: one op's journal, write and read-back in :mod:`gputuned.engine.commit`;
the order of many ops and the undo of a failed apply in :mod:`gputuned.engine.writer`; the
report and error in :mod:`gputuned.engine.applyreport`; state.json and active.json in
:mod:`gputuned.engine.applied`; revert in :mod:`gputuned.engine.revert`. Callers import all of
these names from here, except the commands that only read state.json and active.json (status,
list, verify through the daemon): they import engine.applied, which loads no planner (issue 31).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import replace

from gputuned.changes import Change
from gputuned.engine.applied import read_active, read_state, record_applied
from gputuned.engine.applyreport import ApplyError, ApplyReport, RevertReport
from gputuned.engine.journal import Journal
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.engine.revert import (
    forget_process,
    restore,
    restore_processes,
    revert_all,
)
from gputuned.engine.writer import Writer
from gputuned.kernel import Kernel
from gputuned.profile.model import Profile
from gputuned.settings.registry import expand, held, of_change, setting
from gputuned.store.state import HostLock, check_state_files

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
        record_applied(kernel, profile, source, report, reload_path, plan.refused)
        report.seconds = time.monotonic() - t0
        return plan, report


def _controllers_again(kernel: Kernel, plan: PlanResult) -> None:
    """systemd realizes a unit's parents when its AllowedCPUs= goes, and writes "-cpuset"
    where no unit needs it, the root's too: a controller the plan found enabled is written
    again if it went. The rest of the plan stands (planning anew here, in the middle of a
    unit's restart, saw its new cgroup half made and moved the server out of it)."""
    for i, ch in enumerate(plan.settings):
        undone = of_change(ch).undone_by_others and ch.in_sync and not ch.report_only
        if undone and not held(kernel, ch):
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
    # In-sync process settings still go through prepare (engine/commit.py): a thread or a
    # child process that inherited its values needs its original journaled (nothing is
    # written for it).
    # What plan found not possible here (a read-only mount holds it) is not tried: reported
    # as the writer reports a write the kernel refuses for the same reason.
    for ch in settings:
        if ch.not_possible and not (ch.report_only or ch.in_sync):
            report.not_possible[ch.key] = {"target": ch.target, "reason": ch.not_possible}
    ops = [
        (ch, op)
        for ch in settings
        if not (ch.report_only or ch.not_possible or (ch.in_sync and not of_change(ch).placement))
        for op in expand(ch)
    ]
    w = Writer(kernel, journal, report, keep_going)
    if batch:
        w.batched(ops)
    else:
        w.one_by_one(ops)


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
