"""Plans the `[workqueues]` table (its keys and manual: gputuned/profile/tables/workqueues.py):
the CPU mask of the unbound workqueues and of each workqueue that has its own."""

from __future__ import annotations

from collections.abc import Sequence

from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.cpulist import format_cpulist, format_mask, parse_mask
from gputuned.kernel.masks import UNBOUND_WORKQUEUES, WORKQUEUES
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
        return out
