"""Process placement: nice level, scheduling policy, CPUs and partition for servers' process trees.

Each `[[process]]` rule matches processes by the keys under `match` (all given keys must match)
and sets what the rule names, on the matched process **and every process it starts**
(`children = "follow"`, the default): real servers are process trees. vLLM's API server starts
the process that drives the GPU with multiprocessing's *spawn* context, and that one starts a
worker per GPU the same way; their command lines (`python3 -c from multiprocessing.spawn import
spawn_main; ...`, then `VLLM::EngineCore` once renamed) name no server, so only the tree finds
them. Descendants are placed whenever they appear: those running when gputuned starts (the tree
is walked at apply and at daemon start) and those started later (fork, exec and rename events,
while the daemon runs; a one-shot `gputunectl apply` places the tree as it is then).

Every process gputuned places is journaled with its own original values. A child started after
its parent was placed inherited the placement at fork; its original is what the parent had
before gputuned, and that is what revert gives it. `exclude` names helpers to leave out (by
`comm` or `cmdline`); they, their own children, and with `children = "ignore"` every child, get
back what their ancestor had before gputuned instead of the inherited placement. So does a
descendant that runs as another user than its parent (a `sudo`, a setuid helper), unless
`other_users = true`: a rule that names the server's user grants nothing to another's.

Revert puts back every process it placed, then every process still inside gputuned's cgroup
that it did not place (moved to where its placed ancestor came from, its inherited values put
back too); a process whose original cgroup is gone goes to the nearest existing ancestor, and
the report says so. A revert that leaves anything behind exits non-zero and names it.

What helps, as measured on a 16-vCPU H200 host under CPU, network and disk noise (decode
throughput and p99 token latency as ratios to a quiet run): untuned 0.53x / 2.56x;
`nice = -10` on all threads 0.91x / 1.05x, the largest single gain; `SCHED_FIFO` 0.86-0.92x /
2.28-2.40x, far worse. A CUDA thread that spin-waits on the GPU exhausts the real-time budget
(`kernel.sched_rt_runtime_us`, 950 ms per second by default) and is throttled. Real-time
policies also fail with EPERM in cgroups that have the cpu controller but no RT budget. Use
`policy = "other"` with a negative `nice` unless you have measured otherwise.

`spread_threads` (inside an isolated partition, which does no load balancing: a thread stays on
the CPU it was put on or created on) pins every thread to one CPU, planned for all the
processes the rules place on that CPU set together, not one process at a time: each process's
main thread (the loop that launches the GPU work, in vLLM's API server, EngineCore and every
worker) gets a CPU no other thread holds, matched processes first, then descendants by start
time, while one CPU is left for the other threads; past that, main threads share those CPUs
evenly. The other threads go to the CPUs holding no main thread, evenly, least loaded first.
A thread already on a CPU of the set that suits it stays there, so re-plans and new processes
move only what must move; a child that inherited its parent's CPU at fork gets its own. Give
the set more CPUs than the server has processes.

`by_gpu` places each process of the tree on the CPUs of the GPU it uses, for tensor-parallel
servers on hosts with several NUMA nodes: each worker on its own GPU's node (that GPU's member
of the `cpus` set; with `move_to_partition`, the partition holding it, so `[cpuset]
partitions = "gpu"` or `"node"` work). Which GPU a process uses: NVML's process list, the
`/dev/nvidiaN` nodes it has open (char major 195), and `CUDA_VISIBLE_DEVICES` /
`NVIDIA_VISIBLE_DEVICES` from its environment at exec (docs/multi-gpu.md says how they are
mapped, and what happens when CUDA's device order cannot be known). Processes of the tree that
use no GPU (API server, tokenizer workers) go where `without_gpu` says: by default with the GPUs
the rest of their tree uses. A process using GPUs of two partitions cannot be in both: it
stays outside the partitions with affinity to the CPUs of its GPUs' nodes that no partition
holds, and `plan` says so. A process that opens its GPU after it started is placed when the
daemon next looks: every `[daemon] gpu_scan_interval_s` (device nodes of the processes it
placed) and `nvml_interval_s` (NVML).

Confining a server to few CPUs can cost throughput; the best count depends on host and workload,
so the CPU sets in `[cpusets]` say it explicitly: measure before settling on one.

Before every change and every revert gputuned checks that the PID still belongs to the same
process (PID and start time), since PIDs are reused.

Match keys:

- `user` / `uid`: the account the process runs as (real and effective user ID).
- `unit`: the systemd **system** unit the process runs in (`.service` or `.scope`), exactly;
  never a unit under `user.slice` (a user's `systemd-run --user --unit=vllm.service` is not
  it). A process matched by unit stays matched once gputuned has moved it into the partition.
- `cgroup`: prefix of the process's cgroup v2 path as `/proc/PID/cgroup` shows it.
- `exe`: exact path of the executable, as `/proc/PID/exe` points to.
- `comm`: exact command name (`/proc/PID/comm`; the kernel keeps 15 characters).
- `cmdline`: Python regular expression searched (`re.search`) in the first 4096 bytes of the
  command line, arguments joined by single spaces. Any user writes their own command line, so
  a pattern that repeats a part holding another unbounded repetition (`(\\S+\\s+)*`) is
  refused: it can backtrack exponentially. Write the outer repetition possessive
  (`(?:...)*+`, with non-capturing groups inside: Python 3.11 fails on capturing ones there)
  or atomic (`(?>...)`), or bound it. It is searched only in processes that pass the rule's
  other keys (`user`, `uid`, `unit`, `cgroup` first), so a rule that names an owner never
  searches another user's command line. Each search gets 50 ms of CPU; one that runs past it
  is stopped and the pattern suspended for that process until the profile is applied again
  (it does not match it; a suspended `exclude.cmdline` leaves it out), and status and plan
  say so: other processes are still searched, so one user's command line cannot switch a
  rule off for another's server.
- `uses_gpu`: the process uses this GPU (index): NVML lists it, it has `/dev/nvidiaN` open, or
  its `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` name it.

Who may have it: `exe`, `comm`, `cmdline` and `uses_gpu` are every local user's to choose (a
script named `vllm.py`, `exec -a "python3 vllm"`). A rule that grants a negative nice, a
real-time policy, CPUs or the partition must also match by `user`, `uid`, `unit` or a `cgroup`
outside `user.slice` and the kubelet's `kubepods` cgroups (the kubelet makes one for every pod,
whoever made it: docs/fleet.md); otherwise `plan` and `apply` refuse it, unless the rule says
`any_user = true`.

Threads: the daemon places a new thread of a placed process alone (clone gave it the placed
values already; it reads that thread, not all of them). The journal holds one entry per
attribute for each thread alive; an ended thread's entries are dropped, and the file is
compacted once it holds 256 lines more than twice its live entries.
"""

