"""Plans the `[irq]` table (its keys and manual: gputuned/profile/tables/irq.py): each IRQ's
affinity, GPU vectors on their GPU's CPUs, the rest away from the inference CPUs, and
irqbalance kept from undoing it."""

from __future__ import annotations

import errno
from collections.abc import Sequence

from gputuned import errors
from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.cpulist import format_cpulist, format_mask
from gputuned.kernel import irqbalance
from gputuned.kernel.irqs import DEFAULT_AFFINITY, affinity_file
from gputuned.kernel.topology import HostCpus
from gputuned.profile.tables.irq import Config
from gputuned.tuners.context import PlanContext

#: Above this many online CPUs, plan refuses a layout that puts every movable IRQ on one CPU.
ONE_CPU_LIMIT = 32


def spread_order(cpus: frozenset[int], host: HostCpus) -> list[int]:
    """``cpus`` in the order vectors are handed out: the first thread of every core, then the
    second threads, so that vectors share a core only once every core has one."""
    units = [sorted(u) for u in host.units(cpus)]
    depth = max((len(u) for u in units), default=0)
    return [u[k] for k in range(depth) for u in units if k < len(u)]


class IrqTuner:
    """GPU MSI/MSI-X vectors onto the CPUs the profile names; every other IRQ out of their way."""

    name = "irq"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        cfg = ctx.profile.irq
        out = TunerPlan()
        if cfg is None:
            return out
        known_bad = dict(ctx.kernel.recorded_refusals)
        names = {i.irq: i.name for i in ctx.irqs}
        # irq -> (wanted CPUs, compare mode, why). GPU vectors get exactly their CPU; any other
        # IRQ only has to stay inside the others set ("cpulist_subset").
        wanted: dict[int, tuple[frozenset[int], str, str]] = {}
        gpu_irqs = self._gpu_vectors(ctx, cfg, wanted, out)
        if cfg.others_cpus != "keep":
            self._others(ctx, cfg, gpu_irqs, wanted)
        current = {i.irq: i.affinity for i in ctx.irqs}
        for g in ctx.snap.topo.gpus():
            current.update({i.irq: i.affinity for i in g.irqs})
        for irq, (target, mode, why) in sorted(wanted.items()):
            have = current.get(irq)
            if have is None:
                continue
            path = affinity_file(irq)
            label = f"irq {irq}" + (f" ({names[irq]})" if names.get(irq) else "")
            right = have <= target if mode == "cpulist_subset" else have == target
            if path in known_bad:
                if not right:
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
                )
            )
        self._one_cpu_guard(ctx, cfg, wanted, current, known_bad, out)
        if cfg.default_affinity != "keep" and ctx.default_affinity is not None:
            want = ctx.sets.sets[cfg.default_affinity]
            nr = ctx.cpus.nr_cpus
            out.changes.append(
                Change(
                    self.name,
                    "default_smp_affinity",
                    format_mask(ctx.default_affinity, nr),
                    format_mask(want, nr),
                    f"IRQs allocated later land on irq.default_affinity ({cfg.default_affinity})",
                    DEFAULT_AFFINITY,
                    cfg.report_only,
                    compare="mask",
                )
            )
        self._irqbalance(ctx, out)
        return out

    def _gpu_vectors(
        self,
        ctx: PlanContext,
        cfg: Config,
        wanted: dict[int, tuple[frozenset[int], str, str]],
        out: TunerPlan,
    ) -> frozenset[int]:
        """Each GPU's vectors onto its own CPUs of irq.gpu_cpus; returns every GPU vector.

        A GPU's completions are handled where its vectors land: on another node they cross
        the socket interconnect. So a GPU's vectors go to its member of a per-GPU set, else to
        the set's CPUs local to the GPU, and only to other CPUs where the set has none there.
        """
        devices = {d.bdf: d for d in ctx.snap.topo.gpus()}
        every = frozenset(i.irq for d in devices.values() for i in d.irqs)
        if cfg.gpu_cpus == "keep":
            return every
        # GPUs that share CPUs (a plain set, or a node with fewer cores than GPUs) continue one
        # round robin over them, rather than each starting again at the first CPU.
        next_at: dict[frozenset[int], int] = {}
        for gpu in ctx.cpus.gpus:
            dev = devices.get(gpu.bdf)
            if dev is None or not dev.irqs:
                continue
            cpus, where = ctx.sets.for_gpu(cfg.gpu_cpus, gpu, ctx.cpus)
            node = ctx.cpus.gpu_node(gpu)
            on = f"node {node}" if node is not None else "its local CPUs"
            if where == "elsewhere":
                out.notes.append(
                    f"irq: set {cfg.gpu_cpus!r} has no CPU on {on}, the NUMA node of GPU "
                    f"{gpu.index} ({gpu.bdf}); its {len(dev.irqs)} vectors go to "
                    f"{format_cpulist(cpus)}, off its node"
                )
            order = spread_order(cpus, ctx.cpus)
            whose = {"own": f"GPU {gpu.index}'s", "local": on}.get(where, "off its node")
            why = f"GPU {gpu.index} vector -> irq.gpu_cpus ({cfg.gpu_cpus}, {whose})"
            start = next_at.get(cpus, 0)
            for n, irq in enumerate(sorted(i.irq for i in dev.irqs), start):
                target = frozenset({order[n % len(order)]}) if cfg.spread else cpus
                wanted[irq] = (target, "cpulist", f"{gpu.bdf} {why}")
            next_at[cpus] = start + len(dev.irqs)
        return every

    def _others(
        self,
        ctx: PlanContext,
        cfg: Config,
        gpu_irqs: frozenset[int],
        wanted: dict[int, tuple[frozenset[int], str, str]],
    ) -> None:
        """Every other IRQ onto irq.others_cpus on its device's NUMA node (all of the set for
        IRQs of no PCI device, or where the set has no CPU on that node)."""
        whole = ctx.sets.sets[cfg.others_cpus]
        for line in ctx.irqs:
            if line.irq in gpu_irqs or line.affinity is None:
                continue
            node = ctx.irq_nodes.get(line.irq)
            target = ctx.sets.for_node(cfg.others_cpus, node, ctx.cpus)
            where = f", node {node}" if target != whole else ""
            why = f"not a GPU vector -> irq.others_cpus ({cfg.others_cpus}{where})"
            wanted[line.irq] = (target, "cpulist_subset", why)

    def _one_cpu_guard(
        self,
        ctx: PlanContext,
        cfg: Config,
        wanted: dict[int, tuple[frozenset[int], str, str]],
        current: dict[int, frozenset[int] | None],
        known_bad: dict[str, int],
        out: TunerPlan,
    ) -> None:
        """Refuse to put every movable IRQ of a host with more than 32 CPUs on one CPU.

        One CPU then takes every device's interrupts, on every node: a public GPU tuning
        profile that did so (CPU 0) on an H100 host cut serving throughput to a third.
        """
        online = ctx.cpus.online
        if len(online) <= ONE_CPU_LIMIT or not wanted:
            return
        after = [
            wanted[irq][0] if irq in wanted else have
            for irq, have in current.items()
            if have is not None and affinity_file(irq) not in known_bad
        ]
        landing = frozenset().union(*after) if after else frozenset()
        if len(after) > 1 and len(landing) == 1:
            reason = (
                f"every movable IRQ ({len(after)}) would land on CPU {format_cpulist(landing)} "
                f"of {len(online)} online CPUs; one CPU cannot take a whole host's interrupts: "
                "give irq.others_cpus a core on every node (per = 'node')"
            )
            out.refused.append(
                Refusal(
                    self.name,
                    "all IRQs",
                    f"report only: {reason}" if cfg.report_only else reason,
                    blocking=not cfg.report_only,
                )
            )

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
            banned, irqs = irqbalance.read_settings(ctx.kernel, proc.pid)
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
                )
            )
