"""Kernel work queues and kernel threads: keep the kernel's deferred work off the server's CPUs.

Much of the kernel's own work runs in unbound workqueues: writeback of dirty pages, block I/O
completion for cgroups, crypto, many drivers' deferred work. By default any CPU may run it, so a
host with heavy disk or network neighbours runs their kernel work on the CPUs that feed the GPU.
`cpus` names the set that runs it instead, typically the housekeeping CPUs, as TuneD's
cpu-partitioning profile does at run time.

What it changes (kernel/workqueue.c, Linux 4.2+):

- `/sys/devices/virtual/workqueue/cpumask`: the CPUs every unbound workqueue may use;
- `/sys/devices/virtual/workqueue/<name>/cpumask` for each workqueue that has its own (those
  made with `WQ_SYSFS`, such as `writeback` and `blkcg_punt_bio`);
- with `kthreads = true` (the default), the CPU affinity of every kernel thread that may be
  moved (`sched_setaffinity`), kthreadd included: `kswapd0`, `khugepaged`, the RCU threads,
  drivers' threads, IRQ threads.

The two files take the set as a CPU mask. The kernel refuses a mask with no online CPU (EINVAL), and
per-CPU work (a CPU's own `kworker/N:M`) stays where it is: only unbound work moves.

Kernel threads the kernel binds to their CPUs (`PF_NO_SETAFFINITY`: a CPU's own `ksoftirqd/N`,
`migration/N`, `kworker/N:M`, every workqueue worker) are left where they are; plan counts
them, and the ones it moves, in one note. A kernel thread started after apply does not take
kthreadd's CPUs (kernel/kthread.c resets each new one's to the housekeeping CPUs of
`isolcpus=` / `nohz_full=`, all CPUs without them): verify reports it as drift, and the
daemon moves it at its next full re-plan (drift repair). A kernel thread that ended, or whose PID now belongs to
another process (PID and start time), is neither drift nor written by revert.

Already so: since Linux 6.8 the CPUs of an isolated cpuset partition (`[cpuset] mode =
"isolated"`) and of `isolcpus=` are taken out of the unbound mask by the kernel
(`/sys/devices/virtual/workqueue/cpumask_isolated` lists them); plan says so. A set that
includes such CPUs reads back without them, and apply reports the mismatch: give a set that
leaves the isolated CPUs out. A cpuset partition also takes its CPUs from the movable kernel
threads of the root cgroup (kernel/cgroup/cpuset.c); plan says which CPUs those are.

Revert writes back each mask, and each kernel thread's CPUs, recorded in the journal.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from gputuned.profile.tables import Ref, Table


class Config(BaseModel):
    """The `[workqueues]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: StrictStr = Field(
        default="keep",
        description="CPU set (a [cpusets] name) that runs unbound kernel work, or 'keep'.",
    )
    kthreads: StrictBool = Field(
        default=True,
        description="Also keep the kernel threads that may be moved (kthreadd included) on cpus.",
    )
    report_only: StrictBool = Field(
        default=False,
        description="Report what would change and change nothing.",
    )


def _refs(cfg: Config) -> list[Ref]:
    return [("workqueues.cpus", cfg.cpus, True)]


TABLE = Table(
    key="workqueues",
    model=Config,
    summary="Where the kernel's unbound work and kernel threads run.",
    manual=__doc__ or "",
    position=35,
    tuner="gputuned.tuners.workqueues:WorkqueuesTuner",
    plan_rank=45,
    refs=_refs,
)
