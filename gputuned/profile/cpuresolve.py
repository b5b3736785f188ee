"""Resolve a profile's named CPU sets on one host, and guard the CPUs left for housekeeping.

Sets are cut along cores (:class:`~gputuned.kernel.topology.HostCpus`): exclusion removes whole cores,
counts take whole cores, and the GPUs that share a NUMA node share its cores out in blocks, in
GPU order. The rules are documented on :class:`~gputuned.profile.cpusets.CpuSetSpec`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputuned.changes import Refusal
from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.errors import PlanError
from gputuned.kernel.topology import GpuRef, HostCpus
from gputuned.profile.checks import overlaps, set_refs
from gputuned.profile.cpusets import PARTITION_MODES, CpuSetSpec, Problems, ResolvedCpus

if TYPE_CHECKING:
    from gputuned.profile.model import Profile

Units = list[frozenset[int]]


def _union(parts: Units) -> frozenset[int]:
    return frozenset().union(*parts)


def _and_list(names: tuple[str, ...]) -> str:
    shown = [repr(n) for n in names]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _gpus_label(gpus: list[GpuRef]) -> str:
    indexes = format_cpulist(g.index for g in gpus)
    return f"GPU {indexes}" if len(gpus) == 1 else f"GPUs {indexes}"


class _Resolver:
    """Resolves sets one by one, each after the sets it excludes (the profile has no cycles)."""

    def __init__(self, profile: Profile, host: HostCpus) -> None:
        self.p = profile
        self.host = host
        self.sets: dict[str, frozenset[int]] = {}
        self.per_gpu: dict[str, dict[int, frozenset[int]]] = {}
        self.per_node: dict[str, dict[int, frozenset[int]]] = {}
        self.notes: list[str] = []
        self.problems: Problems = []
        self.empty_why: dict[str, str] = {}
        self.needed = _needed_sets(profile)

    def resolve(self, name: str) -> frozenset[int]:
        if name not in self.sets:
            spec = self.p.cpusets[name]
            excluded = _union([self.resolve(ex) for ex in spec.exclude])
            drop = self.host.whole_cores(excluded)
            if spec.per == "gpu":
                cpus = self._per_gpu(name, spec, drop)
            elif spec.per == "node":
                cpus = self._per_node(name, spec, drop)
            else:
                cpus = self._plain(name, spec, drop)
            self.sets[name] = cpus
        return self.sets[name]

    # -- the three kinds of set --------------------------------------------------------------

    def _plain(self, name: str, spec: CpuSetSpec, drop: frozenset[int]) -> frozenset[int]:
        base = self._base(name, spec)
        cpus = self._pick(name, spec, base, drop)
        if spec.cpus is not None:
            self._split_core_note(name, base)
        return cpus

    def _pick(
        self, name: str, spec: CpuSetSpec, base: frozenset[int], drop: frozenset[int]
    ) -> frozenset[int]:
        """The whole cores of ``base`` outside ``drop``, capped and cut to count or cores."""
        pool = [u for u in self.host.units(base) if not u & drop]
        if base and not pool:
            self.empty_why[name] = (
                f"excluding {_and_list(spec.exclude)} leaves none of {format_cpulist(base)}"
            )
        pool, _ = self._cap(pool, spec)
        picked = _take(pool, spec)
        self._short(name, spec, picked, "")
        return _union(picked)

    def _per_node(self, name: str, spec: CpuSetSpec, drop: frozenset[int]) -> frozenset[int]:
        members: dict[int, frozenset[int]] = {}
        for node, cpus in self.host.nodes.items():
            pool, _ = self._cap([u for u in self.host.units(cpus) if not u & drop], spec)
            picked = _take(pool, spec)
            self._short(name, spec, picked, f" on node {node}")
            members[node] = _union(picked)
        self.per_node[name] = members
        union = _union(list(members.values()))
        if not union and self.host.online:
            self.empty_why[name] = f"excluding {_and_list(spec.exclude)} leaves no core on any node"
        return union

    def _per_gpu(self, name: str, spec: CpuSetSpec, drop: frozenset[int]) -> frozenset[int]:
        host = self.host
        self.per_gpu[name] = {}
        if not host.gpus:
            if not spec.fallback_all:
                self.problems.append(
                    (
                        f"cpusets.{name}.per",
                        "this host has no GPU; set fallback_all = true to use all online CPUs "
                        "here, or use a set that does not depend on GPUs",
                    )
                )
                return frozenset()
            self.notes.append(f"cpusets.{name}: no GPU on this host; using all online CPUs")
            return self._pick(name, spec, host.online, drop)
        # GPUs whose local CPUs are the same (a NUMA node's) divide them, in GPU order. The
        # narrowest groups go first: a GPU whose firmware gives no NUMA node (numa_node -1,
        # every CPU local) must not take a node's cores from the GPUs that sit there.
        groups: dict[frozenset[int], list[GpuRef]] = {}
        for g in sorted(host.gpus, key=lambda g: g.index):
            groups.setdefault(host.gpu_local(g), []).append(g)
        taken: frozenset[int] = frozenset()
        for local, gpus in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[1][0].index)):
            pool = [u for u in host.units(local) if not u & drop and not u & taken]
            pool, capped = self._cap(pool, spec)
            shares = self._split(name, spec, pool, gpus, local, capped)
            for g, units in zip(gpus, shares, strict=True):
                self.per_gpu[name][g.index] = _union(units)
                taken |= _union(units)
        if not taken and host.online:
            self.empty_why[name] = (
                f"excluding {_and_list(spec.exclude)} leaves no core local to any GPU"
            )
        return taken

    def _split(
        self,
        name: str,
        spec: CpuSetSpec,
        pool: Units,
        gpus: list[GpuRef],
        local: frozenset[int],
        capped: bool,
    ) -> list[Units]:
        """Contiguous blocks of ``pool``, one per GPU: ``count``/``cores`` each where the pool
        has enough, else equal shares (the first GPUs get one core more)."""
        n, m = len(gpus), len(pool)
        who = f"cpusets.{name}: {_gpus_label(gpus)} (local CPUs {format_cpulist(local)})"
        if m == 0:
            self.notes.append(f"{who}: no core left for them; their IRQs use other CPUs")
            return [[] for _ in gpus]
        if m < n:
            self.notes.append(
                f"{who}: {m} core(s) for {n} GPUs, so GPUs share cores; give fewer CPUs to "
                "the excluded sets"
            )
            return [[pool[i % m]] for i in range(n)]
        want = spec.cores or (_cores_for(spec.count, pool) if spec.count else None)
        if want is not None and want * n <= m:
            sizes = [want] * n
        else:
            sizes = [m // n + (1 if i < m % n else 0) for i in range(n)]
            if want is not None:
                asked = f"cores = {spec.cores}" if spec.cores else f"count = {spec.count}"
                cap = f" (max_percent = {spec.max_percent})" if capped else ""
                self.notes.append(
                    f"{who}: {asked} per GPU needs {want * n} cores, {m} are left{cap}; "
                    f"each GPU gets {_sizes_text(sizes)} core(s)"
                )
        out: list[Units] = []
        at = 0
        for size in sizes:
            out.append(pool[at : at + size])
            at += size
        return out

    # -- pieces ------------------------------------------------------------------------------

    def _base(self, name: str, spec: CpuSetSpec) -> frozenset[int]:
        host, online = self.host, self.host.online
        if spec.cpus is not None:
            wanted = parse_cpulist(spec.cpus)
            lacking = wanted - online
            if lacking and name in self.needed:
                self.problems.append(
                    (
                        f"cpusets.{name}.cpus",
                        f"names CPUs {format_cpulist(lacking)} this host does not have online "
                        f"(online: {format_cpulist(online)}); a set is not trimmed to fit: "
                        "name CPUs this host has, or use gpu_local, numa_node or per",
                    )
                )
            elif lacking:
                self.notes.append(
                    f"cpusets.{name}: names CPUs {format_cpulist(lacking)} this host does not "
                    "have; no table uses the set"
                )
            return wanted & online
        if spec.gpu_local is not None:
            gpu = next((g for g in host.gpus if g.index == spec.gpu_local), None)
            if gpu is not None and gpu.local_cpus & online:
                return gpu.local_cpus & online
            if gpu is not None:
                self.notes.append(
                    f"cpusets.{name}: GPU {gpu.index} ({gpu.bdf}) reports no online local CPUs; "
                    "using all online CPUs"
                )
                return online
            if spec.fallback_all:
                self.notes.append(
                    f"cpusets.{name}: no GPU {spec.gpu_local} on this host; using all online CPUs"
                )
                return online
            have = ", ".join(str(g.index) for g in host.gpus) or "none"
            self.problems.append(
                (
                    f"cpusets.{name}.gpu_local",
                    f"no GPU {spec.gpu_local} on this host (GPUs: {have}); use another index "
                    "or fallback_all = true",
                )
            )
            return frozenset()
        if spec.numa_node is not None:
            if spec.numa_node in host.numa:
                return host.numa[spec.numa_node] & online
            have = ", ".join(str(n) for n in sorted(host.numa)) or "none"
            self.problems.append(
                (
                    f"cpusets.{name}.numa_node",
                    f"no NUMA node {spec.numa_node} on this host (nodes: {have})",
                )
            )
            return frozenset()
        return online

    def _cap(self, pool: Units, spec: CpuSetSpec) -> tuple[Units, bool]:
        """At most max_percent of each node's cores (whole, at least one); True if it cut."""
        if spec.max_percent is None:
            return pool, False
        host = self.host
        left: dict[int | None, int] = {}
        for n, cpus in host.nodes.items():
            total = sum(1 for core in host.cores if core <= cpus)
            left[n] = max(1, total * spec.max_percent // 100)
        out: Units = []
        for unit in pool:
            node = host.node_of(min(unit))
            if left.get(node, 1) > 0:
                out.append(unit)
                left[node] = left.get(node, 1) - 1
        return out, len(out) < len(pool)

    def _short(self, name: str, spec: CpuSetSpec, picked: Units, where: str) -> None:
        got = sum(len(u) for u in picked)
        if not picked:
            return
        if spec.count and got < spec.count:
            left = "1 CPU is" if got == 1 else f"{got} CPUs are"
            self.notes.append(
                f"cpusets.{name}: count = {spec.count}, but only {left} left{where} "
                f"({format_cpulist(_union(picked))}); using what there is"
            )
        elif spec.cores and len(picked) < spec.cores:
            self.notes.append(
                f"cpusets.{name}: cores = {spec.cores}, but only {len(picked)} left{where} "
                f"({format_cpulist(_union(picked))}); using what there is"
            )

    def _split_core_note(self, name: str, base: frozenset[int]) -> None:
        outside = self.host.whole_cores(base) - base
        if outside and name in self.needed:
            self.notes.append(
                f"cpusets.{name}: its CPUs share cores with CPUs {format_cpulist(outside)} "
                "outside the set (SMT siblings), which other work can use; list whole cores "
                "or use a computed set"
            )


def _take(pool: Units, spec: CpuSetSpec) -> Units:
    """The lowest units: ``cores`` of them, or enough for ``count`` CPUs, or all."""
    if spec.cores is not None:
        return pool[: spec.cores]
    if spec.count is not None:
        return pool[: _cores_for(spec.count, pool)]
    return pool


def _cores_for(count: int, pool: Units) -> int:
    got = 0
    for n, unit in enumerate(pool):
        if got >= count:
            return n
        got += len(unit)
    return len(pool)


def _sizes_text(sizes: list[int]) -> str:
    distinct = sorted(set(sizes))
    return str(distinct[0]) if len(distinct) == 1 else f"{distinct[0]} or {distinct[-1]}"


def _needed_sets(p: Profile) -> set[str]:
    """Sets some table uses, and the sets those exclude."""
    todo = [name for _, name, _ in set_refs(p) if name in p.cpusets]
    needed: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += [ex for ex in p.cpusets[name].exclude if ex in p.cpusets]
    return needed


def resolve_cpusets(profile: Profile, host: HostCpus) -> ResolvedCpus:
    """Resolve every set of ``profile`` on ``host``; PlanError if a needed set cannot be built."""
    r = _Resolver(profile, host)
    for name in profile.cpusets:
        r.resolve(name)
    problems = r.problems
    if not problems:
        problems += _needed_but_empty(profile, r.sets, host, r.empty_why)
        problems += _partition_leaves_cpus(profile, r.sets, host)
        problems += overlaps(profile, r.sets.get)
    if problems:
        lines = [f"profile {profile.name!r} cannot be planned on this host; nothing was changed."]
        lines += [f"  {key}: {msg}" for key, msg in problems]
        raise PlanError("\n".join(lines))
    return ResolvedCpus(r.sets, r.per_gpu, r.per_node, r.notes)


def _needed_but_empty(
    profile: Profile, sets: dict[str, frozenset[int]], host: HostCpus, why: dict[str, str]
) -> Problems:
    users: dict[str, list[str]] = {}
    for key, name, _ in set_refs(profile):
        users.setdefault(name, []).append(key)
    problems: Problems = []
    for name, keys in users.items():
        if not sets[name]:
            reason = why.get(
                name, f"none of its CPUs is online (online: {format_cpulist(host.online)})"
            )
            problems.append(
                (
                    f"cpusets.{name}",
                    f"has no CPUs on this host: {reason}; needed by {', '.join(keys)}",
                )
            )
    return problems


def _partition_leaves_cpus(
    profile: Profile, sets: dict[str, frozenset[int]], host: HostCpus
) -> Problems:
    part = profile.cpuset
    if part and part.mode in PARTITION_MODES and part.cpus and sets[part.cpus] >= host.online:
        return [
            (
                "cpuset.cpus",
                f"set {part.cpus!r} holds every online CPU ({format_cpulist(host.online)}); a "
                "partition must leave at least one to the rest of the system: exclude a "
                "housekeeping set",
            )
        ]
    return []


# -- the housekeeping guard --------------------------------------------------------------------


def housekeeping_guard(profile: Profile, sets: ResolvedCpus, host: HostCpus) -> list[Refusal]:
    """Refuse a layout that leaves a NUMA node fewer whole cores than [cpuset]
    housekeeping_cores for everything that is not the server.

    A CPU given to a partition leaves every other cgroup, and a nohz_full CPU gives up the
    kernel's housekeeping work (timers, RCU, unbound kthreads: kernel/sched/isolation.c); what
    is left runs the rest of the system. A public GPU tuning profile that isolated CPU 0, the
    default IRQ target, on an H100 host cut serving throughput to a third and raised p99
    time-to-first-token tenfold: keep housekeeping on every node.
    """
    cs, boot = profile.cpuset, profile.bootargs
    taken: dict[str, frozenset[int]] = {}
    if cs is not None and cs.mode in PARTITION_MODES and cs.cpus is not None:
        taken[f"the partition (set {cs.cpus!r})"] = sets.sets[cs.cpus]
    boot_nohz = boot.nohz_full if boot is not None else None
    if boot_nohz is not None:
        taken[f"nohz_full (set {boot_nohz!r})"] = sets.sets[boot_nohz]
    minimum = cs.housekeeping_cores if cs is not None else 1
    if not taken or minimum == 0:
        return []
    gone = _union(list(taken.values()))
    out: list[Refusal] = []
    for node, cpus in host.nodes.items():
        free = [core for core in host.cores if core <= cpus and not core & gone]
        if len(free) >= minimum:
            continue
        left = cpus - gone
        reason = (
            f"node {node} ({format_cpulist(cpus)}) keeps {len(free)} whole core(s) outside "
            f"{' and '.join(taken)} (CPUs left: {format_cpulist(left) or 'none'}); the rest of "
            f"the system needs at least {minimum} per node ([cpuset] housekeeping_cores): "
            "exclude a housekeeping set with per = 'node' and cores = 1 from those sets"
        )
        # A report-only [cpuset] makes no partition; boot arguments are written all the same.
        blocking = not (cs is not None and cs.report_only and boot_nohz is None)
        if not blocking:
            reason = f"report only: {reason}"
        out.append(Refusal("cpuset", f"housekeeping on node {node}", reason, blocking=blocking))
    return out
