"""IRQ affinity: GPU interrupts near the inference CPUs, every other interrupt away from them.

- `gpu_cpus`: the GPUs' MSI/MSI-X vectors go to this CPU set, one vector per CPU when `spread`
  is on. The NVIDIA driver's vectors are not kernel-managed, so they can move.
- `others_cpus`: every other movable IRQ goes to this set, typically the housekeeping CPUs, so
  that network, disk and timer interrupts stop landing on the CPUs the server runs on.
- `default_affinity`: written to `/proc/irq/default_smp_affinity`, so IRQs allocated later
  (hot-plugged devices, drivers loaded later) land on this set too.

Each takes the name of a set from `[cpusets]`, or `"keep"` to leave that part alone.

Unmovable IRQs: writing `/proc/irq/N/smp_affinity_list` fails with EIO for kernel-managed IRQs
(kernel/irq/manage.c, `irq_set_affinity` refuses managed interrupts) and with EPERM for others
that cannot move (seen on virtio vectors). gputuned skips those and lists them in the report.

irqbalance: it bans only the CPUs in `/sys/devices/system/cpu/isolated` and `nohz_full`; it does
not know cgroup partitions and will move IRQs back. With `irqbalance = "coordinate"` gputuned
tells a running irqbalance which CPUs it may use through its root-only socket (`settings cpus`);
with `"report"` it only reports the conflict; with `"ignore"` it says nothing.

Boot-time IRQ placement (`irqaffinity=`) belongs to `[bootargs]`.
"""

from __future__ import annotations

import errno
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from gputuned import errors
from gputuned.changes import Change, PlanContext, Refusal, TunerPlan
from gputuned.cpulist import format_cpulist, format_mask
from gputuned.host import irqbalance


