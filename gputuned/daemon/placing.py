"""Placing processes between full applies: plan and apply a new process, or only the new
threads of a placed one, against the last full plan; keep their settings for the drift check;
forget a process or thread that ends; and place the ``by_gpu`` trees again when their GPU use
changes. Each function takes the daemon's state (the Keeper, as
:class:`~gputuned.daemon.state.DaemonState` describes it); every placement goes through its
``place``. See :mod:`gputuned.daemon`."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from gputuned.daemon.inplace import replan_if_moved
from gputuned.engine.apply import ApplyReport, apply_settings
from gputuned.engine.plan import plan_processes
from gputuned.tuners.gpuplace import tree_roots
from gputuned.tuners.neighbours import capped_servers
from gputuned.tuners.proctree import claim_processes
from gputuned.tuners.selfbind import warnings_for
from gputuned.tuners.spread import held_threads

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.daemon.state import DaemonState

log = logging.getLogger("gputuned")


def place(k: DaemonState, pids: list[int], why: str, threads: dict[int, set[int]] | None) -> None:
    """Plan and apply ``pids`` (``threads``: only these new threads of each)."""
    if k.profile is None or k.ctx is None or not k.profile.process:
        return
    t0 = time.perf_counter()
    ctx = dataclasses.replace(
        k.ctx,
        claimed=k.claims,
        registered=k.registered,
        held=k.held,
        self_bound=k.binds.self_bound(),
    )
    settings, claims = plan_processes(ctx, pids, threads)
    k.claims.update(claims)
    if threads is None:
        warn_binding(k, pids)
    if claims and replan_if_moved(k):  # daemon/inplace.py
        return
    if not settings:
        return
    _keep(k, settings, merge=threads is not None)
    report = ApplyReport()
    assert k.journal is not None
    apply_settings(k.kernel, k.journal, settings, report, keep_going=True, batch=True)
    if report.not_possible:  # a limit of this machine is not drift (as Keeper.apply_full)
        k.settings = [c for c in k.settings if c.key not in report.not_possible]
    capped = capped_servers(k.kernel, k.settings, settings)
    if capped:  # it started in a cgroup [neighbours] caps: plan the neighbours again
        k.reapply(f"placed process(es) {capped} run in a cgroup [neighbours] caps")
    if report.written:
        k.counters["placements"] += 1
        log.info(
            "daemon: placed %s (%s): %d write(s) in %.1f ms",
            pids,
            why,
            len(report.written),
            (time.perf_counter() - t0) * 1e3,
        )


def _keep(k: DaemonState, settings: list[Change], *, merge: bool = False) -> None:
    """A placement's settings join those the drift check re-reads, replacing the same
    settings planned earlier (a thread moved off the CPU a new main thread took).
    ``merge``: the settings of some new threads only; they join their process's."""
    mine = [c for c in settings if not c.report_only]
    if merge:
        mine = [c for c in mine if not _merged(k, c)]
    keys = {c.key for c in mine}
    if keys:
        k.settings = [c for c in k.settings if c.key not in keys] + mine
    k.held.update(held_threads(mine))


def _merged(k: DaemonState, ch: Change) -> bool:
    """Add the threads of ``ch`` to the same setting of their process (in place: a new
    thread costs the daemon its own values, not a copy of all the others)."""
    have = k.by_key.get(ch.key)
    if have is None or ch.kind != "thread":
        return False
    for key in ("threads", "old", "origin"):
        have.data.setdefault(key, {}).update(ch.data.get(key, {}))
    for pid, h in held_threads([ch]).items():
        was = k.held.get(pid)
        if was is not None and was.start == h.start:
            was.threads.update(h.threads)
        else:
            k.held[pid] = h
    return True


def forget_thread(k: DaemonState, pid: int, tid: int) -> list[str]:
    """A thread of a placed process ended: its settings go, and the journal keys returned
    (dropped by the caller, all at once), so that the journal holds the threads alive, not
    every thread there ever was (issue 14, finding 6); compaction keeps the file within
    twice that plus 256 lines (Journal.compact_if_grown)."""
    start = k.claims[pid].start
    k.new_threads.get(pid, set()).discard(tid)
    keys = []
    for attr in ("nice", "policy", "affinity"):  # the per-thread settings
        keys.append(f"thread:{pid}:{start}:{tid}:{attr}")
        ch = k.by_key.get(f"thread:{pid}:{start}:{attr}")
        if ch is not None:
            for key in ("threads", "old", "origin"):
                ch.data.get(key, {}).pop(tid, None)
    held = k.held.get(pid)
    if held is not None:
        held.threads.pop(tid, None)
    return keys


