"""PCI devices as sysfs shows them: config space, path to the root port, NUMA, IRQs, ASPM.

sysfs layout (Documentation/ABI/testing/sysfs-bus-pci): ``/sys/bus/pci/devices/<BDF>`` links to
``/sys/devices/pci<domain>:<bus>/<BDF of root port>/.../<BDF>``; the directory chain is the PCI
hierarchy, so the path from an endpoint to its root port is read off the resolved directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gputuned import errors
from gputuned.cpulist import parse_cpulist
from gputuned.kernel import Kernel
from gputuned.kernel.irqs import read_affinity
from gputuned.kernel.pciconfig import (
    MPS_CONTROL,
    MPS_SUPPORTED,
    NOT_RESPONDING,
    OK,
    SHORT,
    ConfigSpace,
    parse_config,
    read_registers,
)

DEVICES = "/sys/bus/pci/devices"
ASPM_POLICY = "/sys/module/pcie_aspm/parameters/policy"
#: Per-link ASPM attributes (drivers/pci/pcie/aspm.c, Linux 5.5+), under <device>/link/.
LINK_ASPM_FILES = (
    "clkpm",
    "l0s_aspm",
    "l1_aspm",
    "l1_1_aspm",
    "l1_2_aspm",
    "l1_1_pcipm",
    "l1_2_pcipm",
)

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
GPU_VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD"}
#: Class 03 (display controller) subclasses: 00 VGA, 02 3D controller (most datacentre GPUs),
#: 80 other (AMD Instinct). Subclass 01 is XGA.
_VGA, _3D, _OTHER = 0x0300, 0x0302, 0x0380
#: Drivers that make a GPU vendor's function no inference GPU of this host: no CUDA or ROCm
#: (radeon, nouveau), or passed to a virtual machine (vfio-pci, pci-stub). Any other driver
#: (nvidia, amdgpu, one this list does not know) leaves the vendor and class to decide.
NO_INFERENCE_DRIVERS = frozenset({"radeon", "nouveau", "vfio-pci", "pci-stub"})
#: Display-only chips of a GPU vendor, by (vendor, device): a server's onboard VGA beside its
#: BMC. The AMD ES1000 (a Radeon 7000 / Rage-class core) is on many Dell, HP and IBM boards.
DISPLAY_ONLY = frozenset({(0x1002, 0x515E), (0x1002, 0x5159), (0x1002, 0x4752)})


def is_inference_gpu(vendor: int, device: int, class_code: int, driver: str | None) -> bool:
    """Whether a PCI function can run inference: docs/multi-gpu.md, "What counts as a GPU".

    A display controller (class 03: VGA, 3D or other) of NVIDIA or AMD; never a known
    display-only chip (the ES1000 beside a BMC); and not bound to a driver that runs no
    inference (radeon, nouveau: no CUDA or ROCm) or passes it to a virtual machine (vfio-pci,
    pci-stub). With no driver bound (a captured tree, or before the driver loads), or another
    one, the vendor, device and class decide.
    """
    sub = class_code >> 8
    if vendor not in GPU_VENDORS or sub not in (_VGA, _3D, _OTHER):
        return False
    if (vendor, device) in DISPLAY_ONLY:
        return False
    return driver not in NO_INFERENCE_DRIVERS


@dataclass(frozen=True)
class IrqInfo:
    irq: int
    affinity: frozenset[int] | None  # None: no /proc/irq/N (not yet requested)


@dataclass(frozen=True)
class PciDevice:
    """One PCI function with what gputuned needs to know about it."""

    bdf: str
    sysfs: str  # resolved host path of the device directory
    config: ConfigSpace
    numa_node: int | None
    local_cpus: frozenset[int] | None
    parent: str | None  # BDF of the upstream bridge, None at a root bus
    driver: str | None
    irqs: tuple[IrqInfo, ...]
    link_aspm: dict[str, str] = field(default_factory=dict)  # per-link ASPM files present
    #: (vendor, device, class) from sysfs: read from config space once, at enumeration, and
    #: cached by the kernel. They still name a device whose config space no longer answers.
    sysfs_ids: tuple[int, int, int] | None = None

    def _ids(self) -> tuple[int, int, int]:
        cfg = self.config
        if cfg.state in (NOT_RESPONDING, SHORT) and self.sysfs_ids is not None:
            return self.sysfs_ids
        return cfg.vendor, cfg.device, cfg.class_code

    @property
    def vendor(self) -> int:
        return self._ids()[0]

    @property
    def device(self) -> int:
        return self._ids()[1]

    @property
    def class_code(self) -> int:
        return self._ids()[2]

    @property
    def is_gpu(self) -> bool:
        """An inference GPU (:func:`is_inference_gpu`), not any display controller."""
        return is_inference_gpu(self.vendor, self.device, self.class_code, self.driver)

    @property
    def unusable(self) -> str | None:
        """Why this function's registers cannot be used at all (None: they can)."""
        if self.config.state == OK:
            return None
        why = self.config.unreadable[0][1]
        return f"not responding: {why}" if self.config.state == NOT_RESPONDING else why