from __future__ import annotations

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
from gputuned.profile.tables.processmatch import Exclude, Match


class Config(BaseModel):
    """One `[[process]]` rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(
        min_length=1, description="Name of the rule, used in reports and logs; unique."
    )
    match: Match = Field(
        description="Which processes the rule applies to; all given keys must match."
    )
    cpus: StrictStr = Field(
        default="keep",
        description="CPU set (a [cpusets] name) every thread is pinned to, or 'keep'.",
    )
    nice: StrictInt | None = Field(
        default=None, ge=-20, le=19, description="Nice level for every thread, -20..19."
    )
    policy: Literal["keep", "other", "batch", "idle", "fifo", "rr"] = Field(
        default="keep",
        description=(
            "Scheduling policy for every thread: SCHED_OTHER, BATCH, IDLE, FIFO or RR, or 'keep'. "
            "fifo and rr made tail latency far worse in measurements (RT throttling)."
        ),
    )
    priority: StrictInt | None = Field(
        default=None,
        validate_default=True,
        description="Real-time priority 1..99, only with policy fifo or rr.",
    )
    move_to_partition: StrictBool = Field(
        default=False,
        description="Move the process into the [cpuset] partition (mode 'isolated' or 'root').",
    )
    spread_threads: StrictBool = Field(
        default=False,
        description=(
            "Inside an isolated partition (no load balancing there), pin every thread to one "
            "CPU, planned over all processes placed on the set: each process's main thread "
            "gets a CPU of its own (matched processes first, then descendants by start time) "
            "while one is left for the other threads, which share the rest evenly. Threads "
            "already placed stay where they are."
        ),
    )
    by_gpu: StrictBool = Field(
        default=False,
        description=(
            "Place each process on the CPUs of the GPU it uses (NVML, its open /dev/nvidiaN, "
            "its CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES): that GPU's member of the "
            "cpus set and, with move_to_partition, the partition holding it. A process using "
            "GPUs in two partitions stays outside them, on its GPUs' nodes' CPUs that no "
            "partition holds."
        ),
    )
    without_gpu: StrictStr = Field(
        default="tree",
        description=(
            "With by_gpu: where a process of the tree that uses no GPU goes: 'tree' (with the "
            "GPUs the rest of its tree uses) or the name of a [cpusets] set."
        ),
    )
    children: Literal["follow", "ignore"] = Field(
        default="follow",
        description=(
            "'follow': every process a matched process starts (spawned, forked, renamed, "
            "grandchildren) is placed too. 'ignore': only the matched process; its children "
            "get back what it had before gputuned instead of the placement fork passed on."
        ),
    )
    other_users: StrictBool = Field(
        default=False,
        description=(
            "With children = 'follow': also place descendants that run as another user than "
            "their parent (a sudo, a setuid helper, a worker that drops to another account). "
            "Off: they are left out, get back what their ancestor had, and plan says so."
        ),
    )
    exclude: Exclude = Field(
        default_factory=Exclude,
        description=(
            "Descendants to leave out (and their own children): they get back what their "
            "ancestor had before gputuned."
        ),
    )
    any_user: StrictBool = Field(
        default=False,
        description=(
            "Allow a rule that any local user's process could satisfy (no match.user, uid, "
            "unit or a cgroup outside user.slice and kubepods) to grant a negative nice, a "
            "real-time policy, CPUs or the partition. Without it plan and apply refuse such a "
            "rule."
        ),
    )
    self_binding: Literal["respect", "override"] = Field(
        default="respect",
        description=(
            "A process that sets its own CPUs back (SGLang, vLLM --numa-bind, TensorRT-LLM): "
            "'respect' (the daemon stops repairing its CPUs once it has undone gputuned's "
            "twice in a row, right after gputuned set them; nice, policy and IRQs are still "
            "applied) or 'override' (repair at every drift check, as for any drift)."
        ),
    )
    report_only: StrictBool = Field(
        default=False,
        description="Report what would change and change nothing.",
    )

    @field_validator("priority")
    @classmethod
    def _priority_fits_policy(cls, value: int | None, info: ValidationInfo) -> int | None:
        policy = info.data.get("policy")
        if policy in ("fifo", "rr"):
            if value is None:
                raise ValueError(f"policy {policy!r} needs a priority from 1 to 99; add one")
            if not 1 <= value <= 99:
                raise ValueError(f"policy {policy!r} needs a priority from 1 to 99; got {value}")
        elif value not in (None, 0) and policy is not None:
            raise ValueError(
                f"{value} is not allowed with policy {policy!r}; a priority is only for "
                "'fifo' or 'rr': remove it or set it to 0"
            )
        return value


def _refs(rules: tuple[Config, ...]) -> list[Ref]:
    refs: list[Ref] = [(f"process[{i}].cpus", r.cpus, True) for i, r in enumerate(rules)]
    return refs + [
        (f"process[{i}].without_gpu", r.without_gpu, False)
        for i, r in enumerate(rules)
        if r.by_gpu and r.without_gpu != "tree"
    ]


TABLE = Table(
    key="process",
    model=Config,
    summary="Process rules, one [[process]] table each.",
    manual=__doc__ or "",
    position=50,
    tuner="gputuned.tuners.procplan:ProcessTuner",
    plan_rank=50,
    refs=_refs,
    many=True,
)
