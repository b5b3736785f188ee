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
docs/systemd.md); `plan` says which is done, and why.

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

from gputuned.profile.tables import Ref, Table

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


def _refs(cfg: Config) -> list[Ref]:
    # Named in any mode: a misspelt set is an error even where the mode leaves it unused.
    return [] if cfg.cpus is None else [("cpuset.cpus", cfg.cpus, False)]


TABLE = Table(
    key="cpuset",
    model=Config,
    summary="cgroup v2 CPU partition.",
    manual=__doc__ or "",
    position=40,
    tuner="gputuned.tuners.cpuset:CpusetTuner",
    plan_rank=30,
    refs=_refs,
)
