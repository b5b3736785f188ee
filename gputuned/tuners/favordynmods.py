"""favordynmods: the remount of the cgroup v2 hierarchy that `[cpuset] favordynmods` asks for,
planned for the cpuset tuner.

One change (kind ``mount``): the cgroup2 mount's super options with ``favordynmods`` added,
every other option kept. It is not planned where the profile moves no process between cgroup
v2 groups (mode "affinity", or a partition that falls back to per-thread affinity): a note says
so. It is refused as not possible here where no cgroup v2 hierarchy is mounted, the kernel does
not list the option in ``/sys/kernel/cgroup/features``, gputuned runs outside the initial
cgroup namespace, or one remount cannot keep the mount as it is (:mod:`gputuned.kernel.mounts`).
Why, what it costs and what was measured: the `[cpuset]` manual (:mod:`gputuned.tuners.cpuset`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.kernel import Kernel, mounts
from gputuned.tuners.context import PlanContext

if TYPE_CHECKING:
    from gputuned.profile.tables.cpuset import Config

_CGROUP_NS = "/proc/self/ns/cgroup"
#: The initial cgroup namespace's inode is fixed: PROC_CGROUP_INIT_INO (include/linux/proc_ns.h).
_INIT_CGROUP_NS = "cgroup:[4026531835]"


def plan(ctx: PlanContext, cfg: Config, tuner: str, out: TunerPlan) -> None:
    """The remount's change, refusal or note for a `[cpuset]` table with favordynmods = true."""
    if _moves_nothing(ctx, cfg):
        out.notes.append(
            "cpuset.favordynmods: not planned: this profile moves no process between "
            "cgroup v2 groups here (mode 'affinity', or its partition falls back to "
            "per-thread affinity), so the remount would only make forks and exits slower"
        )
    else:
        _plan_favordynmods(ctx, cfg, tuner, out)


def _moves_nothing(ctx: PlanContext, cfg: Config) -> bool:
    """No move into a gputuned cgroup will happen: mode "affinity", or a partition mode on a
    host that cannot make the partition (gputuned falls back to pinning threads)."""
    if cfg.mode == "affinity":
        return True
    if cfg.mode == "none" or cfg.cpus is None:
        return False
    return not ctx.cgroup.partitions_possible or ctx.cgroup.v2_mount is None


def _plan_favordynmods(ctx: PlanContext, cfg: Config, tuner: str, out: TunerPlan) -> None:
    """The cgroup2 mount's super options with favordynmods added (a remount; see the module)."""
    point = ctx.cgroup.v2_mount
    target = f"cgroup2 mount options ({point or 'not mounted'})"
    try:
        if point is None:
            raise errors.NotSupported(
                f"no cgroup v2 hierarchy is mounted (cgroup mode: {ctx.cgroup.mode})"
            )
        mount = mounts.find(ctx.kernel, point, "cgroup2")
        wanted = mounts.with_option(mount.super_options, "favordynmods")
        if wanted != mount.super_options:
            _check_remount(ctx.kernel, mount, wanted)
    except errors.HostError as exc:
        out.refused.append(Refusal(tuner, target, f"not possible here: {exc}"))
        return
    out.changes.append(
        Change(
            tuner,
            target,
            mount.super_options,
            wanted,
            "moving a process between cgroups stops waiting for an RCU grace period "
            "(cpuset.favordynmods; forks and exits get slower)",
            point,
            cfg.report_only,
            kind="mount",
            compare="options",
            data={"fstype": "cgroup2"},
        )
    )


def _check_remount(kernel: Kernel, mount: mounts.Mount, wanted: str) -> None:
    """NotSupported where remounting ``mount`` with ``wanted`` cannot work on this host."""
    features = kernel.read_optional(mounts.CGROUP_FEATURES)
    if features is not None and "favordynmods" not in features.split():
        raise errors.NotSupported(
            f"this kernel has no favordynmods (Linux 6.0+; {mounts.CGROUP_FEATURES} does not "
            "list it)"
        )
    try:
        ns = kernel.readlink(_CGROUP_NS)
    except errors.HostError:  # a tree without it, or a kernel without cgroup namespaces
        ns = _INIT_CGROUP_NS
    if ns != _INIT_CGROUP_NS:
        raise errors.NotSupported(
            f"gputuned runs in a cgroup namespace of its own ({ns}); the kernel takes cgroup2 "
            "mount options only from the initial one (apply_cgroup_root_flags())"
        )
    mounts.remount_call(mount, wanted)  # refuses a mount that one remount cannot keep as it is