@dataclass(frozen=True)
class AspmPolicy:
    """The global ASPM policy and whether the OS may change it, with the reason if not."""

    value: str | None
    choices: tuple[str, ...]
    writable: bool | None  # None: unknown until a write is tried
    reason: str


@dataclass(frozen=True)
class PciTopology:
    devices: dict[str, PciDevice]
    #: GPUs a profile leaves alone ([gpus] skip): not in :meth:`gpus`, so nothing is planned
    #: for them as GPUs; they stay functions of the tree (their path's MPS, inspect).
    skip: frozenset[str] = frozenset()

    def path(self, bdf: str) -> list[PciDevice]:
        """Functions from ``bdf`` up to its root port (or to the root bus), endpoint first."""
        out: list[PciDevice] = []
        cur: str | None = bdf
        while cur is not None and cur in self.devices:
            out.append(self.devices[cur])
            cur = self.devices[cur].parent
        return out

    def path_max_mps(self, bdf: str) -> int | None:
        """Highest MPS every function on the path supports: the minimum DevCap MPS.

        A receiver treats a TLP larger than its MPS as malformed (PCIe r6.0 2.2.2), so one
        setting must fit every hop from the root port down (cf. pcie_bus_safe in
        drivers/pci/probe.c). None when no function has a PCIe capability, or when one
        function's DevCap is unreadable (see :meth:`mps_unreadable`): the minimum is unknown.
        """
        return _min_mps(self.path(bdf))

    def subtree(self, bdf: str) -> list[PciDevice]:
        """``bdf`` and every function below it."""
        return [d for d in self.devices.values() if any(p.bdf == bdf for p in self.path(d.bdf))]

    def hierarchy_max_mps(self, bdf: str) -> int | None:
        """Highest MPS usable anywhere under ``bdf``'s root port: the minimum over that tree.

        Bridges on a GPU's path also forward TLPs to the GPU's siblings, so a shared port can
        only run the smallest MPS of any device below it (the kernel's pcie_bus_safe rule).
        """
        path = self.path(bdf)
        if not path:
            return None
        return _min_mps(self.subtree(path[-1].bdf))

    def mps_unreadable(self, devices: list[PciDevice]) -> list[str]:
        """'BDF field: why' for each of ``devices`` whose MPS cannot be read: MPS must match
        across them, and one unknown value makes any choice a guess."""
        out = []
        for d in devices:
            if d.unusable is not None and (d.config.pcie is not None or d.is_gpu):
                out.append(f"{d.bdf} {d.unusable}")
            out += [
                f"{d.bdf} {name} unreadable: {why}"
                for name, why in d.config.unreadable
                if name in (MPS_SUPPORTED, MPS_CONTROL)
            ]
        return out

    def gpus(self, *, skipped: bool = False) -> list[PciDevice]:
        """The inference GPUs, without those in ``skip`` unless ``skipped``."""
        return [
            d for d in self.devices.values() if d.is_gpu and (skipped or d.bdf not in self.skip)
        ]

    def reported_functions(self) -> list[PciDevice]:
        """What ``inspect --all`` lists: every PCIe function, and every function whose config
        space could not be read in full (it may be one; what it is cannot be told)."""
        return [
            d for d in self.devices.values() if d.config.pcie is not None or d.config.unreadable
        ]


