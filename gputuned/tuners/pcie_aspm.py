"""Plans the `[pcie_aspm]` table (its keys and manual: gputuned/profile/tables/pcie_aspm.py):
the ASPM policy and each GPU link's ASPM states."""

from __future__ import annotations

from collections.abc import Sequence

from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.kernel.pci import ASPM_POLICY
from gputuned.tuners.context import PlanContext

#: Per-link ASPM state files a "disable" clears (drivers/pci/pcie/aspm.c aspm_ctrl_attrs).
_LINK_STATES = ("l0s_aspm", "l1_aspm", "l1_1_aspm", "l1_2_aspm")
#: Ports on the lower end of a link: their link/ files control the link to their parent.
_LOWER_END = ("endpoint", "legacy-endpoint", "upstream-port", "pcie-to-pci-bridge")


class PcieAspmTuner:
    """Global ASPM policy and the per-link ASPM states on the GPUs' paths."""

    name = "pcie_aspm"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
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
                        )
                    )