def places(k: DaemonState, pid: int) -> bool:
    """Does the claim on ``pid`` place it (not one a rule leaves out)?"""
    return k.claims[pid].role != "excluded"


def forget(k: DaemonState, pid: int) -> bool:
    """``pid`` exited: its claim, settings and registration go. Was it known?"""
    was_claimed = drop(k, pid)
    return k.registered.pop(pid, None) is not None or was_claimed


def drop(k: DaemonState, pid: int) -> bool:
    """Stop placing ``pid`` (gone, or unregistered): its claim and settings go."""
    k.held.pop(pid, None)
    k.new_threads.pop(pid, None)
    k.binds.forget(pid)
    k.binding_warnings.pop(pid, None)
    if k.claims.pop(pid, None) is None:
        return False
    k.settings = [c for c in k.settings if c.tuner != "process" or c.data.get("pid") != pid]
    return True


def refresh_placed(k: DaemonState) -> None:
    """The claims of a full plan; a registration whose process is gone goes with it."""
    assert k.ctx is not None
    k.claims = claim_processes(k.ctx)
    k.registered = {
        pid: reg
        for pid, reg in k.registered.items()
        if pid in k.claims and k.claims[pid].start == reg[0]
    }


def warn_binding(k: DaemonState, pids: list[int]) -> None:
    """The plan's warning for those of ``pids`` a rule matches that will bind themselves,
    kept for status (tuners/selfbind.py: their command lines and environments are read
    again, since a process renamed or exec'd may be another engine now)."""
    for pid in pids:
        k.binding_warnings.pop(pid, None)
    if k.ctx is not None:
        k.binding_warnings.update(warnings_for(k.ctx, k.claims, pids))


def settle_gpu_use(k: DaemonState) -> None:
    """After a full apply, place the ``by_gpu`` trees once more against this context's
    reading of their GPU use: a GPU opened between the apply's plan and now would
    otherwise look unchanged to every later scan (nothing is written where nothing
    changed)."""
    if k.profile is None or k.ctx is None or k.ctx.gpu_use is None:
        return
    rules = {r.name for r in k.profile.process if r.by_gpu}
    mine = sorted(pid for pid, c in k.claims.items() if c.rule in rules)
    if mine:
        k.place(mine, "GPU use at apply")


def gpu_scan(k: DaemonState) -> None:
    """``by_gpu`` rules: has a process placed by one, and without a GPU open then, opened
    one since? The kernel announces no open(2), so the device nodes of those processes are
    read again (tuners/gpuuse.py); a change re-plans the whole tree, since its processes
    that use no GPU go with the GPUs the tree uses. NVML's answers change with the full
    re-plan every nvml_interval_s."""
    if k.profile is None or k.ctx is None or k.ctx.gpu_use is None:
        return
    rules = {r.name for r in k.profile.process if r.by_gpu}
    use = k.ctx.gpu_use
    # Only processes that have not opened a GPU yet: one that has is placed on it, and
    # reading every descriptor of every worker each scan would cost the most on the
    # busiest processes (a CUDA process may later open its peers' nodes too).
    mine = [pid for pid, c in k.claims.items() if c.rule in rules and pid not in use.opened]
    if not mine:
        return
    before = {pid: use.of(pid) for pid in mine}
    use.forget(set(mine))
    changed = [pid for pid in mine if use.of(pid) != before[pid]]
    if not changed:
        return
    roots = tree_roots(k.claims)
    trees = {roots.get(pid, pid) for pid in changed}
    for pid in changed:
        log.info(
            "daemon: pid %d now uses GPU(s) %s (was %s)",
            pid,
            sorted(use.of(pid)) or "none",
            sorted(before[pid]) or "none",
        )
    k.place(sorted(p for p in mine if roots.get(p, p) in trees), "GPU use changed")