def _min_mps(devices: list[PciDevice]) -> int | None:
    caps = [d.config.pcie.mps_supported for d in devices if d.config.pcie]
    if not caps or any(c is None for c in caps):
        return None
    return min(c for c in caps if c is not None)


def scan(kernel: Kernel, *, gpu_trees_only: bool = False) -> PciTopology:
    """Read every PCI function under /sys/bus/pci/devices.

    ``gpu_trees_only``: only the functions under a GPU's root port (the GPU, its path and
    its siblings, which share the path's MPS), found from the sysfs ``vendor``, ``device`` and
    ``class`` attributes and the bound driver without touching config space. Config reads of passed-through devices trap to
    the hypervisor; on the H200 VM they were most of a plan's time.
    """
    devices: dict[str, PciDevice] = {}
    try:
        names = [n for n in kernel.listdir(DEVICES) if _BDF.match(n)]
    except errors.TargetGone:
        return PciTopology({})
    if gpu_trees_only:
        paths = {bdf: kernel.resolve(f"{DEVICES}/{bdf}") for bdf in names}
        roots = {_root_port(paths[b]) for b in names if _is_gpu_by_attrs(kernel, paths[b])}
        names = [b for b in names if _root_port(paths[b]) in roots]
    for bdf in names:
        devices[bdf] = _read_device(kernel, bdf)
    return PciTopology(devices)


def _root_port(sysfs: str) -> str:
    """The first BDF below the host bridge in a device's sysfs path (itself on a root bus)."""
    return next((p for p in sysfs.split("/") if _BDF.match(p)), sysfs)


def _is_gpu_by_attrs(kernel: Kernel, sysfs: str) -> bool:
    ids = _sysfs_ids(kernel, sysfs)
    return ids is not None and is_inference_gpu(*ids, _driver(kernel, sysfs))


def _driver(kernel: Kernel, sysfs: str) -> str | None:
    if not kernel.exists(f"{sysfs}/driver"):
        return None
    return kernel.resolve(f"{sysfs}/driver").rsplit("/", 1)[-1]


def _read_device(kernel: Kernel, bdf: str) -> PciDevice:
    sysfs = kernel.resolve(f"{DEVICES}/{bdf}")
    # Only the registers gputuned decodes, all in the standard 256 bytes: each dword read is a
    # config cycle, which under PCIe passthrough traps to the hypervisor (read_registers).
    config = parse_config(
        read_registers(lambda off, size: kernel.read_bytes(f"{sysfs}/config", off, size))
    )
    parts = sysfs.split("/")
    parent = parts[-2] if len(parts) >= 2 and _BDF.match(parts[-2]) else None
    numa_raw = kernel.read_optional(f"{sysfs}/numa_node")
    numa = int(numa_raw) if numa_raw is not None and int(numa_raw) >= 0 else None
    local_raw = kernel.read_optional(f"{sysfs}/local_cpulist")
    driver = _driver(kernel, sysfs)
    ids = None
    if config.state in (NOT_RESPONDING, SHORT):  # its IDs are not (all) in what was read
        ids = _sysfs_ids(kernel, sysfs)
    return PciDevice(
        bdf=bdf,
        sysfs=sysfs,
        config=config,
        numa_node=numa,
        local_cpus=parse_cpulist(local_raw) if local_raw is not None else None,
        parent=parent,
        driver=driver,
        irqs=tuple(read_irq(kernel, n) for n in _msi_irqs(kernel, sysfs)),
        link_aspm=_link_files(kernel, sysfs),
        sysfs_ids=ids,
    )


