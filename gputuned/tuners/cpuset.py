"""Plans the `[cpuset]` table (its keys and manual: gputuned/profile/tables/cpuset.py): the
cgroup v2 cpuset partition, its cgroups and controllers, the partitions of other cgroups it
must not take CPUs from (partconflict), the remount it may ask for (favordynmods) and the
partition made in place in the server's own cgroup (inplace)."""

from __future__ import annotations

from collections.abc import Sequence

from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.cpulist import format_cpulist
from gputuned.kernel.system import has_exclusive_cpus, valid_partitions
from gputuned.profile.cpusets import PartitionSpec, partition_layout, shared_cpus
from gputuned.profile.tables.cpuset import Config
from gputuned.tuners import favordynmods, inplace, partconflict
from gputuned.tuners.context import PlanContext


def unused_keys_note(cfg: Config) -> str | None:
    """What plan says of a `[cpuset]` whose mode leaves keys it sets unused, or that does
    nothing at all (issue 31, item 8: `cpus` with mode "none" passed without a word)."""
    defaults = Config.model_fields
    changed = [k for k in ("cgroup", "in_place") if getattr(cfg, k) != defaults[k].default]
    if cfg.mode == "none":
        head = "cpuset: mode 'none' makes no partition and pins nothing"
        unused = ([f"cpus = {cfg.cpus!r}"] if cfg.cpus is not None else []) + changed
        modes = "'root' or 'isolated'" if changed else "'root', 'isolated' or 'affinity'"
    elif cfg.mode == "affinity":
        head, unused, modes = (
            "cpuset: mode 'affinity' makes no cgroup",
            changed,
            "'root' or 'isolated'",
        )
    else:
        return None
    one = len(unused) == 1
    named = " and ".join(unused)
    if cfg.mode == "none" and not cfg.favordynmods:
        note = f"{head}: [cpuset] does nothing"
        if unused:
            note += f"; {named} {'takes' if one else 'take'} effect with mode = {modes}"
        return note
    if not unused:
        return None
    return (
        f"{head}: {named} {'does' if one else 'do'} nothing; {'it takes' if one else 'they take'} "
        f"effect with mode = {modes}"
    )


