"""CPU topology and CPU placement per GPU and per NUMA node, as inspect and plan show them.

Pure functions over what was already read (:class:`~gputuned.kernel.topology.HostCpus`, a plan's
settings): nothing here reads the host. The dicts they return are the JSON output;
:mod:`gputuned.cli.render` prints them as tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.kernel.irqs import affinity_irq
from gputuned.kernel.topology import GpuRef, HostCpus
from gputuned.profile.cpusets import PARTITION_MODES, partition_layout

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel.nvml import NvmlGpu
    from gputuned.tuners.context import PlanContext


def smt_numbering(host: HostCpus) -> str:
    """How the host numbers SMT siblings, in words."""
    if not host.smt:
        return "unknown (no topology/thread_siblings_list): each CPU counted as a core"
    threads = {len(c) for c in host.cores}
    if threads == {1}:
        return "no SMT: one thread per core"
    if len(threads) > 1 or threads != {2}:
        shown = "/".join(str(t) for t in sorted(threads))
        return f"{shown} threads per core"
    gaps = {max(c) - min(c) for c in host.cores}
    if gaps == {1}:
        return "2 threads per core, siblings next to each other (2k, 2k+1)"
    if len(gaps) == 1:
        return f"2 threads per core, siblings N and N+{gaps.pop()}"
    return "2 threads per core, siblings numbered irregularly"


def _cores_text(host: HostCpus, cpus: frozenset[int]) -> str:
    units = host.units(cpus)
    whole = sum(1 for u in units if u == host.core_of(min(u)))
    split = len(units) - whole
    text = f"{whole} core" + ("" if whole == 1 else "s")
    return text + (f" + {split} half" if split else "")


def topology_report(host: HostCpus, nvml: list[NvmlGpu] | None) -> dict[str, Any]:
    """``gputunectl inspect``'s topology section: nodes, SMT, and per GPU its node, local CPUs
    and NVML's CPU affinity beside sysfs local_cpulist (a disagreement is a finding: one of
    them, usually the firmware's NUMA description, is wrong, and placement follows sysfs)."""
    by_bdf = {g.bdf: g for g in nvml or []}
    gpus = []
    for g in host.gpus:
        local = g.local_cpus & host.online
        entry: dict[str, Any] = {
            "index": g.index,
            "bdf": g.bdf,
            "name": g.name,
            "numa_node": g.numa_node,
            "node": host.gpu_node(g),
            "local_cpus": format_cpulist(local) if local else None,
            "local_cores": _cores_text(host, local) if local else None,
            "nvml_cpu_affinity": None,
            "findings": [],
        }
        affinity = by_bdf[g.bdf].cpu_affinity if g.bdf in by_bdf else None
        if affinity is not None:
            entry["nvml_cpu_affinity"] = format_cpulist(affinity)
            if (affinity & host.online) != local:
                entry["findings"].append(
                    {
                        "level": "warning",
                        "message": (
                            f"NVML's CPU affinity ({format_cpulist(affinity) or 'none'}) differs "
                            f"from sysfs local_cpulist ({format_cpulist(local) or 'none'}): one "
                            "of them misdescribes where the GPU sits (often the firmware's NUMA "
                            "tables); gputuned places by sysfs"
                        ),
                    }
                )
        if not local:
            entry["findings"].append(
                {"level": "note", "message": "sysfs gives no local CPUs: placed as if on any node"}
            )
        elif len(host.nodes) > 1 and entry["node"] is None:
            message = f"{_spans_nodes(host, g)}; per-GPU sets give it what the other GPUs leave"
            entry["findings"].append({"level": "warning", "message": message})
        gpus.append(entry)
    return {
        "online": format_cpulist(host.online),
        "threads_per_core": host.threads_per_core,
        "smt": smt_numbering(host),
        "nodes": [
            {
                "node": n,
                "cpus": format_cpulist(cpus),
                "cores": _cores_text(host, cpus),
                "gpus": [g.index for g in host.gpus if host.gpu_node(g) == n],
            }
            for n, cpus in host.nodes.items()
        ],
        "gpus": gpus,
        "nvml": nvml is not None,
    }


def _spans_nodes(host: HostCpus, g: GpuRef) -> str:
    """inspect's and plan's words for a GPU whose local CPUs span NUMA nodes."""
    return (
        f"local CPUs {format_cpulist(host.gpu_local(g))} span NUMA nodes (sysfs numa_node "
        f"{g.numa_node if g.numa_node is not None else -1}): the firmware does not say which "
        "socket this GPU is on"
    )


