"""PCIe payload sizes: Max Payload Size (MPS) and Max Read Request Size (MRRS) on GPU paths.

Both live in each device's Device Control register (PCIe capability +0x08: MPS in bits 7:5,
MRRS in bits 14:12, encoded 0..5 = 128..4096 bytes). The kernel sets them at enumeration
(`pci=pcie_bus_safe|perf|peer2peer|tune_off`); this tuner reads them from config space and
plans only real differences.

- MRRS is the largest read one requester may ask for. It is per device and need not match
  anything along the path, so raising it on the GPU is safe; larger reads mean fewer request
  TLPs for the same transfer.
- MPS is the largest write or completion payload. It must match on both ends of every link from
  the root port to the GPU: a receiver drops larger TLPs as malformed (AER errors, possibly the
  device lost). The highest safe value is the minimum of the DevCap MPS (PCIe capability +0x04,
  bits 2:0) over the whole path, which `mps = "max-safe"` computes. Because a wrong MPS takes a
  GPU off the bus, gputuned changes MPS only with `allow_mps_change = true`; otherwise it reports
  the difference and leaves MPS as the kernel set it.

The kernel keeps its own copy of Device Control and writes it back after a reset, FLR, AER
recovery or resume, so a change can silently disappear: verify notices it and the daemon
applies it again.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

from gputuned.profile.tables import Table

#: Sizes the 3-bit MPS and MRRS fields encode (0..5); 6 and 7 are reserved.
SIZES = (128, 256, 512, 1024, 2048, 4096)


_SIZES_TEXT = "a size in bytes: 128, 256, 512, 1024, 2048 or 4096"


def _size(words: tuple[str, ...]) -> BeforeValidator:
    def check(value: object) -> object:
        if isinstance(value, str) and value in words:
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value in SIZES:
            return value
        shown = "true" if value is True else "false" if value is False else repr(value)
        allowed = ", ".join(repr(w) for w in words)
        raise ValueError(f"{shown} is not allowed; use {allowed} or {_SIZES_TEXT}")

    return BeforeValidator(check)


class Config(BaseModel):
    """The `[pcie_payload]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mps: Annotated[
        Literal["keep", "max-safe", 128, 256, 512, 1024, 2048, 4096], _size(("keep", "max-safe"))
    ] = Field(
        default="keep",
        description=(
            "Max Payload Size for the GPUs' paths: 'keep', 'max-safe' (the smallest DevCap MPS "
            "over the path) or bytes (128..4096, a power of two). Written only with "
            "allow_mps_change = true."
        ),
    )
    mrrs: Annotated[Literal["keep", 128, 256, 512, 1024, 2048, 4096], _size(("keep",))] = Field(
        default="keep",
        description="Max Read Request Size of each GPU: 'keep' or bytes (128..4096, power of two).",
    )
    allow_mps_change: StrictBool = Field(
        default=False,
        description=(
            "Allow writing MPS. A mismatched MPS makes devices drop TLPs, so without this the "
            "MPS difference is only reported."
        ),
    )
    report_only: StrictBool = Field(
        default=False,
        description="Report what would change and change nothing.",
    )


TABLE = Table(
    key="pcie_payload",
    model=Config,
    summary="PCIe MPS and MRRS on GPU paths.",
    manual=__doc__ or "",
    position=20,
    tuner="gputuned.tuners.pcie_payload:PciePayloadTuner",
    plan_rank=20,
)
