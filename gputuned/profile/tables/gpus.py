"""The `[gpus]` table: GPUs the profile leaves alone.

A GPU named in `skip`, by its PCI address as `lspci -D` or `nvidia-smi --query-gpu=pci.bus_id`
prints it (`0000:03:00.0`, either case), is not a GPU to this profile: it gets no member of a
`per = "gpu"` set, its vectors are no GPU's vectors (`[irq] others_cpus` takes them, as any
other device's), `[pcie_payload]` and `[pcie_aspm]` leave its registers, and `[[process]]`
`by_gpu` does not place by it. Use it for a GPU another tenant or a virtual machine owns, or a
display GPU that is not for inference. The other GPUs keep their indexes (a partition per GPU
keeps its name). `plan` names each GPU it skipped, and says so where an address is not a GPU
of this host (a profile moves between hosts, so that is not an error).

Which PCI functions count as GPUs at all: docs/multi-gpu.md, "What counts as a GPU".
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

from gputuned.profile.tables import Table

#: domain:bus:device.function, as sysfs names PCI functions (Documentation/ABI/testing/sysfs-bus-pci).
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


class Config(BaseModel):
    """The `[gpus]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    skip: tuple[StrictStr, ...] = Field(
        default=(),
        description="GPUs to leave alone, by PCI address ('0000:03:00.0'): no CPUs, no IRQs, no PCIe settings.",
    )

    @field_validator("skip")
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out = tuple(v.strip().lower() for v in value)
        bad = [v for v in value if not _BDF.fullmatch(v.strip().lower())]
        if bad:
            raise ValueError(
                f"{bad[0]!r} is not a PCI address: write it as lspci -D prints it, "
                "domain:bus:device.function such as '0000:03:00.0'"
            )
        return out


TABLE = Table(
    key="gpus",
    model=Config,
    summary="GPUs the profile leaves alone.",
    manual=__doc__ or "",
    position=5,
    tuner="gputuned.tuners.gpuskip:GpuSkipTuner",
    plan_rank=5,
)
