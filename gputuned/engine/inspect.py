"""``gputunectl inspect``: PCIe links, payload sizes, ASPM and IRQs of each GPU."""

from __future__ import annotations

from typing import Any

from gputuned.cpulist import format_cpulist
from gputuned.engine.layout import topology_report
from gputuned.kernel import Kernel
from gputuned.kernel.nvml import NvmlGpu
from gputuned.kernel.pci import PciDevice, PciTopology
from gputuned.kernel.pciconfig import NOT_RESPONDING
from gputuned.kernel.snapshot import snapshot
from gputuned.kernel.system import read_host_cpus


def link_findings(dev: PciDevice, busy: bool | None) -> list[dict[str, str]]:
    """Width below capability is a fault; speed below it is one only while the GPU is busy.

    GPUs drop link speed when idle to save power (ASPM aside, the driver retrains to a lower
    rate), so a low LnkSta speed at idle is normal; lost lanes never are.
    """
    pcie = dev.config.pcie
    if pcie is None or not pcie.has_link:
        return []
    out = []
    if pcie.width is not None and pcie.cap_width and pcie.width < pcie.cap_width:
        out.append(
            {
                "level": "fault",
                "message": f"link trained at x{pcie.width} of x{pcie.cap_width}: lanes are lost "
                "(reseat the card, check the slot, riser or cable)",
            }
        )
    if pcie.speed_gts and pcie.cap_speed_gts and pcie.speed_gts < pcie.cap_speed_gts:
        msg = f"link at {pcie.speed_gts:g} GT/s of {pcie.cap_speed_gts:g} GT/s"
        if busy:
            out.append({"level": "fault", "message": msg + " while the GPU is busy"})
        else:
            out.append({"level": "note", "message": msg + ": may be idle downclocking"})
    return out


def register_findings(dev: PciDevice, topo: PciTopology) -> list[dict[str, str]]:
    """Every field of ``dev`` and of the functions above it that could not be read, by name:
    their MPS bounds this one's, so an unknown value there makes this one's unknown too."""
    out = []
    for d in topo.path(dev.bdf) or [dev]:
        who = "" if d.bdf == dev.bdf else f"{d.bdf} "
        for name, why in d.config.unreadable:
            if d.config.state == NOT_RESPONDING:
                out.append({"level": "fault", "message": f"{who}not responding: {why}"})
            else:
                out.append({"level": "unreadable", "message": f"{who}{name} unreadable: {why}"})
    return out


def device_report(dev: PciDevice, topo: PciTopology, nvml: NvmlGpu | None) -> dict[str, Any]:
    pcie = dev.config.pcie
    report: dict[str, Any] = {
        "bdf": dev.bdf,
        "vendor": f"0x{dev.vendor:04x}",
        "device": f"0x{dev.device:04x}",
        "class": f"0x{dev.class_code:06x}",
        "gpu": dev.is_gpu,
        "name": nvml.name if nvml else None,
        "driver": dev.driver,
        "port_type": pcie.port_type_name if pcie else None,
        "numa_node": dev.numa_node,
        "local_cpus": format_cpulist(dev.local_cpus) if dev.local_cpus is not None else None,
        "path": [d.bdf for d in topo.path(dev.bdf)],
        "link": None,
        "mps": None,
        "mrrs": None,
        "aspm": None,
        "irqs": [
            {
                "irq": i.irq,
                "affinity": format_cpulist(i.affinity) if i.affinity is not None else None,
            }
            for i in dev.irqs
        ],
        "utilization_gpu": nvml.utilization_gpu if nvml else None,
        "findings": register_findings(dev, topo),
    }
    if pcie is not None:
        report["mps"] = {
            "supported": pcie.mps_supported,
            "current": pcie.mps,
            "path_max": topo.path_max_mps(dev.bdf),
        }
        report["mrrs"] = pcie.mrrs
        if pcie.has_link:
            report["link"] = {
                "cap_speed_gts": pcie.cap_speed_gts,
                "cap_width": pcie.cap_width,
                "speed_gts": pcie.speed_gts,
                "width": pcie.width,
            }
            report["aspm"] = {
                "supported": list(pcie.aspm_supported),
                "enabled": list(pcie.aspm_enabled),
                "link_files": dict(dev.link_aspm),
            }
        busy = (nvml.utilization_gpu or 0) > 0 if nvml else None
        report["findings"] += link_findings(dev, busy)
    return report


def inspect(kernel: Kernel, *, all_functions: bool = False) -> dict[str, Any]:
    snap = snapshot(kernel)
    by_bdf = {g.bdf: g for g in snap.nvml or []}
    devs = snap.topo.reported_functions() if all_functions else snap.topo.gpus()
    return {
        "root": str(kernel.root),
        "nvml": snap.nvml is not None,
        "aspm_policy": {
            "value": snap.aspm.value,
            "choices": list(snap.aspm.choices),
            "writable": snap.aspm.writable,
            "reason": snap.aspm.reason,
        },
        "devices": [device_report(d, snap.topo, by_bdf.get(d.bdf)) for d in devs],
        "gpu_count": len(snap.topo.gpus()),
        "topology": topology_report(read_host_cpus(kernel, snap.topo, snap.nvml), snap.nvml),
    }
