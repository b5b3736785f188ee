"""PCIe ASPM: keep the GPUs' links out of low-power states.

Active State Power Management lets an idle PCIe link drop into L0s or L1 (and the L1.1/L1.2
substates). Each wake-up costs microseconds, paid on the first transfer after an idle gap: the
pattern of token-by-token decode, where the host talks to the GPU once per token.

What it changes:

- `policy`: `/sys/module/pcie_aspm/parameters/policy`, the kernel's policy for every link it
  manages. `performance` turns ASPM off everywhere; `default` restores the firmware's choice.
- `gpu_links = "disable"`: writes 0 to `l0s_aspm`, `l1_aspm`, `l1_1_aspm` and `l1_2_aspm` under
  `/sys/bus/pci/devices/<device>/link/` (Linux 5.5+) for every link on the path from each GPU up
  to its root port, and leaves other devices' links alone.

When it cannot: the policy file answers EPERM, and the per-link files are absent, when firmware
keeps ASPM for itself (FADT "ASPM unsupported", or _OSC did not grant the OS control) or the kernel
booted with `pcie_aspm=off` (drivers/pci/pcie/aspm.c). gputuned reports which of these applies;
it is a property of the platform, not a failure. To boot with ASPM disabled on every link, add
`pcie_aspm.policy=performance` to `[bootargs] extra`.

Not ASPM: an idle GPU lowers its link speed by itself (LnkSta speed below LnkCap); that is normal
and comes back under load. A link narrower than its capability is a hardware fault.

Revert writes back the policy and the per-link values recorded in the journal.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from gputuned.profile.tables import Table


class Config(BaseModel):
    """The `[pcie_aspm]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["keep", "default", "performance", "powersave", "powersupersave"] = Field(
        default="keep",
        description=(
            "Kernel-wide ASPM policy written to /sys/module/pcie_aspm/parameters/policy. "
            "'performance' disables ASPM on every link the kernel manages; 'keep' leaves it."
        ),
    )
    gpu_links: Literal["keep", "disable"] = Field(
        default="keep",
        description=(
            "'disable' clears l0s_aspm, l1_aspm, l1_1_aspm and l1_2_aspm on every link between "
            "a GPU and its root port (Linux 5.5+); 'keep' leaves the links alone."
        ),
    )
    report_only: StrictBool = Field(
        default=False,
        description="Report what would change and change nothing.",
    )


TABLE = Table(
    key="pcie_aspm",
    model=Config,
    summary="PCIe ASPM on GPU links.",
    manual=__doc__ or "",
    position=10,
    tuner="gputuned.tuners.pcie_aspm:PcieAspmTuner",
    plan_rank=10,
)
