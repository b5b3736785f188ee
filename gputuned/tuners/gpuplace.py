"""Each process on its own GPU's CPUs (``[[process]] by_gpu = true``).

A tensor-parallel server is one process tree with one worker per GPU (vLLM's EngineCore spawns
a worker per GPU: vllm/v1/executor/multiproc_executor.py). Each worker launches its GPU's
kernels from its main thread; on a two-socket host with four GPUs per socket, a worker of a
socket-1 GPU on socket-0 CPUs pays a cross-socket hop on every launch and every completion
interrupt. So with ``by_gpu`` every process the rule claims gets the CPUs of the GPU it uses
(:mod:`gputuned.tuners.gpuuse` says which): that GPU's member of the rule's set (a per = "gpu"
set), or the set's CPUs local to it; and with ``move_to_partition``, the partition holding
them (``[cpuset] partitions = "gpu"`` or ``"node"``; with ``"one"``, the one partition).

- A process of the tree that uses no GPU (the API server, the resource tracker, tokenizer
  workers) goes where ``without_gpu`` says: ``"tree"`` (the default), with the GPUs the rest of
  its tree uses, or the CPUs of a named set. A tree that uses no GPU yet is placed as if it
  used them all, and moves when its processes open their GPUs.
- A process whose GPUs lie in two partitions cannot be in both: a process is in exactly one
  cgroup, and sibling partitions share no CPU (cgroup-v2.rst, "cpuset.cpus.partition"). It
  stays outside the partitions (moved back to its own cgroup if it was in one) with affinity
  to the CPUs of its GPUs' nodes that no partition holds: those are the only CPUs a process
  outside can run on, since a partition's CPUs leave every other cgroup's effective set. The
  plan says so for each such process.

Pure: the claims, the GPU use and the plan context in, a :class:`Target` per process out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gputuned.cpulist import format_cpulist
from gputuned.profile.cpusets import PARTITION_MODES, PartitionSpec, partition_layout
from gputuned.tuners.gpuuse import gpu_use

if TYPE_CHECKING:
    from gputuned.profile.tables.process import Config
    from gputuned.tuners.context import Claim, PlanContext
    from gputuned.tuners.gpuuse import GpuUse


@dataclass(frozen=True)
class Target:
    """Where one process goes. ``cgroup``: the partition to move into ("/gputuned.x"), None to
    stay outside every partition (``leave``: move back out of one it is in)."""

    cpus: frozenset[int]
    cgroup: str | None
    leave: bool
    why: str


def _gpus(n: frozenset[int]) -> str:
    return ("GPU " if len(n) == 1 else "GPUs ") + ", ".join(str(i) for i in sorted(n))


def partitions(ctx: PlanContext, rule: Config) -> list[PartitionSpec]:
    """The partitions a rule's processes may be moved into here; none when it moves nothing."""
    cs = ctx.profile.cpuset
    if not (
        rule.move_to_partition
        and cs is not None
        and cs.cpus is not None
        and cs.mode in PARTITION_MODES
        and ctx.cgroup.partitions_possible
        and ctx.cgroup.v2_mount is not None
    ):
        return []
    return partition_layout(cs, ctx.sets, ctx.cpus)


def outside(ctx: PlanContext, parts: list[PartitionSpec], nodes: set[int | None]) -> frozenset[int]:
    """The CPUs of ``nodes`` that no partition holds (every online CPU for an unknown node)."""
    held = frozenset().union(*(p.cpus for p in parts))
    here: frozenset[int] = frozenset()
    for n in nodes:
        here |= ctx.cpus.nodes.get(n, ctx.cpus.online) if n is not None else ctx.cpus.online
    return here - held


def reach(ctx: PlanContext, rule: Config) -> frozenset[int]:
    """Every CPU a by_gpu rule may give a process: its set, and the CPUs outside partitions on
    the nodes of its GPUs (proctree.Tuned tells the rule's doing by these)."""
    nodes = {ctx.cpus.gpu_node(g) for g in ctx.cpus.gpus}
    return ctx.sets.sets[rule.cpus] | outside(ctx, partitions(ctx, rule), nodes)


def tree_roots(claims: Mapping[int, Claim]) -> dict[int, int]:
    """PID -> the topmost claimed ancestor of its tree (itself for a matched process)."""
    out: dict[int, int] = {}
    for pid in claims:
        seen, up = [pid], claims[pid].parent
        while up and up in claims and up not in seen:
            seen.append(up)
            up = claims[up].parent
        out[pid] = seen[-1]
    return out