class CpusetTuner:
    """A cgroup v2 cpuset partition holding the inference CPUs, made at run time."""

    name = "cpuset"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        cfg = ctx.profile.cpuset
        out = TunerPlan()
        if cfg is None:
            return out
        if cfg.favordynmods:
            favordynmods.plan(ctx, cfg, self.name, out)
        idle = unused_keys_note(cfg)
        if idle is not None:
            out.notes.append(idle)
        if cfg.mode == "none" or cfg.cpus is None:
            return out
        cpus = ctx.sets.sets[cfg.cpus]
        if cfg.mode == "affinity":
            out.notes.append(
                f"cpuset: mode 'affinity': [[process]] rules pin threads to {format_cpulist(cpus)}; "
                "no cgroup is made"
            )
            return out
        layout = ctx.cgroup
        parts = partition_layout(cfg, ctx.sets, ctx.cpus)
        names = ", ".join(p.cgroup for p in parts)
        if not layout.partitions_possible or layout.v2_mount is None:
            out.refused.append(
                Refusal(
                    self.name,
                    f"partition {names}",
                    f"not possible here: {layout.why_no_partitions}; falling back to per-thread "
                    f"affinity on {format_cpulist(cpus)}",
                )
            )
            return out
        if cpus >= ctx.cpus.online:
            out.refused.append(
                Refusal(
                    self.name,
                    f"partition {names}",
                    f"set {cfg.cpus!r} ({format_cpulist(cpus)}) is every online CPU; a partition "
                    "must leave CPUs for the rest of the host",
                )
            )
            return out
        shared = shared_cpus(parts)
        if shared:
            out.refused.append(partconflict.shared_refusal(self.name, cfg, shared))
            return out
        self._plan_controller(ctx, layout.v2_mount, cfg.report_only, out)
        ours = {p.cgroup for p in parts}
        here = inplace.decision(ctx)
        said = inplace.in_place_note(here, cpus, cfg.cgroup)
        if said is not None:
            out.notes.append(said)
        if here.place is None:
            for part in parts:
                self._plan_partition(ctx, cfg, part, layout.v2_mount, out)
        else:  # the server's own cgroup is the partition (tuners/inplace.py)
            self._plan_in_place(ctx, cfg, here.place, cpus, layout.v2_mount, out)
            ours.add(here.place.cgroup.lstrip("/"))
        # A unit's cgroup gputuned made the partition in place is its own to give back
        # (apply does that first): its processes may have ended before systemd removed it.
        ours |= {
            p.cgroup
            for p in valid_partitions(ctx.kernel, layout.v2_mount)
            if ctx.original(f"borrowed_cpuset:{layout.v2_mount}/{p.cgroup}/cpuset.cpus.partition")
            is not None
        }
        held = partconflict.held_by_others(ctx.kernel, layout.v2_mount, ours, cpus)
        if held:
            out.refused.append(
                partconflict.held_refusal(self.name, cfg, cpus, layout.v2_mount, held)
            )
        return out

    def _plan_controller(self, ctx: PlanContext, mount: str, ro: bool, out: TunerPlan) -> None:
        out.changes.append(
            Change(
                self.name,
                "root cgroup.subtree_control",
                " ".join(sorted(ctx.cgroup.v2_subtree)) or "-",
                "+cpuset",
                "children of the root cgroup need the cpuset controller",
                f"{mount}/cgroup.subtree_control",
                ro,
                kind="controller",
                data={"controller": "cpuset"},
            )
        )

    def _plan_in_place(
        self,
        ctx: PlanContext,
        cfg: Config,
        place: inplace.InPlace,
        cpus: frozenset[int],
        mount: str,
        out: TunerPlan,
    ) -> None:
        """gputuned's own cgroup stays (the daemon's placeholder for when the server stops)
        without CPUs; the server's cgroup becomes the partition."""
        group = f"{mount}/{cfg.cgroup}"
        if ctx.kernel.is_dir(group):
            out.changes.append(
                Change(
                    self.name,
                    f"cgroup {cfg.cgroup}",
                    "present",
                    "present",
                    "holds the partition while no server runs",
                    group,
                    cfg.report_only,
                    kind="cgroup",
                )
            )
            inplace.release(ctx, group, cfg.cgroup, cfg.report_only, out)
        inplace.plan(ctx, place, cpus, cfg.mode, out)

    def _plan_partition(
        self, ctx: PlanContext, cfg: Config, part: PartitionSpec, mount: str, out: TunerPlan
    ) -> None:
        kernel = ctx.kernel
        group = f"{mount}/{part.cgroup}"
        ro = cfg.report_only
        cpus = part.cpus
        cpulist = format_cpulist(cpus)
        exists = kernel.is_dir(group)
        out.changes.append(
            Change(
                self.name,
                f"cgroup {part.cgroup}",
                "present" if exists else "absent",
                "present",
                f"holds the partition{part.of}",
                group,
                ro,
                kind="cgroup",
            )
        )

        def cur(name: str) -> str:
            return (kernel.read_optional(f"{group}/{name}") or "") if exists else ""

        # Order matters (Documentation/admin-guide/cgroup-v2.rst, "Cpuset Interface Files";
        # kernel/cgroup/cpuset.c). The exclusive CPUs (Linux 6.7+) first: the kernel refuses
        # them (EINVAL, update_exclusive_cpumask() -> validate_change()) while a sibling's
        # cpuset.cpus.exclusive(.effective) holds any, and nothing changes. A cpuset.cpus
        # write is not refused on cgroup v2: it turns every sibling partition it overlaps
        # "root invalid" (update_cpumask()), and that partition stays invalid (finding F1,
        # docs/dev/reliability.md). Once the claim is in, cpuset.cpus overlaps no partition (the
        # kernel compares siblings by their exclusive CPUs), and the exclusive set need not be
        # inside cpuset.cpus. The partition type last. Revert goes newest first: the type,
        # cpuset.cpus, and the claim is let go last.
        steps = []
        if has_exclusive_cpus(kernel, mount, group if exists else None):
            steps.append(
                ("cpuset.cpus.exclusive", cpulist, "cpulist", "claims the CPUs for this partition")
            )
        steps.append(("cpuset.cpus", cpulist, "cpulist", "the partition's CPUs"))
        steps.append(("cpuset.cpus.partition", cfg.mode, "partition", f"cpuset.mode = {cfg.mode}"))
        for name, value, compare, why in steps:
            have = cur(name)
            out.changes.append(
                Change(
                    self.name,
                    f"{part.cgroup} {name}",
                    have or "-",
                    value,
                    why,
                    f"{group}/{name}",
                    ro,
                    compare=compare,
                )
            )
