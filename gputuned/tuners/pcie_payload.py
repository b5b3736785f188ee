"""Plans the `[pcie_payload]` table (its keys and manual: gputuned/profile/tables/pcie_payload.py):
MPS and MRRS in each Device Control register on the GPUs' paths, within DevCap."""

from __future__ import annotations

from collections.abc import Sequence

from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.kernel.pci import PciDevice
from gputuned.kernel.pciconfig import DEVCTL, MRRS_CONTROL, payload_code
from gputuned.profile.tables.pcie_payload import Config
from gputuned.tuners.context import PlanContext

#: DevCtl fields (PCIe r6.0 7.5.3.4): Max_Payload_Size bits 7:5, Max_Read_Request_Size 14:12.
MPS_FIELD = (0x00E0, 5)
MRRS_FIELD = (0x7000, 12)


def field_change(
    tuner: str,
    dev: PciDevice,
    what: str,
    field: tuple[int, int],
    have: int,
    want: int,
    why: str,
    report_only: bool,
) -> Change:
    """A DevCtl field write: read-modify-write of one 16-bit register, only the field's bits."""
    assert dev.config.pcie is not None
    mask, shift = field
    return Change(
        tuner,
        f"{dev.bdf} {what}",
        str(have),
        str(want),
        why,
        f"{dev.sysfs}/config",
        report_only,
        key=f"pcie:{dev.bdf}:{what}",
        kind="pcie",
        data={
            "offset": dev.config.pcie.offset + DEVCTL,
            "mask": mask,
            "shift": shift,
            "value": payload_code(want),
            "bdf": dev.bdf,
        },
    )  # fmt: skip


class PciePayloadTuner:
    """MRRS per GPU; MPS along the whole hierarchy under the GPU's root port, opt-in only."""

    name = "pcie_payload"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        cfg = ctx.profile.pcie_payload
        out = TunerPlan()
        if cfg is None:
            return out
        busy = {g.bdf: g.pids for g in ctx.snap.nvml or [] if g.pids}
        for gpu in ctx.snap.topo.gpus():
            pcie = gpu.config.pcie
            wanted = [w for w, v in (("MRRS", cfg.mrrs), ("MPS", cfg.mps)) if v != "keep"]
            if gpu.unusable is not None:
                # A GPU that does not answer (or whose registers this user cannot read) keeps
                # what it has: nothing here is known, so nothing is planned as a placeholder.
                for what in wanted:
                    reason = f"{gpu.unusable}; left as it is"
                    out.refused.append(Refusal(self.name, f"{gpu.bdf} {what}", reason))
                continue
            if pcie is None:
                out.notes.append(f"pcie_payload: GPU {gpu.bdf} has no PCIe capability")
                continue
            if cfg.mrrs != "keep":
                self._plan_mrrs(gpu, int(cfg.mrrs), cfg.report_only, out)
            if cfg.mps != "keep":
                self._plan_mps(ctx, gpu, cfg, busy, out)
        return out

    def _plan_mrrs(self, gpu: PciDevice, want: int, report_only: bool, out: TunerPlan) -> None:
        assert gpu.config.pcie is not None
        have = gpu.config.pcie.mrrs
        if have is None:
            why = dict(gpu.config.unreadable)[MRRS_CONTROL]
            reason = f"{MRRS_CONTROL} unreadable ({why}); left as it is"
            out.refused.append(Refusal(self.name, f"{gpu.bdf} MRRS", reason))
            return
        why = "profile pcie_payload.mrrs (per requester; need not match the path)"
        out.changes.append(
            field_change(self.name, gpu, "MRRS", MRRS_FIELD, have, want, why, report_only)
        )

    def _plan_mps(
        self,
        ctx: PlanContext,
        gpu: PciDevice,
        cfg: Config,
        busy: dict[str, tuple[int, ...]],
        out: TunerPlan,
    ) -> None:
        topo = ctx.snap.topo
        target = f"{gpu.bdf} MPS"
        path = topo.path(gpu.bdf)
        unknown = topo.mps_unreadable(topo.subtree(path[-1].bdf))
        if unknown:
            # MPS must match across the whole hierarchy: one value that cannot be read makes
            # every choice a guess, and a wrong guess makes receivers drop TLPs.
            reason = f"{'; '.join(unknown)}: MPS is left as it is under root port {path[-1].bdf}"
            out.refused.append(Refusal(self.name, target, reason))
            return
        path_max = topo.path_max_mps(gpu.bdf) or 128
        tree_max = topo.hierarchy_max_mps(gpu.bdf) or 128
        want = tree_max if cfg.mps == "max-safe" else int(cfg.mps)
        if want > path_max:
            weakest = min(
                (d for d in path if d.config.pcie),
                key=lambda d: d.config.pcie.mps_supported or 4096 if d.config.pcie else 4096,
            )
            out.refused.append(
                Refusal(
                    self.name,
                    target,
                    f"MPS {want} is above the path's minimum DevCap MPS {path_max} "
                    f"({weakest.bdf} supports {path_max}): a receiver drops larger TLPs as malformed",
                )
            )
            return
        if want > tree_max:
            out.refused.append(
                Refusal(
                    self.name,
                    target,
                    f"MPS {want} is above {tree_max}, the smallest DevCap MPS under this GPU's root "
                    "port: the shared ports above it also carry its siblings' traffic",
                )
            )
            return
        if cfg.mps == "max-safe" and tree_max < path_max:
            out.notes.append(
                f"pcie_payload: {gpu.bdf}: max-safe MPS is {tree_max}, not the path's {path_max}: "
                "a device elsewhere under the same root port supports only that"
            )
        root = topo.path(gpu.bdf)[-1]
        tree = [d for d in topo.subtree(root.bdf) if d.config.pcie]
        todo = [d for d in tree if d.config.pcie and d.config.pcie.mps != want]
        if todo and not cfg.allow_mps_change:
            out.refused.append(
                Refusal(
                    self.name,
                    target,
                    f"MPS would change to {want} on {len(todo)} function(s) under root port "
                    f"{root.bdf}; set pcie_payload.allow_mps_change = true to allow it",
                )
            )
            return
        # The ports whose MPS changes carry the DMA of every GPU below them: one GPU in use
        # anywhere under the root port keeps MPS as it is for all of them.
        users = [(d.bdf, pid) for d in tree for pid in busy.get(d.bdf, ())]
        if todo and users:
            pids = ", ".join(str(p) if b == gpu.bdf else f"{p} (on {b})" for b, p in users)
            out.refused.append(
                Refusal(
                    self.name,
                    target,
                    f"GPU in use by PID(s) {pids}: MPS changes only on an idle GPU",
                )
            )
            return
        # Raising: ports nearest the root first, so the GPU (the big DMA writer) sends larger
        # TLPs only once everything above accepts them; lowering: the reverse.
        depth = {d.bdf: len(topo.path(d.bdf)) for d in tree}
        raising = want > ((gpu.config.pcie.mps if gpu.config.pcie else None) or want)
        tree.sort(key=lambda d: (depth[d.bdf], d.bdf), reverse=not raising)
        why = "profile pcie_payload.mps; one value under the whole root port (pcie_bus_safe rule)"
        for d in tree:
            assert d.config.pcie is not None
            if any(c.key == f"pcie:{d.bdf}:MPS" for c in out.changes):
                continue  # a sibling GPU under the same root port planned it already
            have = d.config.pcie.mps
            assert have is not None  # mps_unreadable() above refused the tree otherwise
            out.changes.append(
                field_change(self.name, d, "MPS", MPS_FIELD, have, want, why, cfg.report_only)
            )