class Config(BaseModel):
    """The `[irq]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_cpus: StrictStr = Field(
        default="keep",
        description="CPU set (a [cpusets] name) for the GPUs' MSI/MSI-X vectors, or 'keep'.",
    )
    spread: StrictBool = Field(
        default=True,
        description="Give each GPU vector one CPU of gpu_cpus, round robin, not all of them.",
    )
    others_cpus: StrictStr = Field(
        default="keep",
        description="CPU set for every other movable IRQ, or 'keep'.",
    )
    default_affinity: StrictStr = Field(
        default="keep",
        description="CPU set for /proc/irq/default_smp_affinity (IRQs allocated later), or 'keep'.",
    )
    irqbalance: Literal["coordinate", "report", "ignore"] = Field(
        default="coordinate",
        description=(
            "What to do about a running irqbalance: 'coordinate' (tell it the allowed CPUs "
            "through its socket), 'report' (only report the conflict) or 'ignore'."
        ),
    )
    report_only: StrictBool = Field(
        default=False,
        description="Report what would change and change nothing.",
    )


class IrqTuner:
    """GPU MSI/MSI-X vectors onto the CPUs the profile names; every other IRQ out of their way."""

    name = "irq"

    def plan(self, ctx: PlanContext) -> TunerPlan:
        cfg = ctx.profile.irq
        out = TunerPlan()
        if cfg is None:
            return out
        sets = ctx.sets.sets
        gpu_irqs = {i.irq: g.bdf for g in ctx.snap.topo.gpus() for i in g.irqs}
        known_bad = {f.path: f.errno for f in ctx.host.faults if f.op == "write" and f.recorded}
        names = {i.irq: i.name for i in ctx.irqs}
        # irq -> (wanted CPUs, compare mode, why). GPU vectors get exactly their CPU; any other
        # IRQ only has to stay inside the others set ("cpulist_subset").
        wanted: dict[int, tuple[frozenset[int], str, str]] = {}
        if cfg.gpu_cpus != "keep":
            cpus = sorted(sets[cfg.gpu_cpus])
            why = f"GPU vector -> irq.gpu_cpus ({cfg.gpu_cpus})"
            for n, irq in enumerate(sorted(gpu_irqs)):
                target = frozenset({cpus[n % len(cpus)]}) if cfg.spread else frozenset(cpus)
                wanted[irq] = (target, "cpulist", f"{gpu_irqs[irq]} {why}")
        if cfg.others_cpus != "keep":
            others = sets[cfg.others_cpus]
            why = f"not a GPU vector -> irq.others_cpus ({cfg.others_cpus})"
            for line in ctx.irqs:
                if line.irq not in gpu_irqs and line.affinity is not None:
                    wanted[line.irq] = (others, "cpulist_subset", why)
        current = {i.irq: i.affinity for i in ctx.irqs}
        for g in ctx.snap.topo.gpus():
            current.update({i.irq: i.affinity for i in g.irqs})
        for irq, (target, mode, why) in sorted(wanted.items()):
            have = current.get(irq)
            if have is None:
                continue
            path = f"/proc/irq/{irq}/smp_affinity_list"
            label = f"irq {irq}" + (f" ({names[irq]})" if names.get(irq) else "")
            in_sync = have <= target if mode == "cpulist_subset" else have == target
            if path in known_bad:
                if not in_sync:
                    out.refused.append(
                        Refusal(
                            self.name,
                            label,
                            f"unmovable ({errno.errorcode[known_bad[path]]}): the kernel refuses "
                            "to move this IRQ; skipped",
                        )
                    )
                continue
            out.changes.append(
                Change(
                    self.name,
                    label,
                    format_cpulist(have),
                    format_cpulist(target),
                    why,
                    path,
                    cfg.report_only,
                    compare=mode,
                    in_sync=in_sync,
                )
            )
        if cfg.default_affinity != "keep" and ctx.default_affinity is not None:
            want = sets[cfg.default_affinity]
            nr = ctx.cpus.nr_cpus
            out.changes.append(
                Change(
                    self.name,
                    "default_smp_affinity",
                    format_mask(ctx.default_affinity, nr),
                    format_mask(want, nr),
                    f"IRQs allocated later land on irq.default_affinity ({cfg.default_affinity})",
                    "/proc/irq/default_smp_affinity",
                    cfg.report_only,
                    compare="mask",
                    in_sync=want == ctx.default_affinity,
                )
            )
        self._irqbalance(ctx, out)
        return out

    def _irqbalance(self, ctx: PlanContext, out: TunerPlan) -> None:
        """irqbalance would undo the placement: tell it, or say plainly that it conflicts.

        It avoids only isolated and nohz_full CPUs and knows nothing of cpuset partitions
        (irqbalance cputree.c), so "coordinate" bans every CPU outside irq.others_cpus and
        the GPU vectors gputuned placed, through its socket.
        """
        cfg = ctx.profile.irq
        procs = [p for p in ctx.processes if p.comm == "irqbalance"]
        if cfg is None or not procs or cfg.irqbalance == "ignore":
            return
        proc = procs[0]
        if cfg.irqbalance == "report":
            out.refused.append(
                Refusal(
                    self.name,
                    "irqbalance",
                    f"irqbalance runs (PID {proc.pid}) and will move IRQs back onto the CPUs "
                    "gputuned cleared; stop it, or set irq.irqbalance = 'coordinate'",
                )
            )
            return
        try:
            banned, irqs = irqbalance.read_settings(ctx.host, proc.pid)
        except errors.HostError as exc:
            out.refused.append(
                Refusal(
                    self.name,
                    "irqbalance",
                    f"irqbalance runs (PID {proc.pid}) but its socket did not answer ({exc}); "
                    "it will move IRQs back: stop it or fix its socket",
                )
            )
            return
        sets = ctx.sets.sets
        want_banned = (
            ctx.cpus.online - sets[cfg.others_cpus] if cfg.others_cpus != "keep" else frozenset()
        )
        gpu_irqs = tuple(sorted(i.irq for g in ctx.snap.topo.gpus() for i in g.irqs))
        want_irqs = gpu_irqs if cfg.gpu_cpus != "keep" else ()
        data = {"pid": proc.pid, "start": proc.start_time}
        for attr, have, want, why in (
            ("cpus", format_cpulist(banned), format_cpulist(want_banned), "CPUs it must not use"),
            ("irqs", " ".join(map(str, irqs)), " ".join(map(str, want_irqs)), "IRQs it must leave"),
        ):
            if attr == "cpus" and not want_banned:
                continue
            if attr == "irqs" and not want_irqs:
                continue
            out.changes.append(
                Change(
                    self.name,
                    f"irqbalance (PID {proc.pid}) banned {attr}",
                    have or "-",
                    want,
                    f"irq.irqbalance = coordinate: {why}",
                    report_only=cfg.report_only,
                    key=f"irqbalance:{attr}",
                    kind="irqbalance",
                    data={**data, "attr": attr},
                    in_sync=have == want,
                )
            )