def targets(
    ctx: PlanContext,
    rule: Config,
    claims: Mapping[int, Claim],
    mine: list[int],
    use: GpuUse,
    notes: list[str],
) -> dict[int, Target]:
    """A :class:`Target` for each of ``mine`` (PIDs the rule claims, not left out).

    ``claims``: this plan's and those placed earlier (the daemon's), where the tree of each is
    found: a process using no GPU goes with the GPUs its tree uses.
    """
    roots = tree_roots(claims)
    tree_gpus: dict[int, frozenset[int]] = {}
    for pid, c in claims.items():
        if c.rule == rule.name and c.role != "excluded":
            root = roots.get(pid, pid)
            tree_gpus[root] = tree_gpus.get(root, frozenset()) | use.of(pid)
    parts = partitions(ctx, rule)
    refs = {g.index: g for g in ctx.cpus.gpus}
    out: dict[int, Target] = {}
    for pid in mine:
        own = use.of(pid) & refs.keys()
        if not own and rule.without_gpu != "tree":
            out[pid] = _named(ctx, rule.without_gpu, parts)
            continue
        gpus = own or (tree_gpus.get(roots.get(pid, pid), frozenset()) & refs.keys())
        how = _gpus(gpus) if own else f"no GPU itself; its tree uses {_gpus(gpus)}"
        if not gpus:
            gpus = frozenset(refs)
            how = "no GPU in its tree yet: all the rule's GPUs, until one is opened"
        if not gpus:  # a host without GPUs: the whole set, as without by_gpu
            cpus = ctx.sets.sets[rule.cpus]
            out[pid] = Target(cpus, "/" + parts[0].cgroup if len(parts) == 1 else None, False, "")
            continue
        cpus = frozenset().union(
            *(ctx.sets.for_gpu(rule.cpus, refs[i], ctx.cpus)[0] for i in sorted(gpus))
        )
        held = {p.cgroup for p in parts if p.cpus & cpus}
        if not parts:
            out[pid] = Target(cpus, None, False, how)
        elif len(held) == 1:
            out[pid] = Target(cpus, "/" + held.pop(), False, how)
        else:
            nodes = {ctx.cpus.gpu_node(refs[i]) for i in gpus}
            free = outside(ctx, parts, nodes)
            shown = ", ".join(str(n) for n in sorted(n for n in nodes if n is not None))
            notes.append(
                f"process[{rule.name}]: pid {pid} uses {how} on node(s) {shown}, in "
                f"{len(held)} partitions ({', '.join(sorted(held))}); a process is in one "
                f"cgroup only, so it stays outside them with affinity to "
                f"{format_cpulist(free) or 'nothing'}, the CPUs of those nodes no partition holds"
            )
            out[pid] = Target(free, None, True, how + ", outside the partitions")
    return out


def by_gpu_targets(
    ctx: PlanContext, claims: Mapping[int, Claim], notes: list[str]
) -> dict[int, Target]:
    """A :class:`Target` for every process of ``claims`` that a by_gpu rule places."""
    rules = [r for r in ctx.profile.process if r.by_gpu and r.cpus != "keep"]
    if not rules:
        return {}
    use = ctx.gpu_use or gpu_use(ctx.kernel, ctx.cpus.gpus, ctx.snap.nvml)
    every = {**ctx.claimed, **claims}
    out: dict[int, Target] = {}
    for rule in rules:
        mine = [pid for pid, c in claims.items() if c.rule == rule.name and c.role != "excluded"]
        out.update(targets(ctx, rule, every, mine, use, notes))
    for pid in sorted(out):
        why = use.unmapped.get(pid)
        if why:
            notes.append(
                f"process: pid {pid}: its environment names no GPU gputuned can map ({why}); "
                "it is placed by the GPU it opens (device nodes, NVML)"
            )
    return out


def _named(ctx: PlanContext, name: str, parts: list[PartitionSpec]) -> Target:
    """A process using no GPU, sent to set ``name`` (``without_gpu``): into the partition that
    holds all of the set, else outside every partition on the set's CPUs no partition holds."""
    cpus = ctx.sets.sets[name]
    home = [p for p in parts if cpus <= p.cpus]
    if home:
        return Target(cpus, "/" + home[0].cgroup, False, f"no GPU: set {name!r}")
    held = frozenset().union(*(p.cpus for p in parts))
    return Target(cpus - held, None, bool(parts), f"no GPU: set {name!r}")
