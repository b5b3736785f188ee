"""``gputunectl recommend``: which shipped profile fits this host, and why.

The shipped profiles differ in how much of the machine they take (profiles/*.toml):

- shared-host: a few cores per GPU, nice and IRQs; no reboot. For a host that also runs other
  people's work, where a dedicated profile would squeeze that work onto one core per node.
- dedicated-inference: every GPU-local CPU but a housekeeping core per node, as an isolated
  partition. For a host that runs the inference server and little else.
- latency-critical: dedicated-inference plus boot arguments (nohz_full, rcu_nocbs) and ASPM
  off; it needs a reboot, which only the operator can agree to, so it is recommended only
  where the kernel already runs with those arguments, and otherwise named as the next step.

What is read: GPUs that can run inference (gputuned/kernel/pci.py is_inference_gpu: not a
BMC's display chip) and their NUMA nodes, the online CPUs and SMT, and who runs processes
(users other than root and system accounts, and job runners such as kubelet or slurmd: work
gputuned must leave room for). Each candidate is planned on the host as ``gputunectl plan`` would; one that
cannot be planned here (too few CPUs) is out, with plan's reason. A captured tree holds no
processes, so on a tree the host is taken to run nothing else, and the answer says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from gputuned import errors
from gputuned.cpulist import parse_cpulist
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.kernel import Kernel
from gputuned.kernel.proc import iter_processes, list_pids, user_name
from gputuned.kernel.snapshot import snapshot
from gputuned.kernel.system import read_host_cpus
from gputuned.profile.load import load_profile
from gputuned.store.profiledirs import ProfileDirs
from gputuned.userdocs import cite

#: login.defs(5) UID_MIN on Debian and most distributions: below it, system accounts.
UID_MIN = 1000
NOBODY = 65534
#: Programs that run other people's jobs on this host: a dedicated profile would starve them.
JOB_RUNNERS = frozenset(
    {"kubelet", "slurmd", "slurmstepd", "containerd", "dockerd", "condor_startd", "nomad"}
)
ORDER = ("shared-host", "dedicated-inference", "latency-critical")


@dataclass
class Candidate:
    name: str
    path: str
    fits: bool
    why: str
    cpus_per_gpu: int | None = None
    reboot: list[str] = field(default_factory=list)
    #: Whether two GPUs' server sets share a core here (fewer cores than GPUs).
    shared: bool = False


@dataclass
class HostFacts:
    gpus: int
    gpu_nodes: dict[int, int]  # node -> GPUs on it
    nodes: int
    cpus: int  # online CPUs (numbering can have gaps: not the highest plus one)
    threads_per_core: int
    processes_seen: bool
    other_users: dict[str, int]  # user -> processes
    job_runners: list[str]


@dataclass
class Recommendation:
    recommended: str | None
    path: str | None
    #: The first line of the answer: the profile, or why none, agreeing with ``candidates``.
    verdict: str
    reasons: list[str]
    host: HostFacts
    candidates: list[Candidate]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_facts(kernel: Kernel, *, ignore_uids: Iterable[int] = ()) -> HostFacts:
    """The host as recommend weighs it. ``ignore_uids``: the user asking (an admin's shell)."""
    snap = snapshot(kernel, nvml=False, gpu_trees_only=True)
    cpus = read_host_cpus(kernel, snap.topo, None)
    per_node: dict[int, int] = {}
    for g in cpus.gpus:
        node = g.numa_node if g.numa_node is not None else -1
        per_node[node] = per_node.get(node, 0) + 1
    skip = set(ignore_uids)
    users: dict[str, int] = {}
    runners: set[str] = set()
    procs = iter_processes(kernel, brief=True, owner=True)
    for p in procs:
        if p.kernel_thread:
            continue
        if p.comm in JOB_RUNNERS:
            runners.add(p.comm)
        if p.uid is not None and p.uid >= UID_MIN and p.uid != NOBODY and p.uid not in skip:
            name = user_name(kernel, p.uid) or str(p.uid)
            users[name] = users.get(name, 0) + 1
    return HostFacts(
        gpus=len(cpus.gpus),
        gpu_nodes=dict(sorted(per_node.items())),
        nodes=max(len(cpus.nodes), 1),
        cpus=len(cpus.online),
        threads_per_core=cpus.threads_per_core,
        processes_seen=bool(list_pids(kernel)),
        other_users=dict(sorted(users.items())),
        job_runners=sorted(runners),
    )


def _candidate(kernel: Kernel, dirs: ProfileDirs, name: str) -> Candidate | None:
    path = dirs.shipped / f"{name}.toml"
    if not path.is_file():
        return None
    try:
        plan: PlanResult = plan_profile(kernel, load_profile(path, names=dirs), allow_blocked=True)
    except errors.GputunedError as exc:
        return Candidate(name, str(path), False, f"cannot be planned here: {exc}")
    if plan.blocked:
        why = "; ".join(f"{r.target}: {r.reason}" for r in plan.blocked)
        return Candidate(name, str(path), False, f"cannot be applied here: {why}")
    gpus = plan.layout.get("gpus") or []
    sets = [parse_cpulist(g["sets"].get("inference", "")) for g in gpus if g.get("sets")]
    per_gpu = min(len(c) for c in sets) if sets else None
    # The server's sets of two GPUs overlap where a node has fewer cores left than GPUs
    # (profile/cpuresolve.py _split): then no GPU has CPUs of its own.
    shared = sum(len(c) for c in sets) > len(frozenset().union(*sets)) if sets else False
    reboot = list(plan.pending_boot)
    if per_gpu is None:
        why = "plans here"
    elif per_gpu == 0:
        why = "plans here, but some GPU gets no CPU for the server"
    else:
        why = f"at least {_cpus(per_gpu)} per GPU"
        if shared:
            why += ", shared between GPUs (fewer cores than GPUs)"
    return Candidate(name, str(path), True, why, per_gpu, reboot, shared)


def _cpus(n: int) -> str:
    return f"{n} CPU" if n == 1 else f"{n} CPUs"


def recommend(kernel: Kernel, *, ignore_uids: Iterable[int] = ()) -> Recommendation:
    facts = read_facts(kernel, ignore_uids=ignore_uids)
    dirs = ProfileDirs.for_host(kernel)
    found = [_candidate(kernel, dirs, n) for n in ORDER]
    cands = {c.name: c for c in found if c is not None}
    reasons = [_shape(facts)]
    if facts.gpus == 0:
        # A profile plans on a host without GPUs (its per-GPU sets fall back), but it would
        # tune no GPU: none is recommended, and the list says why for each (issue 31).
        why = f"no inference GPU on this host ({cite('multi-gpu.md')} says what counts)"
        reasons.append(f"{why}: gputuned has nothing to tune here")
        for c in cands.values():
            if c.fits:
                c.fits, c.why = False, "plans here, but tunes no GPU: this host has none"
        verdict = f"no profile recommended: {why}"
        return Recommendation(None, None, verdict, reasons, facts, list(cands.values()))
    pick = _choose(facts, cands, reasons)
    chosen = cands.get(pick) if pick else None
    if chosen is not None and chosen.cpus_per_gpu:
        n = _cpus(chosen.cpus_per_gpu)
        reasons.insert(
            1,
            f"{pick} gives the GPUs at least {n} each here, shared between GPUs: this host "
            "has fewer cores for the server than GPUs"
            if chosen.shared
            else f"{pick} gives each GPU at least {n} of its own here",
        )
    if chosen is not None:
        verdict = f"{pick}  ({chosen.path})"
    elif any(c.fits for c in cands.values()):
        fit = ", ".join(c.name for c in cands.values() if c.fits)
        verdict = f"no profile recommended: {fit} would plan here, but not for this host's work"
    else:
        verdict = "no shipped profile fits this host"
    # One reason once: a candidate that does not fit is named where it is weighed, and may be
    # weighed twice (dedicated-inference, before latency-critical and again in the fallback).
    reasons = list(dict.fromkeys(reasons))
    return Recommendation(
        pick, chosen.path if chosen else None, verdict, reasons, facts, list(cands.values())
    )


def _shape(f: HostFacts) -> str:
    nodes = ", ".join(
        f"{n} on node {node}" if node >= 0 else f"{n} without a node"
        for node, n in f.gpu_nodes.items()
    )
    smt = (
        f"SMT on ({f.threads_per_core} threads per core)"
        if f.threads_per_core > 1
        else "SMT off (one thread per core)"
    )
    gpus = f"{f.gpus} GPU{'s' if f.gpus != 1 else ''}" + (f" ({nodes})" if nodes else "")
    return f"{gpus}; {f.cpus} CPUs on {f.nodes} NUMA node{'s' if f.nodes != 1 else ''}, {smt}"


def _choose(f: HostFacts, cands: dict[str, Candidate], reasons: list[str]) -> str | None:
    fits = {n for n, c in cands.items() if c.fits}
    others = [f"{u} ({n} processes)" for u, n in f.other_users.items()]
    if f.job_runners or others:
        what = []
        if f.job_runners:
            what.append(f"job runners run here ({', '.join(f.job_runners)})")
        if others:
            what.append(
                f"processes of users other than root and system accounts: {', '.join(others)}"
            )
        reasons.append(
            "other work shares this host: " + "; ".join(what) + ". A dedicated profile would "
            "squeeze it onto one core per node"
        )
        return _first(["shared-host"], fits, cands, reasons)
    if f.processes_seen:
        reasons.append("nothing but root's and system accounts' processes run here")
    else:
        reasons.append(
            "this tree holds no processes (a capture has none): taken to run nothing else; "
            "on the live host recommend looks at who runs what"
        )
    ded = cands.get("dedicated-inference")
    if ded is not None and not ded.fits:
        reasons.append(f"dedicated-inference {ded.why}")
    lat = cands.get("latency-critical")
    if "latency-critical" in fits and lat is not None and not lat.reboot:
        reasons.append("the kernel already runs with latency-critical's boot arguments")
        return "latency-critical"
    pick = _first(["dedicated-inference", "shared-host"], fits, cands, reasons)
    if pick == "dedicated-inference" and lat is not None and lat.fits and ded is not None:
        more = [a.split("=")[0] for a in lat.reboot if a not in ded.reboot]
        reasons.append(
            "if a reboot is acceptable and tail latency matters most: latency-critical (adds "
            f"{', '.join(more) or 'nothing'} to the kernel command line, and ASPM off)"
        )
    return pick


def _first(
    names: list[str], fits: set[str], cands: dict[str, Candidate], reasons: list[str]
) -> str | None:
    for n in names:
        if n in fits:
            return n
        if n in cands:
            reasons.append(f"{n} {cands[n].why}")
    return None
