"""Planning a claimed process's settings: nice, policy, its cgroup, then the affinity of
every thread (one CPU a thread for a spread tree), and giving back what a left-out
descendant inherited. The [[process]] table and its rules are :mod:`gputuned.profile.tables.process`."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from gputuned import errors
from gputuned.changes import Change, TunerPlan
from gputuned.cpulist import format_cpulist
from gputuned.kernel.proc import ProcInfo, read_process
from gputuned.kernel.system import cgroup_cpus, nearest_cgroup
from gputuned.profile.tables.process import Config
from gputuned.settings.threads import DEFAULT_AFFINITY, policy_value
from gputuned.tuners import inplace
from gputuned.tuners.cmdmatch import SEARCHES
from gputuned.tuners.context import Claim, PlanContext
from gputuned.tuners.gpuplace import Target, by_gpu_targets
from gputuned.tuners.proctree import (
    Tuned,
    claim,
    claim_input,
    current,
    origins,
    parent_origin,
    tuned_by,
)
from gputuned.tuners.procwrite import ChangeWriter
from gputuned.tuners.selfbind import binding_notes
from gputuned.tuners.spread import Spread, tree_spreads


class ProcessTuner:
    """Nice level, scheduling policy, CPU placement and cgroup of matching process trees."""

    name = "process"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        return self.plan_tree(ctx)[0]

    def plan_tree(
        self, ctx: PlanContext, only: Mapping[int, Collection[int]] | None = None
    ) -> tuple[TunerPlan, dict[int, Claim]]:
        """The plan, and every process a rule claims (the daemon keeps those to place the
        children they start later). ``only``: pid -> the threads to plan (the daemon's new
        threads), the main thread read with them for the process's originals; other pids
        and processes of ``spread_threads`` rules (one CPU a thread, planned against every
        thread) are read whole."""
        out = TunerPlan()
        claims = claim(ctx.processes, claim_input(ctx, out.notes))
        targets = by_gpu_targets(ctx, claims, out.notes)
        out.notes += SEARCHES.notes()
        out.notes += binding_notes(ctx, claims)
        found = {c.rule for c in claims.values() if c.role == "match"}
        for rule in ctx.profile.process:
            if rule.name not in found:
                out.notes.append(
                    f"process[{rule.name}]: no running process matches; the daemon (gputuned) "
                    "places it when it starts"
                )
        others = sorted(pid for pid, c in claims.items() if c.why == "another user")
        if others:
            shown = ", ".join(map(str, others[:10])) + (" ..." if len(others) > 10 else "")
            out.notes.append(
                f"process: {len(others)} descendant(s) running as another user than their "
                f"parent left out (PID {shown}); other_users = true places them too"
            )
        if any(r.children == "follow" for r in ctx.profile.process):
            out.notes.append(
                "process: the processes a matched process starts are placed with it; those "
                "started after a one-shot apply are placed only while the daemon (gputuned) "
                "runs, and revert puts back any that inherited the placement"
            )
        placing, spreads = self._read_all(ctx, claims, only or {})
        for pid, p in placing.items():
            if p.role == "excluded":
                out.changes += self._give_back(ctx, p)
            else:
                out.changes += self._plan_proc(ctx, p, spreads.get(pid), targets.get(pid))
        return out, claims

    def _read_all(
        self, ctx: PlanContext, claims: dict[int, Claim], only: Mapping[int, Collection[int]]
    ) -> tuple[dict[int, _Placing], dict[int, Spread]]:
        """Every claimed process read with its threads (parents first), and the spread of
        each process of a spread tree (tuners/spread.py). Planning a spread may need processes
        placed earlier whose threads move: they are read again and join the result."""
        rules = {r.name: r for r in ctx.profile.process}
        origin_of: dict[int, dict[str, str | None]] = {}
        out: dict[int, _Placing] = {}
        for pid, c in claims.items():
            rule = rules[c.rule]
            tids = None if rule.spread_threads else only.get(pid)
            p = self._read(ctx, rule, pid, c, origin_of, tids)
            if p is not None:
                out[pid] = p

        def load(pid: int) -> ProcInfo | None:
            c = ctx.claimed[pid]
            p = self._read(ctx, rules[c.rule], pid, c, origin_of) if c.rule in rules else None
            if p is not None:
                out[pid] = p
            return None if p is None else p.proc

        placed = {pid: (p.rule, p.claim, p.proc) for pid, p in out.items() if p.role != "excluded"}
        return out, tree_spreads(ctx, placed, load)

    @staticmethod
    def _read(
        ctx: PlanContext,
        rule: Config,
        pid: int,
        c: Claim,
        origin_of: dict[int, dict[str, str | None]],
        tids: Collection[int] | None = None,
    ) -> _Placing | None:
        """``pid`` with its threads (the scan read none), and its originals; None once it has
        exited or its PID is another process's. Parents before children: a child's
        originals come from its parent's (``origin_of``)."""
        try:
            full = read_process(ctx.kernel, pid, tids=tids)
        except errors.TargetGone:
            return None
        if full.start_time != c.start:
            return None
        tuned = tuned_by(ctx, rule)
        if tuned.cgroup is not None and inplace.decision(ctx).place is not None:
            tuned = replace(tuned, cgroup=None)  # its own cgroup is the partition: no move
        orig = origins(full, c, tuned, parent_origin(ctx, c, origin_of), ctx.original)
        origin_of[pid] = orig
        return _Placing(rule, full, c, orig, tuned)

    def _plan_proc(
        self, ctx: PlanContext, p: _Placing, spread: Spread | None, target: Target | None = None
    ) -> list[Change]:
        """Settings for one process, in apply order: nice, policy, cgroup, then affinity.

        The move comes before the affinity: once a partition holds its CPUs they leave every
        other cgroup's effective set, so a thread outside the partition cannot be pinned to
        them (sched_setaffinity returns EINVAL). On revert the affinity is restored while the
        process is still inside; the kernel keeps only the part its cpuset allows, so revert
        makes a second pass for such values once the process is back in its own cgroup.

        A thread that shows the rule's value and whose process's original is known (journaled,
        or its parent's: see proctree.origins()) got that value from gputuned's placement: its
        journaled original is that one, not the value it shows.
        """
        rule, proc, orig, tuned = p.rule, p.proc, p.orig, p.tuned
        w = ChangeWriter(self.name, ctx, rule, proc, p.claim)
        threads = proc.threads
        if rule.nice is not None:
            w.per_thread(
                "nice",
                {t.tid: str(t.nice) for t in threads},
                {t.tid: str(rule.nice) for t in threads},
                str(rule.nice),
                orig,
                tuned,
            )
        if rule.policy != "keep":
            want = policy_value(rule.policy, rule.priority or 0)
            w.per_thread(
                "policy",
                {t.tid: policy_value(t.policy, t.rt_priority) for t in threads},
                {t.tid: want for t in threads},
                want,
                orig,
                tuned,
            )
        if target is not None:  # by_gpu: its GPU's partition, or out of every one
            self._move_by_gpu(ctx, w, p, target)
        elif tuned.cgroup is not None:
            w.move(tuned.cgroup, orig.get("cgroup") if proc.cgroup == tuned.cgroup else None)
        if rule.cpus != "keep" and ctx.self_bound.get(proc.pid) != proc.start_time:
            # (A process the daemon leaves its CPUs to: it binds itself, daemon/selfbind.py.)
            cpus = ctx.sets.sets[rule.cpus] if target is None else target.cpus
            if target is not None and not cpus:
                return w.out  # no CPU of its nodes is outside the partitions (noted)
            if spread is None:
                plan = {t.tid: cpus for t in threads}
                shown = format_cpulist(cpus)
                if target is not None and target.why:
                    shown += f" ({target.why})"
            else:  # one CPU a thread, planned with the rest of the tree (tuners/spread.py)
                plan = {t.tid: frozenset({spread.cpu[t.tid]}) for t in threads}
                shown = spread.describe(proc.pid, plan)
            # A thread whose affinity is just what its cgroup allows never chose one: its
            # original is "whatever the cgroup allows" (DEFAULT_AFFINITY), not the CPU list
            # of the moment, which a partition may have narrowed.
            allowed = _cgroup_cpus(ctx, proc.cgroup)
            w.per_thread(
                "affinity",
                {
                    t.tid: DEFAULT_AFFINITY if t.affinity == allowed else format_cpulist(t.affinity)
                    for t in threads
                },
                {tid: format_cpulist(c) for tid, c in plan.items()},
                shown,
                orig,
                tuned,
                have={t.tid: format_cpulist(t.affinity) for t in threads},
            )
        return w.out

    @staticmethod
    def _move_by_gpu(ctx: PlanContext, w: ChangeWriter, p: _Placing, target: Target) -> None:
        """Into the partition of its GPU; or, using GPUs of two partitions, back out of the
        one it is in (to where it came from: its original cgroup, or the nearest existing
        ancestor of it)."""
        in_ours = p.tuned.shows("cgroup", p.proc.cgroup)
        origin = p.orig.get("cgroup") if in_ours else None
        if target.cgroup is not None:
            w.move(target.cgroup, origin)
        elif target.leave and in_ours and origin is not None:
            w.move(nearest_cgroup(ctx.kernel, ctx.cgroup.v2_mount or "", origin), origin)

    def _give_back(self, ctx: PlanContext, p: _Placing) -> list[Change]:
        """A descendant the rule leaves out: where it shows what the placement passed on at
        fork, it gets its ancestor's original instead (journaled as its own, so revert leaves
        it so). Nothing where it never inherited anything from gputuned."""
        rule, proc, orig, tuned = p.rule, p.proc, p.orig, p.tuned
        w = ChangeWriter(self.name, ctx, rule, proc, p.claim)
        for attr in ("nice", "policy", "cgroup", "affinity"):
            was = orig.get(attr)
            if was is None:
                continue
            if attr == "cgroup":
                if tuned.shows("cgroup", proc.cgroup):
                    mount = ctx.cgroup.v2_mount or ""
                    w.move(nearest_cgroup(ctx.kernel, mount, was), was)
                continue
            now = {t.tid: current(proc, t, attr) for t in proc.threads}
            back = {tid: was for tid, v in now.items() if v != was and tuned.shows(attr, v)}
            if back:
                shown = "what its cgroup allows" if was == DEFAULT_AFFINITY else was
                w.per_thread(attr, now, back, shown, orig, tuned, give_back=True)
        return w.out


@dataclass(frozen=True)
class _Placing:
    """A process a rule claims, read with its threads, and its originals."""

    rule: Config
    proc: ProcInfo
    claim: Claim
    orig: dict[str, str | None]
    tuned: Tuned

    @property
    def role(self) -> str:
        return self.claim.role


def _cgroup_cpus(ctx: PlanContext, cgroup: str) -> frozenset[int]:
    """The CPUs a process's cgroup lets it use: cpuset.cpus.effective, else all online."""
    mount = ctx.cgroup.v2_mount
    if mount and ctx.cgroup.partitions_possible:
        cpus = cgroup_cpus(ctx.kernel, mount, cgroup)
        if cpus is not None:
            return cpus
    return ctx.cpus.online
