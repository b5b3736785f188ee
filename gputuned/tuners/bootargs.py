"""Plans the `[bootargs]` table (its keys and manual: gputuned/profile/tables/bootargs.py):
the kernel command-line arguments that only a boot can set, compared with /proc/cmdline."""

from __future__ import annotations

from collections.abc import Sequence

from gputuned.changes import Change, TunerPlan
from gputuned.cpulist import format_cpulist
from gputuned.tuners.context import PlanContext


class BootargsTuner:
    """Kernel arguments the profile wants, compared with /proc/cmdline. Plan-only here."""

    name = "bootargs"

    def wanted(self, ctx: PlanContext) -> list[str]:
        cfg = ctx.profile.bootargs
        sets = ctx.sets.sets
        out: list[str] = []
        if cfg is None:
            return out
        for key in ("nohz_full", "rcu_nocbs", "irqaffinity"):
            name = getattr(cfg, key)
            if name is not None:
                out.append(f"{key}={format_cpulist(sets[name])}")
        if cfg.pcie_aspm is not None:
            out.append(f"pcie_aspm={cfg.pcie_aspm}")
        out += list(cfg.extra)
        return out

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        out = TunerPlan()
        have = ctx.snap.cmdline.split()
        have_keys = {a.partition("=")[0]: a for a in have}
        for arg in self.wanted(ctx):
            if arg in have:
                continue
            key = arg.partition("=")[0]
            now = f" (now {have_keys[key]})" if key in have_keys else ""
            out.pending_boot.append(arg + now)
        return out