def gpu_node_warnings(host: HostCpus, per_gpu: dict[str, dict[int, frozenset[int]]]) -> list[str]:
    """plan's warning for each GPU without a NUMA node (sysfs numa_node -1) on a host of
    several, and what the plan did instead: the GPU's local CPUs decide its node where they lie
    in one; where they span nodes it is taken as local to every node, and its per-GPU sets
    were resolved after the other GPUs' (profile/cpuresolve.py), from what they left."""
    if len(host.nodes) < 2:
        return []
    out = []
    for g in host.gpus:
        if g.numa_node is not None:
            continue
        node = host.gpu_node(g)
        if node is not None:
            out.append(
                f"GPU {g.index} {g.bdf}: sysfs numa_node -1 on a host of {len(host.nodes)} NUMA "
                f"nodes; its local CPUs ({format_cpulist(host.gpu_local(g))}) are all on node "
                f"{node}, so the plan placed it on node {node}"
            )
            continue
        sets = [
            f"{name}: {format_cpulist(members[g.index]) or 'none'}"
            for name, members in per_gpu.items()
            if g.index in members
        ]
        got = f" ({'; '.join(sets)})" if sets else ""
        out.append(
            f"GPU {g.index} {g.bdf}: {_spans_nodes(host, g)}; the plan took it as local to every "
            f"node: its per-GPU sets are what the other GPUs left{got}; "
            "if you know its socket, fix the firmware's NUMA description (ACPI _PXM) or skip "
            "it ([gpus] skip)"
        )
    return out


def plan_layout(ctx: PlanContext, settings: list[Change]) -> dict[str, Any]:
    """Per GPU and per NUMA node: the resolved sets, the partitions, the CPUs each GPU's
    vectors go to, and what is left for the rest of the system. From the plan's own
    settings, so it shows exactly what apply would write."""
    host, sets, profile = ctx.cpus, ctx.sets, ctx.profile
    wanted = {irq: c.wanted for c in settings if (irq := affinity_irq(c.path)) is not None}
    devices = {d.bdf: d for d in ctx.snap.topo.gpus()}
    parts = _partitions(ctx)
    gpus = []
    for g in host.gpus:
        dev = devices.get(g.bdf)
        irqs = sorted(dev.irqs, key=lambda i: i.irq) if dev else []
        landing: set[int] = set()
        for i in irqs:
            text = wanted.get(i.irq)
            landing |= parse_cpulist(text) if text is not None else (i.affinity or frozenset())
        local = host.gpu_local(g)
        gpus.append(
            {
                "index": g.index,
                "bdf": g.bdf,
                "node": host.gpu_node(g),
                "local_cpus": format_cpulist(local),
                "sets": {
                    name: format_cpulist(members[g.index])
                    for name, members in sets.per_gpu.items()
                    if g.index in members
                },
                "vectors": len(irqs),
                "vector_cpus": format_cpulist(landing),
                "off_node": bool(landing - local),
            }
        )
    taken = frozenset().union(*(p["cpus_set"] for p in parts)) if parts else frozenset()
    if profile.bootargs is not None and profile.bootargs.nohz_full is not None:
        taken |= sets.sets[profile.bootargs.nohz_full]
    nodes = [
        {
            "node": n,
            "cpus": format_cpulist(cpus),
            "gpus": [g.index for g in host.gpus if host.gpu_node(g) == n],
            "sets": {name: format_cpulist(c & cpus) for name, c in sets.sets.items()},
            "partitions": [
                f"{p['cgroup']}: {format_cpulist(p['cpus_set'] & cpus)}"
                for p in parts
                if p["cpus_set"] & cpus
            ],
            "rest": format_cpulist(cpus - taken),
        }
        for n, cpus in host.nodes.items()
    ]
    return {
        "smt": smt_numbering(host),
        "gpus": gpus,
        "nodes": nodes,
        "partitions": [{"cgroup": p["cgroup"], "cpus": p["cpus"]} for p in parts],
    }


def _partitions(ctx: PlanContext) -> list[dict[str, Any]]:
    cfg = ctx.profile.cpuset
    if cfg is None or cfg.mode not in PARTITION_MODES or cfg.cpus is None:
        return []
    from gputuned.tuners.inplace import decision

    here = decision(ctx).place  # the server's own cgroup made the partition (one partition)
    return [
        {
            "cgroup": p.cgroup if here is None else here.cgroup.lstrip("/"),
            "cpus": format_cpulist(p.cpus),
            "cpus_set": p.cpus,
        }
        for p in partition_layout(cfg, ctx.sets, ctx.cpus)
    ]
