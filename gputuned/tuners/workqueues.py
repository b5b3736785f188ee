"""Plans the `[workqueues]` table (its keys and manual: gputuned/profile/tables/workqueues.py):
the CPU mask of the unbound workqueues and of each workqueue that has its own, and the CPU
affinity of each kernel thread that may be moved (one ``thread`` change each, the setting a
placed process's affinity uses: gputuned/settings/threads.py, keyed by PID and start time)."""

from __future__ import annotations

from collections.abc import Sequence

from gputuned import errors
from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.cpulist import format_cpulist, format_mask, parse_cpulist, parse_mask
from gputuned.kernel.masks import PF_NO_SETAFFINITY, UNBOUND_WORKQUEUES, WORKQUEUES
from gputuned.kernel.procfs import FLAGS, parse_stat, parse_status
from gputuned.kernel.system import cgroup_cpus
from gputuned.profile.tables.workqueues import TABLE, Config
from gputuned.tuners.context import PlanContext


class WorkqueuesTuner:
    name = "workqueues"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        cfg: Config | None = TABLE.present(ctx.profile)
        out = TunerPlan()
        if cfg is None or cfg.cpus == "keep":
            return out
        kernel = ctx.kernel
        if not kernel.exists(UNBOUND_WORKQUEUES):
            why = f"not possible here: {UNBOUND_WORKQUEUES} is not there (Linux before 4.2?)"
            out.refused.append(Refusal(self.name, "unbound workqueues", why))
            return out
        isolated = parse_mask(kernel.read_optional(f"{WORKQUEUES}/cpumask_isolated") or "0")
        if isolated:
            out.notes.append(
                f"workqueues: the kernel already keeps unbound work off CPUs "
                f"{format_cpulist(isolated)} (isolated partitions or isolcpus=)"
            )
        want = format_mask(ctx.sets.sets[cfg.cpus], ctx.cpus.nr_cpus)
        targets = [(UNBOUND_WORKQUEUES, "unbound workqueues")]
        targets += [
            (f"{WORKQUEUES}/{name}/cpumask", f"workqueue {name}")
            for name in sorted(kernel.listdir(WORKQUEUES))
            if kernel.exists(f"{WORKQUEUES}/{name}/cpumask")
        ]
        for path, target in targets:
            have = kernel.read_optional(path)
            if have is None:
                continue  # a workqueue destroyed since the listing
            out.changes.append(
                Change(
                    self.name,
                    target,
                    have.strip(),
                    want,
                    f"workqueues.cpus ({cfg.cpus})",
                    path,
                    cfg.report_only,
                    compare="mask",
                )
            )
        if cfg.kthreads:
            self._kthreads(ctx, cfg, out)
        return out

    def _kthreads(self, ctx: PlanContext, cfg: Config, out: TunerPlan) -> None:
        """One change per kernel thread that may be moved; the bound ones counted, not listed."""
        cpus = ctx.sets.sets[cfg.cpus]
        want = format_cpulist(cpus)
        moved: list[Change] = []
        bound = 0
        for proc in ctx.processes:
            if not proc.kernel_thread:
                continue
            try:
                st = parse_stat(ctx.kernel.read_text(f"/proc/{proc.pid}/stat"))
                if st.start_time != proc.start_time:
                    continue  # ended, and its PID reused, since the scan
                if st.field(FLAGS) & PF_NO_SETAFFINITY:
                    bound += 1  # sched_setaffinity() refuses it: the kernel's own binding
                    continue
                status = parse_status(ctx.kernel.read_text(f"/proc/{proc.pid}/status"))
            except errors.TargetGone:
                continue  # ended since the scan
            have = format_cpulist(parse_cpulist(status.get("Cpus_allowed_list", "")))
            moved.append(
                Change(
                    self.name,
                    f"kernel thread {proc.comm} (pid {proc.pid})",
                    have,
                    want,
                    f"workqueues.kthreads ({cfg.cpus})",
                    report_only=cfg.report_only,
                    key=f"thread:{proc.pid}:{proc.start_time}:affinity",
                    kind="thread",
                    data={
                        "pid": proc.pid,
                        "start": proc.start_time,
                        "ppid": proc.ppid,
                        "attr": "affinity",
                        "threads": {proc.pid: want},
                        "old": {proc.pid: have},
                    },
                )
            )
        if not (moved or bound):
            return  # no kernel thread to be seen (a tree without them)
        there = sum(1 for ch in moved if ch.current == want)
        out.notes.append(
            f"workqueues: {len(moved)} movable kernel thread(s) kept on CPUs {want} "
            f"({there} there already); {bound} bound to their CPUs by the kernel left where "
            "they are"
        )
        out.notes += _partitioned(ctx)
        out.changes += moved


def _partitioned(ctx: PlanContext) -> list[str]:
    """What cpuset partitions already do: the root cgroup's tasks, movable kernel threads
    included, lose the CPUs a partition takes (kernel/cgroup/cpuset.c update_tasks_cpumask())."""
    mount = ctx.cgroup.v2_mount
    root = cgroup_cpus(ctx.kernel, mount, "/") if mount else None
    taken = ctx.cpus.online - root if root is not None else frozenset()
    if not taken:
        return []
    return [
        f"workqueues: cpuset partitions already keep movable kernel threads off CPUs "
        f"{format_cpulist(taken)}"
    ]