def _sysfs_ids(kernel: Kernel, sysfs: str) -> tuple[int, int, int] | None:
    """vendor, device and class as the kernel cached them at enumeration (sysfs attributes)."""
    vals = [kernel.read_optional(f"{sysfs}/{a}") for a in ("vendor", "device", "class")]
    try:
        return (int(vals[0] or "", 16), int(vals[1] or "", 16), int(vals[2] or "", 16))
    except ValueError:
        return None


def _msi_irqs(kernel: Kernel, sysfs: str) -> list[int]:
    if not kernel.is_dir(f"{sysfs}/msi_irqs"):
        return []
    return sorted(int(n) for n in kernel.listdir(f"{sysfs}/msi_irqs") if n.isdigit())


def _link_files(kernel: Kernel, sysfs: str) -> dict[str, str]:
    link = f"{sysfs}/link"
    if not kernel.is_dir(link):
        return {}
    out = {}
    for name in kernel.listdir(link):
        if name in LINK_ASPM_FILES:
            out[name] = kernel.read_value(f"{link}/{name}")
    return out


def read_irq(kernel: Kernel, irq: int) -> IrqInfo:
    return IrqInfo(irq, read_affinity(kernel, irq))


def read_aspm_policy(kernel: Kernel, topo: PciTopology, cmdline: str) -> AspmPolicy:
    """The ASPM policy and, from what can be read, whether the OS may change it and why not.

    The kernel refuses policy writes with EPERM when ``aspm_disabled`` is set: firmware kept
    ASPM (ACPI FADT "ASPM unsupported", or _OSC did not grant PCIe capability control) or
    ``pcie_aspm=off`` was given (drivers/pci/pcie/aspm.c, pcie_aspm_set_policy). The same flag
    hides every per-link ASPM file (aspm_ctrl_attrs_are_visible), so files present mean the OS
    owns ASPM. Nothing is written to find out: inspect, plan and verify are read-only, and as
    another user the write would fail with EACCES whoever owns ASPM (issue 14, finding 22).
    Where reading cannot tell, ``writable`` is None and apply's write decides. On a tree, the
    error recorded at capture time stands in for the kernel's answer.
    """
    raw = kernel.read_optional(ASPM_POLICY)
    if raw is None:
        return AspmPolicy(
            None, (), False, "this kernel has no PCIe ASPM support (CONFIG_PCIEASPM off)"
        )
    choices = tuple(w.strip("[]") for w in raw.split())
    m = re.search(r"\[(\w+)\]", raw)
    value = m.group(1) if m else None
    args = cmdline.split()
    if "pcie_aspm=off" in args:
        return AspmPolicy(value, choices, False, "pcie_aspm=off on the kernel command line")
    if ASPM_POLICY in kernel.recorded_refusals:
        return AspmPolicy(value, choices, False, _FIRMWARE_REASON)
    if any(d.link_aspm for d in topo.devices.values()):
        return AspmPolicy(
            value, choices, True, "the OS controls ASPM (per-link ASPM files present)"
        )
    if any(d.config.pcie and d.config.pcie.aspm_supported for d in topo.devices.values()):
        # Links that advertise ASPM but have no per-link files: either firmware kept ASPM or the
        # device sits on a root bus with no upstream port (as in many VMs), where the kernel
        # keeps no link state at all.
        return AspmPolicy(value, choices, None, _UNKNOWN_REASON)
    return AspmPolicy(value, choices, None, "no PCIe link here advertises ASPM")


_FIRMWARE_REASON = (
    "firmware owns ASPM (ACPI FADT says ASPM unsupported, or _OSC did not grant control): "
    "the kernel refuses policy writes with EPERM; change it in the BIOS/hypervisor, not here"
)
_UNKNOWN_REASON = (
    "links advertise ASPM but none has per-link ASPM files: firmware may own ASPM, or the "
    "devices sit on a root bus with no port above them; a write will tell"
)


def read_cmdline(kernel: Kernel) -> str:
    return kernel.read_optional("/proc/cmdline") or ""
