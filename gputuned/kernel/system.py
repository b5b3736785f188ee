"""CPUs, NUMA nodes, IRQs and cgroup layout as the kernel shows them under /sys and /proc."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gputuned import errors
from gputuned.cpulist import parse_cpulist, parse_mask
from gputuned.kernel import Kernel
from gputuned.kernel.irqs import DEFAULT_AFFINITY, read_affinity
from gputuned.kernel.nvml import NvmlGpu
from gputuned.kernel.pci import DEVICES, PciTopology
from gputuned.kernel.topology import GpuRef, HostCpus

CPU_DIR = "/sys/devices/system/cpu"
NODE_DIR = "/sys/devices/system/node"
CGROUP_MNT = "/sys/fs/cgroup"


def read_host_cpus(kernel: Kernel, topo: PciTopology, nvml: list[NvmlGpu] | None) -> HostCpus:
    """Online CPUs, NUMA nodes and GPUs (NVML order when NVML answered, else BDF order)."""
    online = parse_cpulist(kernel.read_value(f"{CPU_DIR}/online"))
    numa: dict[int, frozenset[int]] = {}
    if kernel.is_dir(NODE_DIR):
        for name in kernel.listdir(NODE_DIR):
            m = re.fullmatch(r"node(\d+)", name)
            if m:
                numa[int(m.group(1))] = parse_cpulist(
                    kernel.read_value(f"{NODE_DIR}/{name}/cpulist")
                )
    # Indexes count the GPUs a profile skips too, so the others keep theirs (NVML's).
    gpus = topo.gpus(skipped=True)
    names: dict[str, tuple[int, str]] = {}
    if nvml:
        names = {g.bdf: (g.index, g.name) for g in nvml}
        gpus.sort(key=lambda d: names.get(d.bdf, (1 << 30, ""))[0])
    refs = tuple(
        GpuRef(
            index=i,
            bdf=d.bdf,
            numa_node=d.numa_node,
            local_cpus=(d.local_cpus or online) & online,
            name=names.get(d.bdf, (i, ""))[1],
        )
        for i, d in enumerate(gpus)
        if d.bdf not in topo.skip
    )
    return HostCpus(
        online=online,
        numa=numa,
        gpus=refs,
        smt=read_smt(kernel, online),
        isolated=parse_cpulist(kernel.read_optional(f"{CPU_DIR}/isolated") or ""),
        # Without nohz_full= on the command line the file reads "(null)" (kernel 6.12).
        nohz_full=parse_cpulist(
            (kernel.read_optional(f"{CPU_DIR}/nohz_full") or "").replace("(null)", "")
        ),
    )


def read_smt(kernel: Kernel, online: frozenset[int]) -> tuple[frozenset[int], ...]:
    """Each core's CPUs, from ``cpuN/topology/thread_siblings_list`` (drivers/base/topology.c).

    One read per core: a CPU already listed as a sibling is not read again. Empty when no CPU
    has the file (a tree or kernel without it): callers then treat each CPU as a core.
    """
    cores: list[frozenset[int]] = []
    seen: set[int] = set()
    for cpu in sorted(online):
        if cpu in seen:
            continue
        raw = kernel.read_optional(f"{CPU_DIR}/cpu{cpu}/topology/thread_siblings_list")
        if raw is None:
            continue
        core = (parse_cpulist(raw) & online) | {cpu}
        cores.append(frozenset(core))
        seen |= core
    return tuple(cores)


def read_irq_nodes(kernel: Kernel) -> dict[int, int]:
    """IRQ number -> NUMA node of the PCI function that owns it (its MSI/MSI-X vectors in
    ``msi_irqs/`` and its INTx line in ``irq``), for functions with a node. Read from sysfs
    attributes only, without config space."""
    out: dict[int, int] = {}
    try:
        names = kernel.listdir(DEVICES)
    except errors.TargetGone:
        return out
    for bdf in sorted(names):
        base = f"{DEVICES}/{bdf}"
        node = kernel.read_optional(f"{base}/numa_node")
        if node is None or not node.strip().lstrip("-").isdigit() or int(node) < 0:
            continue
        irqs = [kernel.read_optional(f"{base}/irq") or ""]
        if kernel.is_dir(f"{base}/msi_irqs"):
            irqs += kernel.listdir(f"{base}/msi_irqs")
        for n in irqs:
            if n.strip().isdigit() and int(n) > 0:
                out.setdefault(int(n), int(node))
    return out


@dataclass(frozen=True)
class Irq:
    """One line of /proc/interrupts with a number, and its affinity."""

    irq: int
    chip: str
    name: str  # the action names, e.g. "nvidia" or "virtio0-requests.0"
    affinity: frozenset[int] | None
    counts: tuple[int, ...]


def read_interrupts(kernel: Kernel) -> list[Irq]:
    """Numbered IRQs from /proc/interrupts (kernel/irq/proc.c show_interrupts)."""
    text = kernel.read_text("/proc/interrupts")
    lines = text.splitlines()
    if not lines:
        return []
    ncpu = len(lines[0].split())
    out = []
    for line in lines[1:]:
        head, _, rest = line.partition(":")
        if not head.strip().isdigit():
            continue
        fields = rest.split()
        counts = tuple(int(x) for x in fields[:ncpu] if x.isdigit())
        tail = fields[len(counts) :]
        irq = int(head)
        chip = tail[0] if tail else ""
        name = " ".join(tail[2:]) if len(tail) > 2 else ""
        out.append(Irq(irq, chip, name, read_affinity(kernel, irq), counts))
    return out


def read_default_affinity(kernel: Kernel) -> frozenset[int] | None:
    raw = kernel.read_optional(DEFAULT_AFFINITY)
    return parse_mask(raw) if raw is not None else None


@dataclass(frozen=True)
class CgroupLayout:
    """Which cgroup hierarchy the host runs and whether v2 cpuset partitions are possible."""

    mode: str  # "v2", "hybrid", "v1" or "none"
    v2_mount: str | None
    v2_controllers: frozenset[str]
    v2_subtree: frozenset[str]

    @property
    def partitions_possible(self) -> bool:
        return self.mode == "v2" and "cpuset" in self.v2_controllers

    @property
    def why_no_partitions(self) -> str:
        if self.partitions_possible:
            return ""
        if self.mode in ("v1", "hybrid"):
            return (
                f"cgroup {self.mode} host: the cpuset controller is on cgroup v1, where "
                "partitions do not exist; boot with systemd.unified_cgroup_hierarchy=1 for v2"
            )
        if self.mode == "v2":
            return "cgroup v2 without the cpuset controller (not in cgroup.controllers)"
        return "no cgroup filesystem mounted"


def read_cgroup_layout(kernel: Kernel) -> CgroupLayout:
    """Read /proc/mounts: a cgroup2 mount at /sys/fs/cgroup is v2; v1 mounts beside it, hybrid."""
    try:
        mounts = kernel.read_text("/proc/mounts").splitlines()
    except errors.TargetGone:
        mounts = []
    v1 = False
    v2_mount = None
    for line in mounts:
        f = line.split()
        if len(f) < 3:
            continue
        if f[2] == "cgroup2":
            v2_mount = f[1] if v2_mount is None or f[1] == CGROUP_MNT else v2_mount
        elif f[2] == "cgroup":
            v1 = True
    if v2_mount is None:
        return CgroupLayout("v1" if v1 else "none", None, frozenset(), frozenset())
    ctrl = kernel.read_optional(f"{v2_mount}/cgroup.controllers") or ""
    sub = kernel.read_optional(f"{v2_mount}/cgroup.subtree_control") or ""
    return CgroupLayout(
        "hybrid" if v1 else "v2", v2_mount, frozenset(ctrl.split()), frozenset(sub.split())
    )


def cgroup_cpus(kernel: Kernel, mount: str, cgroup: str) -> frozenset[int] | None:
    """CPUs a cgroup v2 cgroup lets its tasks use: its cpuset.cpus.effective, or that of the
    nearest ancestor with one (a cgroup without the cpuset controller enabled shares its
    parent's cpuset, and has no cpuset files of its own). None without any cpuset file."""
    parts = [p for p in cgroup.split("/") if p]
    while True:
        raw = kernel.read_optional("/".join([mount.rstrip("/"), *parts, "cpuset.cpus.effective"]))
        if raw is not None:
            return parse_cpulist(raw)
        if not parts:
            return None
        parts.pop()


def has_exclusive_cpus(kernel: Kernel, mount: str, group: str | None = None) -> bool:
    """Whether this kernel has cpuset.cpus.exclusive (Linux 6.7+, and with it remote
    partitions): look at ``group`` (a cgroup directory), else the root and its children."""
    if group is not None:
        return kernel.exists(f"{group}/cpuset.cpus.exclusive")
    # cpuset.cpus.isolated, in the root cgroup, came with the same cpuset rework (6.7+); it is
    # there even before any child has the cpuset controller enabled.
    if kernel.exists(f"{mount}/cpuset.cpus.isolated"):
        return True
    try:
        names = kernel.listdir(mount)
    except errors.HostError:
        return False
    return any(
        kernel.exists(f"{mount}/{name}/cpuset.cpus.exclusive")
        for name in names
        if kernel.is_dir(f"{mount}/{name}")
    )


def nearest_cgroup(kernel: Kernel, mount: str, cgroup: str) -> str:
    """``cgroup`` (a path as /proc/PID/cgroup shows it) if it still exists under the cgroup v2
    ``mount``, else its nearest existing ancestor ("/" at the end): where a process goes back
    to when the cgroup it came from was removed meanwhile (a unit restarted, a container gone).
    """
    parts = [p for p in cgroup.split("/") if p]
    while parts and not kernel.is_dir("/".join([mount, *parts])):
        parts.pop()
    return "/" + "/".join(parts)


@dataclass(frozen=True)
class Partition:
    """A valid cgroup v2 cpuset partition and the CPUs it holds."""

    cgroup: str  # relative to the cgroup v2 mount, e.g. "batch/pinned"
    kind: str  # "root" or "isolated"
    cpus: frozenset[int]


def valid_partitions(kernel: Kernel, mount: str) -> list[Partition]:
    """Every valid cpuset partition under the cgroup v2 mount ``mount``, with its CPUs.

    A partition holds its ``cpuset.cpus.exclusive.effective`` (Linux 6.7+), else (older
    kernels) its ``cpuset.cpus.effective``; a partition inside it is listed on its own. Remote
    partitions can sit at any depth, so the whole tree is walked, but only where the parent
    enables cpuset in ``cgroup.subtree_control``: no other cgroup has cpuset files.
    An invalid partition ("root invalid (...)") holds nothing and is not listed.
    """
    out: list[Partition] = []
    todo = [""]
    while todo:
        rel = todo.pop()
        base = f"{mount}/{rel}" if rel else mount
        if "cpuset" not in (kernel.read_optional(f"{base}/cgroup.subtree_control") or "").split():
            continue
        try:
            names = kernel.listdir(base)
        except errors.TargetGone:
            continue  # removed while we looked
        for name in names:
            path = f"{base}/{name}"
            if not kernel.is_dir(path):
                continue
            child = f"{rel}/{name}" if rel else name
            todo.append(child)
            words = (kernel.read_optional(f"{path}/cpuset.cpus.partition") or "").split()
            if not words or words[0] not in ("root", "isolated") or "invalid" in words:
                continue
            held = kernel.read_optional(f"{path}/cpuset.cpus.exclusive.effective") or (
                kernel.read_optional(f"{path}/cpuset.cpus.effective") or ""
            )
            out.append(Partition(child, words[0], parse_cpulist(held)))
    return sorted(out, key=lambda p: p.cgroup)
