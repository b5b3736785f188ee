"""CPU partition: give the inference server CPUs that nothing else runs on.

Uses cgroup v2 cpuset partitions (Documentation/admin-guide/cgroup-v2.rst, "cpuset.cpus.partition").
gputuned creates the cgroup named by `cgroup` (relative to the cgroup v2 mount), writes
`cpuset.cpus.exclusive` (Linux 6.7+), then `cpuset.cpus`, then the partition type, and **reads
the type back**: a write can succeed while the state becomes `isolated invalid (<reason>)`, which
gputuned reports with the kernel's reason.

CPUs that another cgroup already holds as a valid partition are refused in plan, and then the
whole profile is: apply writes nothing. Taking them would end that partition (the kernel turns
it `root invalid` and leaves it so), and undoing gputuned's own writes would not bring it back.
The write order covers a partition made between plan and apply: the exclusive claim comes
first, and the kernel refuses it (EINVAL) before anything of the other partition changes.

Modes:

- `"root"`: a partition with load balancing among its CPUs. No reboot needed.
- `"isolated"`: also turns off load balancing on those CPUs at run time (Linux 6.1+). Threads
  stay where they are put, so processes moved in should have `spread_threads = true` (a CPU
  per thread, each process's main thread on one of its own).
- `"affinity"`: no cgroup; matched processes are only pinned with per-thread affinity. Other
  work can still run on those CPUs.
- `"none"`: no partition and no pinning (`favordynmods` still applies).

CPUs given to a partition leave every other cgroup's effective set at once, so other work is
evicted without touching its cgroups (seen on the measurement host: a neighbour's CPUs became
4-15 the moment 0-3 became isolated). At least one CPU must stay outside for the rest of the
system.

A partition suppresses no timer ticks, offloads no RCU callbacks and moves no IRQs: use `[irq]`
for interrupts and `[bootargs]` (`nohz_full`, `rcu_nocbs`, `irqaffinity`) for the rest.

Processes get into the partition through `[[process]]` rules with `move_to_partition = true`.
Where such a server runs in a cgroup of its own (a systemd unit's, a container's), that cgroup
becomes the partition instead and nothing is moved (`in_place`, Linux 6.7+; see
tuners/inplace.py and docs/systemd.md); `plan` says which is done, and why.

Several partitions: `partitions = "node"` makes one sibling partition per NUMA node, holding
the set's CPUs there (`<cgroup>.node0`, `<cgroup>.node1`, ...); `partitions = "gpu"` one per
GPU, holding that GPU's member of a `per = "gpu"` set (`<cgroup>.gpu0`, ...). Each is made and
read back like the single one, and a partition the kernel turns invalid is reported with its
reason. A process can be in one cgroup only: with several partitions, a `[[process]]` rule
with `move_to_partition` needs `by_gpu = true`, which moves each process into the partition of
the GPU it uses (a process using GPUs of two partitions stays outside them; see `by_gpu`). The
shipped profiles use one partition spanning the server's CPUs on every node, with sets and
IRQs per GPU; `profiles/per-gpu.toml` makes one partition per GPU.

Housekeeping: `plan` refuses a layout that leaves any NUMA node fewer than
`housekeeping_cores` whole cores outside the partitions and `[bootargs] nohz_full`.

`favordynmods = true` remounts the cgroup v2 hierarchy with that option added
(Documentation/admin-guide/cgroup-v2.rst, "favordynmods", Linux 6.0+). Moving a process writes
its PID to `cgroup.procs`, which takes the kernel's cgroup_threadgroup_rwsem for writing; without
the option that write waits for an RCU grace period. On the measurement host (Linux 6.18) a move
took 7.9 ms median (11.9 ms at most) as mounted and 0.33 ms (0.6 ms at most) with
`favordynmods`, and the move was most of the daemon's time from a server's exec to its
placement. The price: forks and exits, everywhere on the host, take the slower path of that lock.
Every other option of the mount (`nsdelegate`, `memory_recursiveprot`, its `nosuid`, ...) is
kept; revert remounts with the original options, which puts them back exactly. It applies in
mode "none" too (it speeds up every move between cgroups, not only those into the partition),
but not where the profile's partition cannot be made (a cgroup v1/v2 hybrid host: gputuned then
pins threads instead and moves nothing in the v2 hierarchy, so the remount would only make
forks and exits slower) or in mode "affinity"; the plan says so in a note. Where no
cgroup v2 hierarchy is mounted, or the kernel does not know the option, it is reported as not
possible here. A remount changes the hierarchy's options for the whole host, and only from the
initial cgroup namespace (kernel/cgroup/cgroup.c apply_cgroup_root_flags()).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.engine.changes import Change, PlanContext, Refusal, TunerPlan
from gputuned.kernel.system import has_exclusive_cpus, valid_partitions
from gputuned.profile.cpusets import PartitionSpec, partition_layout, shared_cpus
from gputuned.tuners import favordynmods, inplace, partconflict

_CGROUP_PART = re.compile(r"[^/\s]+")


class Config(BaseModel):
    """The `[cpuset]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["isolated", "root", "affinity", "none"] = Field(
        default="none",
        description=(
            "'isolated' (cgroup v2 partition without load balancing), 'root' (partition with "
            "load balancing), 'affinity' (per-thread affinity only, no cgroup) or 'none'."
        ),
    )
    cpus: StrictStr | None = Field(
        default=None,
        validate_default=True,
        description="CPU set (a [cpusets] name) the partition holds; needed unless mode is 'none'.",
    )
    cgroup: StrictStr = Field(
        default="gputuned.inference",
        description=(
            "cgroup created for the partition, relative to the cgroup v2 mount; "
            "no leading '/', no '..'. With several partitions, each is this name plus "
            "'.node<N>' or '.gpu<N>'."
        ),
    )
    partitions: Literal["one", "node", "gpu"] = Field(
        default="one",
        description=(
            "'one' partition holding the whole set (every node), one sibling partition per "
            "NUMA 'node' (the set's CPUs there), or one per 'gpu' (each member of a per = "
            "'gpu' set). With several, [[process]] move_to_partition needs by_gpu = true."
        ),
    )
    in_place: StrictBool = Field(
        default=True,
        description=(
            "Where the processes of the [[process]] rules that move into the partition all "
            "live in one cgroup of their own (a systemd unit's, a container's), make that "
            "cgroup the partition (Linux 6.7+) instead of moving them into `cgroup`: they stay "
            "in their unit, whose stop, status and MemoryMax=/TasksMax= keep working. "
            "false: always move them. plan says which, and why."
        ),
    )
    housekeeping_cores: StrictInt = Field(
        default=1,
        ge=0,
        description=(
            "Whole cores every NUMA node must keep outside the partitions and nohz_full for "
            "the rest of the system; plan refuses a layout that leaves fewer. 0 turns the "
            "check off."
        ),
    )
    favordynmods: StrictBool = Field(
        default=False,
        description=(
            "Remount the cgroup v2 hierarchy with 'favordynmods' (Linux 6.0+), so that moving a "
            "process between cgroups does not wait for an RCU grace period: 7.9 ms median "
            "(11.9 max) per move became 0.33 ms (0.6 max) on the measurement host. Forks and "
            "exits get slower in exchange, host-wide. Every other mount option is kept and "
            "revert remounts with the original ones. Applies in any mode."
        ),
    )
    report_only: StrictBool = Field(
        default=False,
        description="Report what would change and change nothing.",
    )

    @field_validator("cpus")
    @classmethod
    def _cpus_needed(cls, value: str | None, info: ValidationInfo) -> str | None:
        mode = info.data.get("mode")
        if value is None and mode not in (None, "none"):
            raise ValueError(f"mode {mode!r} needs cpus = '<name of a [cpusets] set>'")
        return value

    @field_validator("partitions")
    @classmethod
    def _partitions_need_a_partition_mode(cls, value: str, info: ValidationInfo) -> str:
        mode = info.data.get("mode")
        if value != "one" and mode not in (None, "root", "isolated"):
            raise ValueError(
                f"{value!r} makes partitions, and mode {mode!r} makes none; use mode 'root' or "
                "'isolated', or partitions = 'one'"
            )
        return value

    @field_validator("cgroup")
    @classmethod
    def _relative_cgroup(cls, value: str) -> str:
        parts = value.split("/")
        if not all(_CGROUP_PART.fullmatch(p) and p not in (".", "..") for p in parts):
            raise ValueError(
                f"{value!r} is not allowed; write a path relative to the cgroup v2 mount without "
                "a leading '/', empty parts, '.', '..' or spaces (e.g. 'gputuned.inference')"
            )
        return value


class CpusetTuner:
    """A cgroup v2 cpuset partition holding the inference CPUs, made at run time."""

    name = "cpuset"

    def plan(self, ctx: PlanContext) -> TunerPlan:
        cfg = ctx.profile.cpuset
        out = TunerPlan()
        if cfg is None:
            return out
        if cfg.favordynmods:
            favordynmods.plan(ctx, cfg, self.name, out)
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
                in_sync="cpuset" in ctx.cgroup.v2_subtree,
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
                    in_sync=True,
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
                in_sync=exists,
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
            same = parse_cpulist(have) == cpus if compare == "cpulist" else have == value
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
                    in_sync=same,
                )
            )
