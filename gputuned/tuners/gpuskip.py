"""Says what the `[gpus]` table did (its keys and manual: gputuned/profile/tables/gpus.py).

The skip itself happens as the host is read for a plan (gputuned/engine/plan.py read_context):
a skipped GPU is not in the context's GPUs, so no other tuner sees it. This one only notes each
GPU skipped, and each address that is not a GPU here. It changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputuned.changes import Change, TunerPlan
from gputuned.profile.tables.gpus import TABLE, Config
from gputuned.tuners.context import PlanContext


class GpuSkipTuner:
    name = "gpus"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        cfg: Config | None = TABLE.present(ctx.profile)
        out = TunerPlan()
        if cfg is None or not cfg.skip:
            return out
        topo = ctx.snap.topo
        here = {d.bdf for d in topo.gpus(skipped=True)}
        for bdf in sorted(set(cfg.skip)):
            if bdf in here:
                out.notes.append(
                    f"GPU {bdf}: skipped ([gpus] skip): no CPUs, IRQs or PCIe settings of a GPU"
                )
            elif bdf in topo.devices:
                out.notes.append(
                    f"[gpus] skip: {bdf} is not an inference GPU here; nothing to skip"
                )
            else:
                out.notes.append(f"[gpus] skip: no GPU {bdf} on this host; nothing to skip")
        return out
