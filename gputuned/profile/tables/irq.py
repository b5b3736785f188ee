"""IRQ affinity: GPU interrupts near the inference CPUs, every other interrupt away from them.

- `gpu_cpus`: each GPU's MSI/MSI-X vectors go to its own CPUs of this set: its member of a
  `per = "gpu"` set, else the set's CPUs on the GPU's NUMA node. Only where the set has no CPU
  on that node do they go to the set's other CPUs, and the plan says so: a vector handled on
  another socket sends every completion across the interconnect. With `spread`, one vector
  per CPU, the first thread of every core before any second thread; GPUs that share CPUs
  continue one round robin. The NVIDIA driver's vectors are not kernel-managed, so they can
  move.
- `others_cpus`: every other movable IRQ goes to this set, typically the housekeeping CPUs, so
  that network, disk and timer interrupts stop landing on the CPUs the server runs on: to the
  set's CPUs on the NUMA node of the PCI device that owns the IRQ (all of the set for IRQs of
  no PCI device, or where the set has none on that node).
- `default_affinity`: written to `/proc/irq/default_smp_affinity`, so IRQs allocated later
  (hot-plugged devices, drivers loaded later) land on this set too (all its CPUs).

On a host with more than 32 CPUs, `plan` refuses a layout that puts every movable IRQ on a
single CPU: one CPU then takes a whole host's interrupts.

Each takes the name of a set from `[cpusets]`, or `"keep"` to leave that part alone.

Unmovable IRQs: writing `/proc/irq/N/smp_affinity_list` fails with EIO for kernel-managed IRQs
(kernel/irq/manage.c, `irq_set_affinity` refuses managed interrupts) and with EPERM for others
that cannot move (seen on virtio vectors). gputuned skips those and lists them in the report.

irqbalance: it bans only the CPUs in `/sys/devices/system/cpu/isolated` and `nohz_full`; it does
not know cgroup partitions and will move IRQs back. With `irqbalance = "coordinate"` gputuned
tells a running irqbalance which CPUs it may use through its root-only socket (`settings cpus`);
with `"report"` it only reports the conflict; with `"ignore"` it says nothing.

Boot-time IRQ placement (`irqaffinity=`) belongs to `[bootargs]`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from gputuned.profile.tables import Ref, Table

#: The keys that name a CPU set.
SET_KEYS = ("gpu_cpus", "others_cpus", "default_affinity")


class Config(BaseModel):
    """The `[irq]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_cpus: StrictStr = Field(
        default="keep",
        description="CPU set (a [cpusets] name) for the GPUs' MSI/MSI-X vectors, or 'keep'.",
    )
    spread: StrictBool = Field(
        default=True,
        description="Give each GPU vector one CPU of gpu_cpus, round robin, not all of them.",
    )
    others_cpus: StrictStr = Field(
        default="keep",
        description="CPU set for every other movable IRQ, or 'keep'.",
    )
    default_affinity: StrictStr = Field(
        default="keep",
        description="CPU set for /proc/irq/default_smp_affinity (IRQs allocated later), or 'keep'.",
    )
    irqbalance: Literal["coordinate", "report", "ignore"] = Field(
        default="coordinate",
        description=(
            "What to do about a running irqbalance: 'coordinate' (tell it the allowed CPUs "
            "through its socket), 'report' (only report the conflict) or 'ignore'."
        ),
    )
    report_only: StrictBool = Field(
        default=False,
        description="Report what would change and change nothing.",
    )


def _refs(cfg: Config) -> list[Ref]:
    return [(f"irq.{k}", getattr(cfg, k), True) for k in SET_KEYS]


TABLE = Table(
    key="irq",
    model=Config,
    summary="IRQ affinity.",
    manual=__doc__ or "",
    position=30,
    tuner="gputuned.tuners.irq:IrqTuner",
    plan_rank=40,
    refs=_refs,
)
