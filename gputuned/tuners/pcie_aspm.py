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

from gputuned.engine.changes import Change, PlanContext, Refusal, TunerPlan
from gputuned.kernel.pci import ASPM_POLICY


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


#: Per-link ASPM state files a "disable" clears (drivers/pci/pcie/aspm.c aspm_ctrl_attrs).
_LINK_STATES = ("l0s_aspm", "l1_aspm", "l1_1_aspm", "l1_2_aspm")
#: Ports on the lower end of a link: their link/ files control the link to their parent.
_LOWER_END = ("endpoint", "legacy-endpoint", "upstream-port", "pcie-to-pci-bridge")


class PcieAspmTuner:
    """Global ASPM policy and the per-link ASPM states on the GPUs' paths."""

    name = "pcie_aspm"

    def plan(self, ctx: PlanContext) -> TunerPlan:
        cfg = ctx.profile.pcie_aspm
        out = TunerPlan()
        if cfg is None:
            return out
        pol = ctx.snap.aspm
        if cfg.policy != "keep":
            if pol.value != cfg.policy and pol.writable is False:
                out.refused.append(Refusal(self.name, "policy", f"not possible here: {pol.reason}"))
            else:
                if pol.value != cfg.policy and pol.writable is None:
                    out.notes.append(f"pcie_aspm: policy writability unknown: {pol.reason}")
                out.changes.append(
                    Change(
                        self.name,
                        "policy",
                        str(pol.value),
                        cfg.policy,
                        "profile pcie_aspm.policy",
                        ASPM_POLICY,
                        cfg.report_only,
                        compare="policy",
                        in_sync=pol.value == cfg.policy,
                    )
                )
        if cfg.gpu_links == "disable":
            self._plan_links(ctx, out, cfg.report_only)
        return out

    def _plan_links(self, ctx: PlanContext, out: TunerPlan, report_only: bool) -> None:
        topo = ctx.snap.topo
        seen: set[str] = set()
        for gpu in topo.gpus():
            for dev in topo.path(gpu.bdf):
                pcie = dev.config.pcie
                if dev.bdf not in seen and dev.unusable is not None and dev.link_aspm:
                    seen.add(dev.bdf)
                    reason = f"{dev.unusable}; its link is left as it is"
                    out.refused.append(Refusal(self.name, f"{dev.bdf} link", reason))
                    continue
                if dev.bdf in seen or pcie is None or pcie.port_type_name not in _LOWER_END:
                    continue
                seen.add(dev.bdf)
                if not dev.link_aspm:
                    if pcie.aspm_enabled:
                        out.refused.append(
                            Refusal(
                                self.name,
                                f"{dev.bdf} link",
                                f"ASPM {'+'.join(pcie.aspm_enabled)} is on but the kernel offers "
                                f"no per-link controls here: {ctx.snap.aspm.reason}",
                            )
                        )
                    continue
                for state in _LINK_STATES:
                    if state not in dev.link_aspm:
                        continue
                    out.changes.append(
                        Change(
                            self.name,
                            f"{dev.bdf} link {state}",
                            dev.link_aspm[state],
                            "0",
                            f"pcie_aspm.gpu_links = disable (on the path of GPU {gpu.bdf})",
                            f"{dev.sysfs}/link/{state}",
                            report_only,
                            in_sync=dev.link_aspm[state] == "0",
                        )
                    )
