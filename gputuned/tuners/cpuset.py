"""CPU partition: give the inference server CPUs that nothing else runs on.

Uses cgroup v2 cpuset partitions (Documentation/admin-guide/cgroup-v2.rst, "cpuset.cpus.partition").
gputuned creates the cgroup named by `cgroup` (relative to the cgroup v2 mount), writes
`cpuset.cpus`, then `cpuset.cpus.exclusive`, then the partition type, and **reads the type back**:
a write can succeed while the state becomes `isolated invalid (<reason>)`, which gputuned reports
with the kernel's reason.

Modes:

- `"root"`: a partition with load balancing among its CPUs. No reboot needed.
- `"isolated"`: also turns off load balancing on those CPUs at run time (Linux 6.1+). Threads
  stay where they are put, so processes moved in should have `spread_threads = true`.
- `"affinity"`: no cgroup; matched processes are only pinned with per-thread affinity. Other
  work can still run on those CPUs.
- `"none"`: this tuner does nothing.

CPUs given to a partition leave every other cgroup's effective set at once, so other work is
evicted without touching its cgroups (seen on the measurement host: a neighbour's CPUs became
4-15 the moment 0-3 became isolated). At least one CPU must stay outside for the rest of the
system.

A partition suppresses no timer ticks, offloads no RCU callbacks and moves no IRQs: use `[irq]`
for interrupts and `[bootargs]` (`nohz_full`, `rcu_nocbs`, `irqaffinity`) for the rest.

Processes get into the partition through `[[process]]` rules with `move_to_partition = true`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from gputuned.changes import Change, PlanContext, Refusal, TunerPlan
from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.host import Host

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
            "no leading '/', no '..'."
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
        if not layout.partitions_possible or layout.v2_mount is None:
            out.refused.append(
                Refusal(
                    self.name,
                    f"partition {cfg.cgroup}",
                    f"not possible here: {layout.why_no_partitions}; falling back to per-thread "
                    f"affinity on {format_cpulist(cpus)}",
                )
            )
            return out
        if cpus >= ctx.cpus.online:
            out.refused.append(
                Refusal(
                    self.name,
                    f"partition {cfg.cgroup}",
                    f"set {cfg.cpus!r} ({format_cpulist(cpus)}) is every online CPU; a partition "
                    "must leave CPUs for the rest of the host",
                )
            )
            return out
        self._plan_partition(ctx, cfg, cpus, layout.v2_mount, out)
        return out

    def _plan_partition(
        self, ctx: PlanContext, cfg: Config, cpus: frozenset[int], mount: str, out: TunerPlan
    ) -> None:
        host = ctx.host
        group = f"{mount}/{cfg.cgroup}"
        ro = cfg.report_only
        cpulist = format_cpulist(cpus)
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
        exists = host.is_dir(group)
        out.changes.append(
            Change(
                self.name,
                f"cgroup {cfg.cgroup}",
                "present" if exists else "absent",
                "present",
                "holds the partition",
                group,
                ro,
                kind="cgroup",
                in_sync=exists,
            )
        )

        def cur(name: str) -> str:
            return (host.read_optional(f"{group}/{name}") or "") if exists else ""

        # Order matters (Documentation/admin-guide/cgroup-v2.rst, "Cpuset Interface Files"):
        # the CPUs, then the exclusive CPUs (Linux 6.7+), then the partition type.
        steps = [("cpuset.cpus", cpulist, "cpulist", "the partition's CPUs")]
        if _has_exclusive(host, mount, group if exists else None):
            steps.append(
                ("cpuset.cpus.exclusive", cpulist, "cpulist", "claims the CPUs for this partition")
            )
        steps.append(("cpuset.cpus.partition", cfg.mode, "partition", f"cpuset.mode = {cfg.mode}"))
        for name, value, compare, why in steps:
            have = cur(name)
            same = parse_cpulist(have) == cpus if compare == "cpulist" else have == value
            out.changes.append(
                Change(
                    self.name,
                    f"{cfg.cgroup} {name}",
                    have or "-",
                    value,
                    why,
                    f"{group}/{name}",
                    ro,
                    compare=compare,
                    in_sync=same,
                )
            )


def _has_exclusive(host: Host, mount: str, group: str | None) -> bool:
    """Whether this kernel has cpuset.cpus.exclusive (6.7+): look at the group or any child."""
    if group is not None:
        return host.exists(f"{group}/cpuset.cpus.exclusive")
    # cpuset.cpus.isolated, in the root cgroup, came with the same cpuset rework (6.7+); it is
    # there even before any child has the cpuset controller enabled.
    if host.exists(f"{mount}/cpuset.cpus.isolated"):
        return True
    return any(
        host.exists(f"{mount}/{name}/cpuset.cpus.exclusive")
        for name in host.listdir(mount)
        if host.is_dir(f"{mount}/{name}")
    )
