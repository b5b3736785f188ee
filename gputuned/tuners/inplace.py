"""Partition in place: the server's own cgroup (its systemd unit's, its container's) becomes
the partition, and its processes stay where their owner put them.

Moving a server's processes into gputuned's partition cgroup takes them out of their unit: a
process moved out is not signalled by ``systemctl stop``, not listed by ``systemctl status``,
and the unit's ``MemoryMax=`` and ``TasksMax=`` no longer apply to it (issue 17). So where a
server tree lives in one cgroup of its own, gputuned makes *that* cgroup the partition: a
cgroup v2 **remote partition** (Linux 6.7+, Documentation/admin-guide/cgroup-v2.rst,
"cpuset.cpus.partition": a partition whose parent is not a partition root; "Writing the
proper cpuset.cpus.exclusive values down the cgroup hierarchy before the target partition
root is mandatory for the creation of a remote partition", and "All the ancestors of a remote
partition root except the root cgroup cannot be a partition root").

In order (each write journaled with its old value, reverted newest first):

1. gputuned's own partition cgroup, which held the CPUs while no server ran (the
   placeholder), turns back into a member and lets its CPUs go (partition, ``cpuset.cpus``,
   ``cpuset.cpus.exclusive``: a sibling's exclusive CPUs may not overlap them, nor cover all
   of a sibling's ``cpuset.cpus``).
2. Where systemd is PID 1 and the cgroup is a unit's: ``AllowedCPUs=`` at run time
   (gputuned/kernel/systemd.py), so that systemd's next realize writes the same
   ``cpuset.cpus``; systemd enables the cpuset controller on the parents with it.
   Elsewhere (a runtime's plain cgroup, a host without systemd as PID 1) gputuned enables
   the controller on each parent itself.
3. ``cpuset.cpus.exclusive`` = the CPUs on each ancestor below the root, top down, then on
   the cgroup; its ``cpuset.cpus``; the partition type, read back (a write can succeed while
   the state reads ``root invalid (...)``).

When the unit stops, systemd removes its cgroup and the kernel gives the partition's CPUs
back; the next plan finds no server, gives back what is left (the ancestors' exclusive CPUs,
``AllowedCPUs=``) and the placeholder takes the CPUs again. A restarted unit's processes are
placed in place again.

Otherwise gputuned falls back to moving the processes into its own partition (``plan`` says
why, in one line): a kernel without ``cpuset.cpus.exclusive``; a cgroup that holds processes
that are not the server's (a user's session with a shell), or child cgroups; servers in
several cgroups for one partition; a cgroup under ``user.slice`` (its user could move any
process in, and it would get the CPUs); ``partitions = "node"`` or ``"gpu"`` and ``by_gpu``
(they would need cgroups of gputuned's inside the unit's).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gputuned import errors
from gputuned.changes import Change, TunerPlan
from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.kernel.proc import ancestor_in
from gputuned.kernel.procfs import cgroup_path
from gputuned.kernel.system import has_exclusive_cpus
from gputuned.kernel.systemd import ALLOWED_CPUS, TRANSIENT_DIR, dropin, unit_of
from gputuned.tuners.context import Claim, PlanContext
from gputuned.tuners.proctree import claim_processes

_MEMO = "inplace"


@dataclass(frozen=True)
class InPlace:
    """The cgroup made the partition in place (as /proc/PID/cgroup shows it), the unit that
    owns it where systemd does (None: a plain cgroup), and its ancestors below the root,
    top down. ``delegated``: the unit has ``Delegate=yes`` (a container runtime's scope;
    podman's crun puts the container in a child cgroup of it): its cgroups are the runtime's,
    systemd is told nothing and gputuned enables the controller itself, as for a plain cgroup.
    (``AllowedCPUs=`` would not do there: systemd keeps cpuset enabled for a delegated unit,
    and the kernel refuses to empty the unit's ``cpuset.cpus`` again while its subtree holds
    processes, so the CPUs would stay behind.)"""

    cgroup: str
    unit: str | None
    ancestors: tuple[str, ...]
    delegated: bool = False


@dataclass(frozen=True)
class Decision:
    """``place``: the partition in place, or None. ``why_not``: why a running server is moved
    into gputuned's partition instead (None: in place, or nothing to decide). ``cgroup``: where
    the server runs."""

    place: InPlace | None = None
    why_not: str | None = None
    cgroup: str = ""


def decision(ctx: PlanContext) -> Decision:
    """:func:`decide` for the processes ``ctx`` read, worked out once per context (the
    daemon's placements between full plans use the decision of the last full plan)."""
    memo = ctx.memo
    if _MEMO not in memo:
        memo[_MEMO] = decide(ctx, claim_processes(ctx)) if applies(ctx) else Decision()
    got = memo[_MEMO]
    assert isinstance(got, Decision)
    return got


def applies(ctx: PlanContext) -> bool:
    """Does this profile move processes into a partition on this host at all?"""
    cfg = ctx.profile.cpuset
    return (
        cfg is not None
        and cfg.in_place
        and cfg.mode in ("root", "isolated")
        and cfg.cpus is not None
        and ctx.cgroup.partitions_possible
        and ctx.cgroup.v2_mount is not None
        and any(r.move_to_partition for r in ctx.profile.process)
    )


def decide(ctx: PlanContext, claims: Mapping[int, Claim]) -> Decision:
    """Where the processes ``claims`` holds (of rules that move processes into the
    partition) can have their partition: see the module."""
    if not applies(ctx):
        return Decision()
    cfg = ctx.profile.cpuset
    assert cfg is not None
    movers = {r.name: r for r in ctx.profile.process if r.move_to_partition}
    where: dict[str, list[int]] = {}
    for pid, c in claims.items():
        if c.rule not in movers:
            continue
        try:
            cg = cgroup_path(ctx.kernel.read_text(f"/proc/{pid}/cgroup"))
        except errors.HostError:
            continue  # exited since
        where.setdefault(cg or "/", []).append(pid)
    if not where:
        return Decision()
    cgroups = sorted(where)
    cg = cgroups[0]
    by_gpu = any(movers[claims[p].rule].by_gpu for p in where[cg])
    # A `systemctl show` on a live host: asked only where the answer matters, once a plan.
    delegating = functools.cache(lambda: delegating_unit(ctx, cg) if ctx.kernel.systemd else None)
    why = why_not_in_place(ctx, cgroups, claims, by_gpu=by_gpu, delegating=delegating)
    if why is not None:
        return Decision(None, why, cg)
    above = delegating()
    parts = [p for p in cg.split("/") if p]
    ancestors = tuple("/" + "/".join(parts[:i]) for i in range(1, len(parts)))
    unit = above or (unit_of(cg) if ctx.kernel.systemd else None)
    return Decision(InPlace(cg, unit, ancestors, above is not None), None, cg)


def delegating_unit(ctx: PlanContext, cg: str) -> str | None:
    """The unit with ``Delegate=yes`` whose own cgroup is ``cg`` or holds it (the nearest
    unit): systemd leaves that subtree to whoever it was delegated to
    (systemd.resource-control(5), Delegate=), as podman does with its libpod scope, whose
    crun puts the container in ``container`` below it. None otherwise."""
    parts = [p for p in cg.split("/") if p]
    for i in range(len(parts), 0, -1):
        unit = unit_of("/" + "/".join(parts[:i]))
        if unit is None:
            continue
        try:
            delegate = ctx.kernel.unit_property(unit, "Delegate")
        except errors.HostError:
            return None
        return unit if delegate == "yes" else None
    return None


def why_not_in_place(
    ctx: PlanContext,
    cgroups: list[str],
    claims: Mapping[int, Claim],
    *,
    by_gpu: bool,
    delegating: Callable[[], str | None],
) -> str | None:
    """Why the server's cgroup cannot be its partition (None: it can). ``delegating()``: the
    unit with ``Delegate=yes`` at or above the cgroup (:func:`delegating_unit`)."""
    cfg = ctx.profile.cpuset
    assert cfg is not None and ctx.cgroup.v2_mount is not None
    mount, own = ctx.cgroup.v2_mount, cfg.cgroup
    kernel = ctx.kernel
    if len(cgroups) > 1:
        return (
            f"the server's processes are in {len(cgroups)} cgroups ({', '.join(cgroups[:4])}); "
            "one partition can be made in place in one of them only"
        )
    cg = cgroups[0]
    parts = [p for p in cg.split("/") if p]
    if cfg.partitions != "one":
        return f"partitions = {cfg.partitions!r} makes one partition each, in gputuned's cgroups"
    if by_gpu:
        return "by_gpu places each process in its GPU's partition, one cgroup each"
    if not parts:
        return "the server runs in the root cgroup, which cannot be a partition"
    if cg == "/" + own or cg.startswith(("/" + own + "/", "/" + own + ".")):
        return f"its processes are in gputuned's cgroup /{own} already"
    if "user.slice" in parts:
        return (
            f"{cg} is a user's cgroup: its user may move any of their processes in, and they "
            "would get the partition's CPUs"
        )
    if (
        kernel.systemd
        and parts[0].endswith(".slice")
        and unit_of(cg) is None
        and delegating() is None
    ):
        return (
            f"{cg} is not a systemd unit's own cgroup, nor below a unit with Delegate=yes "
            "(systemd owns the cgroups below slices)"
        )
    if not has_exclusive_cpus(kernel, mount):
        return (
            "this kernel has no cpuset.cpus.exclusive (Linux 6.7+), which a remote partition needs"
        )
    group = f"{mount}{cg}"
    if any(kernel.is_dir(f"{group}/{n}") for n in _list(ctx, group)):
        return f"{cg} has child cgroups; a partition is made in place only in a leaf cgroup"
    listed = (kernel.read_optional(f"{group}/cgroup.procs") or "").split()
    strangers = _strangers(ctx, [int(p) for p in listed if p.isdigit()], claims)
    if strangers:
        return (
            f"{cg} also holds {_who(ctx, strangers)}, not the server's; those would get the "
            "partition's CPUs too"
        )
    for anc in ("/" + "/".join(parts[:i]) for i in range(1, len(parts))):
        words = (kernel.read_optional(f"{mount}{anc}/cpuset.cpus.partition") or "member").split()
        if words[0] != "member":
            return f"its parent cgroup {anc} is a partition root ({' '.join(words)})"
    return None


def _strangers(ctx: PlanContext, pids: list[int], claims: Mapping[int, Claim]) -> list[int]:
    """The processes of ``pids`` that are not the server's. Not counted: a claimed one; one
    that has exited since; a descendant of a claimed process (the same process, by start
    time), which the claims make the server's. The process list a plan claims from is read
    before ``cgroup.procs``, and a restarting server forks its engine and workers in between:
    counted as strangers, they would move the new tree out of its unit for good."""
    starts = {pid: c.start for pid, c in claims.items()}
    return [
        pid
        for pid in pids
        if pid not in claims
        and ctx.kernel.exists(f"/proc/{pid}")
        and ancestor_in(ctx.kernel, pid, starts) is None
    ]


def lost(ctx: PlanContext, place: InPlace) -> bool:
    """The cgroup made the partition is no partition now: the unit restarted (systemd made its
    cgroup anew, under the same name) or someone undid it."""
    cfg = ctx.profile.cpuset
    mode = cfg.mode if cfg is not None else "root"
    have = ctx.kernel.read_optional(f"{ctx.cgroup.v2_mount}{place.cgroup}/cpuset.cpus.partition")
    return have != mode


def _list(ctx: PlanContext, group: str) -> list[str]:
    try:
        return ctx.kernel.listdir(group)
    except errors.HostError:
        return []


def _who(ctx: PlanContext, pids: list[int]) -> str:
    names = []
    for pid in pids[:3]:
        comm = ctx.kernel.read_optional(f"/proc/{pid}/comm") or "?"
        names.append(f"pid {pid} ({comm[:15]!r})")
    more = f" and {len(pids) - 3} more" if len(pids) > 3 else ""
    return ", ".join(names) + more


def in_place_note(d: Decision, cpus: frozenset[int], placeholder: str) -> str | None:
    """The plan's one line about it."""
    if d.place is not None:
        if d.place.unit and d.place.delegated:
            owner = f"unit {d.place.unit}, which delegates its cgroups: Delegate=yes"
        elif d.place.unit:
            owner = f"unit {d.place.unit}, told AllowedCPUs={format_cpulist(cpus)}"
        else:
            owner = "no systemd unit: the plain cgroup of a container or runtime"
        return (
            f"cpuset: partition in place: {d.place.cgroup} ({owner}) becomes the partition on "
            f"{format_cpulist(cpus)}; the server's processes stay in it, so stopping the unit "
            "stops them all, its status lists them and its MemoryMax=/TasksMax= still apply"
        )
    if d.why_not is not None:
        return (
            f"cpuset: not partitioned in place: {d.why_not}; instead the server's processes "
            f"are moved out of {d.cgroup} into /{placeholder}, so `systemctl stop` of their "
            "unit no longer signals them, its status no longer lists them and its "
            "MemoryMax=/TasksMax= no longer apply to them"
        )
    return None


def plan(ctx: PlanContext, place: InPlace, cpus: frozenset[int], mode: str, out: TunerPlan) -> None:
    """The changes of steps 1-3 of the module (the placeholder's are planned by the caller)."""
    mount = ctx.cgroup.v2_mount
    assert mount is not None
    ro = bool(ctx.profile.cpuset and ctx.profile.cpuset.report_only)
    cpulist = format_cpulist(cpus)
    kernel = ctx.kernel
    if place.unit is not None and not place.delegated:
        have = kernel.unit_property(place.unit, ALLOWED_CPUS) or ""
        transient = kernel.exists(f"{TRANSIENT_DIR}/{place.unit}")
        path = dropin(place.unit, ALLOWED_CPUS, transient=transient)
        shown = format_cpulist(parse_cpulist(have)) if have else ""
        # When AllowedCPUs= goes again, systemd realizes the unit's parents with what their
        # units need, and writes "-cpuset" where none needs it: the root's too, so gputuned's
        # own placeholder and any cgroup that is no unit (a neighbour's partition, a
        # runtime's) would lose it. A root that enables cpuset now gets it back then
        # (settings/units.py); a slice keeps it where one of its units needs it.
        root_sub = (kernel.read_optional(f"{mount}/cgroup.subtree_control") or "").split()
        kept = [mount] if "cpuset" in root_sub else []
        out.changes.append(
            Change(
                "cpuset",
                f"unit {place.unit} AllowedCPUs",
                shown or "-",
                cpulist,
                "systemd writes the unit's cpuset.cpus from it at every realize",
                path,
                ro,
                kind="unit_property",
                data={"unit": place.unit, "property": ALLOWED_CPUS, "cpuset_kept": kept},
            )
        )
    # Where systemd does not enable the controller: every ancestor of a plain cgroup or of a
    # delegated unit's (systemd has enabled it above a delegated unit: in sync there).
    for anc in place.ancestors if place.unit is None or place.delegated else ():
        sub = (kernel.read_optional(f"{mount}{anc}/cgroup.subtree_control") or "").split()
        out.changes.append(
            Change(
                "cpuset",
                f"{anc} cgroup.subtree_control",
                " ".join(sub) or "-",
                "+cpuset",
                f"{place.cgroup} needs the cpuset controller from its parents",
                f"{mount}{anc}/cgroup.subtree_control",
                ro,
                kind="controller",
                data={"controller": "cpuset"},
            )
        )
    steps = [(anc, "cpuset.cpus.exclusive", cpulist) for anc in place.ancestors]
    steps += [
        (place.cgroup, "cpuset.cpus.exclusive", cpulist),
        (place.cgroup, "cpuset.cpus", cpulist),
        (place.cgroup, "cpuset.cpus.partition", mode),
    ]
    # An empty cpuset.cpus is left empty: the cgroup then has its parent's CPUs (a unit's from
    # AllowedCPUs=), and a partition takes its CPUs from cpuset.cpus.exclusive. Written, it
    # could never be put back: the kernel refuses to empty cpuset.cpus of a cgroup that holds
    # processes (ENOSPC; seen on podman's container cgroup, whose cpuset.cpus crun leaves empty).
    if not (kernel.read_optional(f"{mount}{place.cgroup}/cpuset.cpus") or "").strip():
        steps.remove((place.cgroup, "cpuset.cpus", cpulist))
    for cg, name, value in steps:
        have = kernel.read_optional(f"{mount}{cg}/{name}") or ""
        compare = "partition" if name.endswith("partition") else "cpulist"
        why = (
            "a remote partition's ancestors hand its exclusive CPUs down"
            if cg != place.cgroup
            else f"the partition in place (cpuset.mode = {mode})"
        )
        out.changes.append(
            Change(
                "cpuset",
                f"{cg} {name}",
                have or "-",
                value,
                why,
                f"{mount}{cg}/{name}",
                ro,
                kind="borrowed_cpuset",
                compare=compare,
            )
        )


def release(ctx: PlanContext, group: str, name: str, ro: bool, out: TunerPlan) -> None:
    """Step 1: gputuned's placeholder ``group`` (relative ``name``) lets its CPUs go, type
    first (a valid partition cannot lose all its CPUs), its claim on them last."""
    kernel = ctx.kernel
    for file, value, compare in (
        ("cpuset.cpus.partition", "member", "partition"),
        ("cpuset.cpus", "", "cpulist"),
        ("cpuset.cpus.exclusive", "", "cpulist"),
    ):
        have = kernel.read_optional(f"{group}/{file}")
        if have is None:
            continue
        out.changes.append(
            Change(
                "cpuset",
                f"{name} {file}",
                have or "-",
                value,
                "the partition is made in place: gputuned's cgroup lets its CPUs go",
                f"{group}/{file}",
                ro,
                compare=compare,
            )
        )
