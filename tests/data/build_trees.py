#!/usr/bin/env python3
"""(Re)generate the host trees under tests/data/hosts/ in the layout of docs/dev/trees.md.

    python3 tests/data/build_trees.py

Six trees, each rebuilt from scratch (only these six directories are replaced):

- ``h200-vm`` and ``ci-vm``: from the captures ``shared/hosts/h200-vm.json`` and ``ci-vm.json``.
- ``dual-socket-8gpu``, ``degraded-link``, ``four-gpu-one-socket`` and ``two-gpu-one-node``:
  synthetic, assembled from real register dumps (the H200 of the capture, an Intel Xeon root
  port and a PLX switch, sources below). Every byte that differs from its source is changed by
  a named edit in this file, with the reason. The multi-GPU trees take their CPU and NUMA files
  (``cpu*/topology``, ``node*``) from a real kernel: captures of a QEMU guest with that CPU
  topology, in ``tests/data/topology`` (its ``capture.py`` says how they were made).

Other trees under tests/data/hosts (``h200-captured``, written by ``gputunectl capture``) are
left alone. Output is deterministic: the same inputs give byte-identical trees. Git keeps no empty
directories, so the empty ``link/`` directories that sysfs shows on every PCI device (the
``aspm_ctrl_attr_group`` of drivers/pci/pcie/aspm.c with no visible attribute) are left out;
gputuned treats a missing and an empty ``link/`` alike.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from gputuned.cpulist import format_cpulist, format_mask, parse_cpulist  # noqa: E402
from tests.data.topology import sysfs as topology_sysfs  # noqa: E402

HOSTS = HERE / "hosts"
TREE_NAMES = (
    "h200-vm",
    "ci-vm",
    "dual-socket-8gpu",
    "degraded-link",
    "four-gpu-one-socket",
    "two-gpu-one-node",
)

# The kernel's own text for the ASPM policy ends every word with a space, the last one too
# (pcie_aspm_get_policy in drivers/pci/pcie/aspm.c); the captures stored it stripped.
ASPM_POLICY_DEFAULT = "[default] performance powersave powersupersave \n"
ASPM_POLICY_POWERSAVE = "default performance [powersave] powersupersave \n"
ASPM_POLICY_PATH = "/sys/module/pcie_aspm/parameters/policy"

# pci_speed_string() in drivers/pci/probe.c, indexed by the LnkCap/LnkSta speed code.
SYSFS_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe",
               5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}  # fmt: skip


def shared_hosts_dir() -> Path:
    """Where the captures live: $GPUTUNED_SHARED/hosts, <repo>/shared/hosts or ../shared/hosts."""
    candidates = []
    if os.environ.get("GPUTUNED_SHARED"):
        candidates.append(Path(os.environ["GPUTUNED_SHARED"]) / "hosts")
    candidates += [REPO / "shared" / "hosts", REPO.parent / "shared" / "hosts"]
    for c in candidates:
        if (c / "h200-vm.json").is_file():
            return c
    sys.exit(f"build_trees: no h200-vm.json in {', '.join(map(str, candidates))}")


# --------------------------------------------------------------------------------------------
# Writing a tree
# --------------------------------------------------------------------------------------------


@dataclass
class Tree:
    name: str
    source: str
    note: str
    write_errors: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)

    def text(self, hpath: str, content: str) -> None:
        assert hpath.startswith("/") and hpath not in self.files, hpath
        self.files[hpath] = content.encode()

    def binary(self, hpath: str, data: bytes) -> None:
        assert hpath.startswith("/") and hpath not in self.files, hpath
        self.files[hpath] = bytes(data)

    def link(self, hpath: str, target: str) -> None:
        self.links[hpath] = target

    def write(self) -> None:
        meta = {
            "name": self.name,
            "source": self.source,
            "note": self.note,
            "write_errors": dict(sorted(self.write_errors.items())),
        }
        self.text("/gputuned-tree.json", json.dumps(meta, indent=2) + "\n")
        HOSTS.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.name}.", dir=HOSTS))
        try:
            for hpath, data in sorted(self.files.items()):
                p = tmp / hpath.lstrip("/")
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
            for hpath, target in sorted(self.links.items()):
                p = tmp / hpath.lstrip("/")
                p.parent.mkdir(parents=True, exist_ok=True)
                p.symlink_to(target)
            for d in sorted(tmp.rglob("*")):
                if d.is_dir() and not d.is_symlink():
                    d.chmod(0o755)
                elif not d.is_symlink():
                    d.chmod(0o644)
            tmp.chmod(0o755)
            dest = HOSTS / self.name
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        print(f"{dest.relative_to(REPO)}: {len(self.files)} files, {len(self.links)} links")


@dataclass
class Function:
    """One PCI function as sysfs shows it."""

    bdf: str
    parent: str  # host path of the directory above the device directory
    config: bytes
    numa_node: int
    local_cpulist: str
    irq: int
    msi: dict[int, str] = field(default_factory=dict)  # IRQ -> "msix" | "msi"
    link_attrs: dict[str, str] | None = None  # current/max link speed/width; None: derive
    aspm_files: dict[str, str] = field(default_factory=dict)  # link/<name> -> value

    @property
    def sysfs(self) -> str:
        return f"{self.parent}/{self.bdf}"


def add_function(tree: Tree, fn: Function) -> None:
    d = fn.sysfs
    cfg = fn.config
    tree.binary(f"{d}/config", cfg)
    tree.text(f"{d}/vendor", f"0x{u16(cfg, 0x00):04x}\n")
    tree.text(f"{d}/device", f"0x{u16(cfg, 0x02):04x}\n")
    tree.text(f"{d}/class", f"0x{u32(cfg, 0x08) >> 8:06x}\n")
    tree.text(f"{d}/numa_node", f"{fn.numa_node}\n")
    tree.text(f"{d}/local_cpulist", f"{fn.local_cpulist}\n")
    tree.text(f"{d}/irq", f"{fn.irq}\n")
    attrs = fn.link_attrs if fn.link_attrs is not None else derived_link_attrs(cfg)
    for name, value in attrs.items():
        tree.text(f"{d}/{name}", f"{value}\n")
    for n, kind in fn.msi.items():
        tree.text(f"{d}/msi_irqs/{n}", f"{kind}\n")
    for name, value in fn.aspm_files.items():
        tree.text(f"{d}/link/{name}", f"{value}\n")
    # /sys/bus/pci/devices/<bdf> -> ../../../devices/pci0000:00/.../<bdf>
    tree.link(f"/sys/bus/pci/devices/{fn.bdf}", "../../.." + d.removeprefix("/sys"))


def derived_link_attrs(cfg: bytes) -> dict[str, str]:
    """current/max_link_speed/width as drivers/pci/pci-sysfs.c prints them, from LnkSta/LnkCap.

    max_link_speed comes from LnkCap2 where present (pcie_get_speed_cap); every synthetic
    function here has LnkCap2's highest speed equal to LnkCap's, which ``check_lnkcap2`` asserts.
    """
    off = pcie_cap(cfg)
    if off is None:
        return {}
    lnkcap, lnksta = u32(cfg, off + 0x0C), u16(cfg, off + 0x12)
    check_lnkcap2(cfg, off)
    return {
        "current_link_speed": SYSFS_SPEED[lnksta & 0xF],
        "current_link_width": str((lnksta >> 4) & 0x3F),
        "max_link_speed": SYSFS_SPEED[lnkcap & 0xF],
        "max_link_width": str((lnkcap >> 4) & 0x3F),
    }


def check_lnkcap2(cfg: bytes, off: int) -> None:
    vector = (u32(cfg, off + 0x2C) >> 1) & 0x7F
    if vector:
        assert vector.bit_length() == u32(cfg, off + 0x0C) & 0xF, "LnkCap2 and LnkCap disagree"


def add_irq(tree: Tree, irq: int, cpus: str, nr_cpus: int) -> None:
    s = parse_cpulist(cpus)
    tree.text(f"/proc/irq/{irq}/smp_affinity_list", f"{format_cpulist(s)}\n")
    tree.text(f"/proc/irq/{irq}/smp_affinity", f"{format_mask(s, nr_cpus)}\n")


def add_cpus_and_nodes(tree: Tree, online: str, nodes: dict[int, str]) -> None:
    # possible/present are not in the captures; every host here has all CPUs present and online.
    for name in ("online", "possible", "present"):
        tree.text(f"/sys/devices/system/cpu/{name}", f"{online}\n")
    tree.text("/sys/devices/system/cpu/isolated", "\n")  # empty on every host here
    tree.text("/sys/devices/system/node/online", f"{format_cpulist(nodes)}\n")
    for n, cpus in nodes.items():
        tree.text(f"/sys/devices/system/node/node{n}/cpulist", f"{cpus}\n")


def add_cgroup2(tree: Tree, cpus: str, mems: str) -> None:
    tree.text(
        "/proc/mounts",
        "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,"
        "memory_recursiveprot 0 0\n",
    )
    tree.text("/proc/self/mountinfo", H200_MOUNTINFO)
    controllers = "cpuset cpu io memory hugetlb pids\n"
    tree.text("/sys/fs/cgroup/cgroup.controllers", controllers)
    tree.text("/sys/fs/cgroup/cgroup.subtree_control", controllers)
    tree.text("/sys/fs/cgroup/cpuset.cpus.effective", f"{cpus}\n")
    tree.text("/sys/fs/cgroup/cpuset.mems.effective", f"{mems}\n")


# The cgroup2 line of /proc/self/mountinfo, read on the lent H200 host (Linux
# 6.18.44-fc-v657-gpu) on 2026-11-30: the options its /proc/mounts line shows, split into the
# mount's own and the hierarchy's. The synthetic trees, which have the same /proc/mounts line,
# use it too.
H200_MOUNTINFO = (
    "32 23 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n"
)

# The cgroup lines of /proc/self/mountinfo, read on a machine of the ci-vm kind (Linux
# 6.18.44-fc-v657, Debian 12) on 2026-11-30, cgroup2 at /sys/fs/cgroup/unified. Both kinds list
# the same /sys/kernel/cgroup/features.
CI_VM_MOUNTINFO = """\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
CGROUP_FEATURES_618 = (
    "nsdelegate\nfavordynmods\nmemory_localevents\nmemory_recursiveprot\n"
    "memory_hugetlb_accounting\npids_localevents\n"
)


def mount_to_proc_mounts(text: str) -> str:
    """``mount`` output ("SRC on DIR type FS (OPTS)"), as captured, to /proc/mounts lines."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"(\S+) on (\S+) type (\S+) \((.*)\)", line)
        assert m, line
        out.append(f"{m[1]} {m[2]} {m[3]} {m[4]} 0 0\n")
    return "".join(out)


def restore_interrupts(text: str) -> str:
    """The captures hold /proc/interrupts with the whole text stripped: put back the header's
    indent (prec + 8 spaces, show_interrupts() in kernel/irq/proc.c, prec read off the first
    IRQ row) and the final newline."""
    first_row = text.splitlines()[1]
    prec = first_row.index(":")
    assert text.startswith("CPU0 ")
    return " " * (prec + 8) + text.rstrip("\n") + "\n"


def interrupts_text(ncpus: int, rows: list[tuple[int, str, int, str]]) -> str:
    """/proc/interrupts as kernel/irq/proc.c and arch/x86/kernel/irq.c print it.

    ``rows``: (irq, chip name, hwirq, action name); all counts are zero but the local timer.
    """
    prec = 3
    out = [" " * (prec + 8) + "".join(f"CPU{c:<8d}" for c in range(ncpus)) + "\n"]
    zero = " " * 9 + "0"
    for irq, chip, hwirq, action in rows:
        counts = "".join(f" {zero}" for _ in range(ncpus))
        out.append(f"{irq:>{prec}d}:{counts} {chip:>8s} {hwirq:>{prec}d}-{'edge':<8s}  {action}\n")
    for name, count, desc in (
        ("NMI", 0, "Non-maskable interrupts"),
        ("LOC", 1000, "Local timer interrupts"),
        ("RES", 0, "Rescheduling interrupts"),
        ("CAL", 0, "Function call interrupts"),
        ("TLB", 0, "TLB shootdowns"),
    ):
        counts = "".join(f" {count:>10d}" for _ in range(ncpus))
        out.append(f"{name:>{prec}s}:{counts}   {desc}\n")
    out.append(f"{'ERR':>{prec}s}: {0:>10d}\n{'MIS':>{prec}s}: {0:>10d}\n")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# Config space helpers
# --------------------------------------------------------------------------------------------


def u16(b: bytes | bytearray, off: int) -> int:
    return int(struct.unpack_from("<H", b, off)[0])


def u32(b: bytes | bytearray, off: int) -> int:
    return int(struct.unpack_from("<I", b, off)[0])


def put16(b: bytearray, off: int, v: int) -> None:
    struct.pack_into("<H", b, off, v)


def put32(b: bytearray, off: int, v: int) -> None:
    struct.pack_into("<I", b, off, v)


def pcie_cap(cfg: bytes | bytearray) -> int | None:
    if not u16(cfg, 0x06) & 0x10 or len(cfg) < 256:
        return None
    ptr, seen = cfg[0x34] & 0xFC, set()
    while ptr >= 0x40 and ptr not in seen:
        seen.add(ptr)
        if cfg[ptr] == 0x10:
            return ptr
        ptr = cfg[ptr + 1] & 0xFC
    return None


def from_lspci_lines(lines: str, size: int) -> bytes:
    """Bytes from ``lspci -xxx``/``-xxxx`` lines ("off: hh hh ..."); offsets not listed are 0."""
    buf = bytearray(size)
    for line in lines.strip().splitlines():
        off, _, hexes = line.strip().partition(":")
        data = bytes.fromhex(hexes)
        assert len(data) == 16, line
        buf[int(off, 16) : int(off, 16) + 16] = data
    return bytes(buf)


def set_mps(cfg: bytearray, size: int) -> None:
    """DevCtl bits 7:5, Max_Payload_Size, as the kernel programs it (pcie_write_mps)."""
    off = pcie_cap(cfg)
    assert off is not None
    code = size.bit_length() - 8
    put16(cfg, off + 0x08, (u16(cfg, off + 0x08) & ~0x00E0) | (code << 5))


def set_devcap_mps(cfg: bytearray, size: int) -> None:
    off = pcie_cap(cfg)
    assert off is not None
    put32(cfg, off + 0x04, (u32(cfg, off + 0x04) & ~0x7) | (size.bit_length() - 8))


def set_lnkcap_width(cfg: bytearray, width: int, port: int | None = None) -> None:
    off = pcie_cap(cfg)
    assert off is not None
    v = (u32(cfg, off + 0x0C) & ~0x3F0) | (width << 4)
    if port is not None:
        v = (v & 0x00FFFFFF) | (port << 24)
    put32(cfg, off + 0x0C, v)


def set_lnksta(cfg: bytearray, speed: int, width: int) -> None:
    off = pcie_cap(cfg)
    assert off is not None
    put16(cfg, off + 0x12, (u16(cfg, off + 0x12) & ~0x3FF) | (width << 4) | speed)


def set_lnkctl(cfg: bytearray, set_bits: int, mask: int) -> None:
    off = pcie_cap(cfg)
    assert off is not None
    put16(cfg, off + 0x10, (u16(cfg, off + 0x10) & ~mask) | set_bits)


def set_buses(cfg: bytearray, primary: int, secondary: int, subordinate: int) -> None:
    cfg[0x18], cfg[0x19], cfg[0x1A] = primary, secondary, subordinate


def close_io_and_mem_windows(cfg: bytearray) -> None:
    """No I/O and no non-prefetchable window: base above limit, the encoding the captured
    PEX 8749 port 02:10.0 shows for windows it does not use (I/O "f1 01", memory
    "f0 ff 00 00"). The Haswell root port has a 16-bit I/O window; its "f0 00" is kept."""
    if cfg[0x1C] & 0x0F == 0x01:
        cfg[0x1C], cfg[0x1D] = 0xF1, 0x01
        put32(cfg, 0x30, 0)
    put32(cfg, 0x20, 0x0000FFF0)


def set_mem_window(cfg: bytearray, base: int, limit: int) -> None:
    put16(cfg, 0x20, (base >> 16) & 0xFFF0)
    put16(cfg, 0x22, (limit >> 16) & 0xFFF0)


def set_pref_window(cfg: bytearray, base: int, limit: int) -> None:
    """64-bit prefetchable window (type bits 3:0 = 1 kept from the template)."""
    assert cfg[0x24] & 0x0F == 0x01, "template bridge must have a 64-bit prefetchable window"
    put16(cfg, 0x24, ((base >> 16) & 0xFFF0) | 0x1)
    put16(cfg, 0x26, ((limit >> 16) & 0xFFF0) | 0x1)
    put32(cfg, 0x28, base >> 32)
    put32(cfg, 0x2C, limit >> 32)


# --------------------------------------------------------------------------------------------
# Real register dumps used as templates for the synthetic trees
# --------------------------------------------------------------------------------------------

# Intel Xeon E5 v3 (Haswell-E) PCI Express Root Port 2 [8086:2f04] rev 02, 0000:00:02.0.
# Source: pciutils, tests/cap-aer-root (github.com/pciutils/pciutils, commit a1492b88709e),
# an `lspci -vvxxxx` of a real server; full 4096 bytes, every line not listed here is zero.
# As captured: DevCap MPS 256, DevCtl MPS 256 / MRRS 128, LnkCap Port #3 8GT/s x8 ASPM L1
# (exit latency L0s <512ns, L1 <16us), LnkCtl ASPM disabled + CommClk, LnkSta 8GT/s x8,
# secondary bus 03, I/O window closed, memory window be000000-c01fffff, no prefetchable window.
HASWELL_RP_2F04 = from_lspci_lines(
    """
    00: 86 80 04 2f 07 00 10 00 02 00 04 06 10 00 81 00
    10: 00 00 00 00 00 00 00 00 00 03 03 00 f0 00 00 20
    20: 00 be 10 c0 f1 ff 01 00 00 00 00 00 00 00 00 00
    30: 00 00 00 00 40 00 00 00 00 00 00 00 0b 01 10 00
    40: 0d 60 00 00 86 80 00 00 00 00 00 00 00 00 00 00
    60: 05 90 02 01 00 00 00 00 00 00 00 00 00 00 00 00
    90: 10 e0 42 00 01 80 00 00 20 00 00 00 83 38 7a 03
    a0: 40 00 83 70 00 00 00 00 c0 07 48 01 00 00 01 00
    b0: 00 00 00 00 be 13 00 00 20 00 00 00 0e 00 00 00
    c0: 03 00 1e 00 00 00 00 00 00 00 00 00 00 00 00 00
    e0: 01 00 03 c8 08 00 00 00 00 00 00 00 00 00 00 00
    100: 0b 00 01 11 02 00 c0 00 07 33 00 00 00 00 00 00
    110: 0d 00 81 14 1f 00 1f 00 00 00 00 00 00 00 00 00
    140: 00 00 00 00 00 00 00 00 01 00 01 1d 00 00 00 00
    150: 00 00 00 00 30 20 06 00 00 00 00 00 00 20 00 00
    180: 91 30 18 00 00 00 00 00 48 10 10 e4 00 00 00 00
    190: 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    1d0: 0b 00 01 25 03 00 a1 00 00 00 00 00 00 00 00 00
    200: 01 00 00 00 00 00 00 00 40 00 00 00 00 00 00 00
    210: 02 00 00 00 06 00 00 00 00 00 00 00 00 00 00 00
    250: 19 00 01 28 00 00 00 00 ff 00 00 00 77 27 77 27
    260: 77 27 77 27 77 27 77 27 77 27 77 27 77 27 77 27
    270: 77 27 77 27 77 27 77 27 77 27 77 27 00 00 00 00
    280: 0b 00 01 30 05 00 83 01 00 00 00 40 00 00 00 00
    290: 00 00 00 00 00 00 00 00 0b 00 01 30 07 00 40 02
    2a0: 00 00 00 00 01 00 08 00 00 00 00 00 00 00 00 0a
    2b0: 04 20 00 03 00 00 10 00 00 00 00 00 00 00 00 00
    300: 0b 00 01 00 08 00 80 03 00 00 00 00 0f 00 00 00
    480: 00 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff
    490: 00 00 0f 0f 00 00 00 00 00 00 00 00 00 00 00 00
    4c0: 0c 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    """,
    4096,
)

# PLX Technology PEX 8749 48-lane switch [10b5:8749] rev ca. Source: `lspci -vvxxx` of an Arm
# Neoverse N1SDP board, attached (lspci_n1sdp.txt) by Andre Przywara to "Re: [PATCH] pcie: Add
# quirk for the Arm Neoverse N1SDP platform", linux-arm-kernel/linux-pci, 11 Dec 2019,
# Message-ID <20191211110049.54a2d6f3@donnerap.cambridge.arm.com>. `-xxx` shows the first 256
# bytes only, so 0x100-0xfff are zero here: the extended capabilities lspci listed for these
# ports (AER, DSN, VC, ACS, ...) are not reproduced. EEPROM on that board limits the switch to
# 5GT/s (LnkCap speed 2, LnkCap2 2.5-5GT/s); kept, so the GPUs behind it train at 5GT/s.
#
# Upstream port 0000:01:00.0 as captured: DevCap MPS 256, DevCtl MPS 128 / MRRS 128, LnkCap
# Port #0 5GT/s x16 ASPM L1 (L1 exit <4us, ClockPM-), LnkSta 5GT/s x16, BAR0 (the 256K
# management window) at 71b00000, buses 01/02/08, multi-function (its DMA functions .1-.4 are
# not part of the trees).
PEX8749_USP = from_lspci_lines(
    """
    00: b5 10 49 87 07 00 10 00 ca 00 04 06 00 00 81 00
    10: 00 00 b0 71 00 00 00 00 01 02 08 00 11 41 00 00
    20: 20 71 a0 71 01 00 61 00 09 00 00 00 09 00 00 00
    30: 00 00 00 00 40 00 00 00 00 00 00 00 ff 01 02 00
    40: 01 48 03 c8 08 00 00 00 05 68 86 01 00 00 00 00
    60: 00 00 00 00 00 00 00 00 10 a4 52 00 01 80 00 00
    70: 10 08 09 00 02 59 41 00 00 00 02 01 00 00 00 00
    80: 00 00 00 00 00 00 00 00 00 00 00 00 40 08 04 00
    90: 00 00 00 00 06 01 00 00 02 00 00 00 00 00 00 00
    a0: 00 00 00 00 0d 00 00 00 b5 10 49 87 00 00 00 00
    """,
    4096,
)

# Downstream port 0000:02:12.0 of the same switch as captured: Express (v2) Downstream Port
# (Slot-), the form of a port wired to a device on a baseboard rather than to a slot (as GPUs on
# 8-GPU baseboards are). DevCap MPS 256, DevCtl MPS 128 / MRRS 128, LnkCap Port #18 5GT/s x2
# ASPM L1 (L1 exit <4us), LnkSta 5GT/s x1 DLActive+, buses 02/06/06, MSI enabled (address
# fffff040 is the N1SDP's; gputuned does not read it). Its Slot- form matters: a hot-plug
# capable port would make pcie_bus_safe fall back to 128 bytes for the whole hierarchy
# (pcie_find_smpss, drivers/pci/probe.c).
PEX8749_DSP = from_lspci_lines(
    """
    00: b5 10 49 87 07 04 10 00 ca 00 04 06 00 00 01 00
    10: 00 00 00 00 00 00 00 00 02 06 06 00 31 31 00 00
    20: 60 71 60 71 f1 ff 01 00 00 00 00 00 00 00 00 00
    30: 00 00 00 00 40 00 00 00 00 00 00 00 ff 01 02 00
    40: 01 48 03 c8 08 00 00 00 05 68 87 01 40 f0 ff ff
    50: 00 00 00 00 00 00 00 00 ff 00 00 00 00 00 00 00
    60: 00 00 00 00 00 00 00 00 10 a4 62 00 01 80 00 00
    70: 10 08 09 00 22 58 79 12 00 00 12 60 80 0c 00 00
    80: 00 00 40 00 00 00 00 00 00 00 00 00 60 08 04 00
    90: 00 00 00 00 06 01 00 00 02 00 00 00 00 00 00 00
    a0: 00 00 00 00 0d 00 00 00 b5 10 49 87 00 00 00 00
    """,
    4096,
)


def h200_config(shared: Path) -> bytes:
    """The real H200 (0000:00:06.0 of h200-vm): DevCap MPS 256, DevCtl 0x5134 (MPS 256, MRRS
    4096), LnkCap 32GT/s x16 ASPM L1 (L1 exit <4us, ClockPM+), LnkSta 32GT/s x16, BAR0 at
    104002000000, BAR2 at 100000000000, BAR4 at 104000000000 (all 64-bit prefetchable)."""
    d = json.loads((shared / "h200-vm.json").read_text())
    return bytes.fromhex(d["pci"]["0000:00:06.0"]["config_hex"])


# --------------------------------------------------------------------------------------------
# Trees from captures
# --------------------------------------------------------------------------------------------


def captured_tree(shared: Path, name: str, write_errors: dict[str, str], extra_note: str) -> Tree:
    cap = json.loads((shared / f"{name}.json").read_text())
    tree = Tree(name, "shared-json", cap["note"] + " " + extra_note, write_errors)
    ncpus = len(parse_cpulist(cap_lscpu(cap, "On-line CPU(s) list")))
    online = format_cpulist(parse_cpulist(cap_lscpu(cap, "On-line CPU(s) list")))
    for bdf, dev in sorted(cap["pci"].items()):
        cfg = bytes.fromhex(dev["config_hex"])
        assert len(cfg) == dev["config_len"], bdf
        assert f"0x{u16(cfg, 0):04x}" == dev["vendor"] and f"0x{u16(cfg, 2):04x}" == dev["device"]
        assert f"0x{u32(cfg, 8) >> 8:06x}" == dev["class"], bdf
        attrs = {
            k: dev[k]
            for k in (
                "current_link_speed",
                "current_link_width",
                "max_link_speed",
                "max_link_width",
            )
            if not str(dev[k]).startswith("ERR")
        }
        realpath = dev["realpath"]
        assert realpath.endswith("/" + bdf)
        add_function(
            tree,
            Function(
                bdf=bdf,
                parent=realpath.rsplit("/", 1)[0],
                config=cfg,
                numa_node=int(dev["numa_node"]),
                local_cpulist=dev["local_cpulist"],
                irq=int(dev["irq"]),
                # Every MSI vector in these captures is MSI-X: /proc/interrupts shows PCI-MSIX.
                msi={int(n): "msix" for n in dev["msi_irqs"] or []},
                link_attrs=attrs,
                aspm_files={},  # link_dir is empty for every function in both captures
            ),
        )
        assert dev["link_dir"] == [], bdf
    tree.text("/proc/interrupts", restore_interrupts(cap["interrupts"]))
    for irq, cpus in sorted(cap["irq_affinity"].items(), key=lambda kv: int(kv[0])):
        add_irq(tree, int(irq), cpus, ncpus)
    tree.text("/proc/irq/default_smp_affinity", cap["default_smp_affinity"] + "\n")
    tree.text("/proc/cmdline", cap["cmdline"] + "\n")
    tree.text(ASPM_POLICY_PATH, cap["aspm_policy"] + " \n")
    nodes = {
        int(m[1]): m[2] for m in re.finditer(r"NUMA node(\d+) CPU\(s\):\s+(\S+)", cap["lscpu"])
    }
    add_cpus_and_nodes(
        tree, online, {n: format_cpulist(parse_cpulist(c)) for n, c in nodes.items()}
    )
    assert cap["isolated"] == "" and cap["nohz_full"].startswith("ERR FileNotFoundError")
    tree.text("/proc/mounts", mount_to_proc_mounts(cap["mounts_cgroup"]))
    return tree


def cap_lscpu(cap: dict[str, object], key: str) -> str:
    m = re.search(rf"^{re.escape(key)}:\s+(\S+)$", str(cap["lscpu"]), re.M)
    assert m, key
    return m[1]


def build_h200_vm(shared: Path) -> Tree:
    tree = captured_tree(
        shared,
        "h200-vm",
        {
            ASPM_POLICY_PATH: "EPERM",
            "/proc/irq/31/smp_affinity_list": "EPERM",
            "/proc/irq/33/smp_affinity_list": "EPERM",
        },
        "Tree notes: /proc/mounts lines are the captured mount(8) lines in /proc/mounts form; "
        "the /proc/interrupts header indent and the ASPM policy's trailing space, stripped by "
        "the capture, are restored as the kernel prints them; cpu/possible and cpu/present "
        "equal cpu/online; the root cgroup's cpuset.cpus.effective is the online set (nothing "
        "isolated); write errors recorded only for smp_affinity_list, the file the capture "
        "wrote; /proc/self/mountinfo (its cgroup2 line) and /sys/kernel/cgroup/features were "
        "read on the same machine kind later.",
    )
    cap = json.loads((shared / "h200-vm.json").read_text())
    controllers = cap["cgroup2_controllers"] + "\n"
    tree.text("/sys/fs/cgroup/cgroup.controllers", controllers)
    tree.text("/sys/fs/cgroup/cgroup.subtree_control", cap["cgroup2_subtree"] + "\n")
    tree.text("/sys/fs/cgroup/cpuset.cpus.effective", "0-15\n")
    tree.text("/sys/fs/cgroup/cpuset.mems.effective", "0\n")
    tree.text("/proc/self/mountinfo", H200_MOUNTINFO)
    tree.text("/sys/kernel/cgroup/features", CGROUP_FEATURES_618)
    return tree


# IRQ 36 (virtio1-req.0 of 0000:00:02.0, the same vector number as in the capture) refused
# writing its own affinity back, in both files, with EPERM; every other IRQ took it, and the ASPM
# policy refused "default" with EPERM. Probed on a machine of this kind (Linux
# 6.18.44-fc-v657) by writing each current value back unchanged.
CI_VM_WRITE_ERRORS = {
    ASPM_POLICY_PATH: "EPERM",
    "/proc/irq/36/smp_affinity_list": "EPERM",
    "/proc/irq/36/smp_affinity": "EPERM",
}

# The v1 cpuset hierarchy's root, read on a machine of this kind (not in the capture).
CI_VM_CPUSET_V1 = {
    "cpuset.cpus": "0-1",
    "cpuset.effective_cpus": "0-1",
    "cpuset.mems": "0",
    "cpuset.effective_mems": "0",
    "cpuset.cpu_exclusive": "1",
    "cpuset.sched_load_balance": "1",
}


def build_ci_vm(shared: Path) -> Tree:
    tree = captured_tree(
        shared,
        "ci-vm",
        CI_VM_WRITE_ERRORS,
        "Tree notes: write errors probed on a machine of this kind by writing current values "
        "back (IRQ 36, virtio1-req.0, refuses with EPERM like virtio req vectors on h200-vm); "
        "/sys/fs/cgroup is a tmpfs with v1 hierarchies and cgroup2 at /sys/fs/cgroup/unified, "
        "which has no controllers (per the capture's note); the v1 cpuset root files were read "
        "on a machine of this kind. /sys/fs/cgroup/cgroup.subtree_control holding '+cpuset' is "
        "reproduced from the capture: it is a stray regular file on that tmpfs (no "
        "cgroup.controllers beside it, and the kernel never prints '+'), left by something "
        "that wrote '+cpuset' as if cgroup2 were mounted there; cgroup detection must go by "
        "/proc/mounts, not by that file. No PCIe functions: virtio devices on conventional PCI. "
        "/proc/self/mountinfo (its cgroup lines) and /sys/kernel/cgroup/features were read on a "
        "machine of this kind.",
    )
    cap = json.loads((shared / "ci-vm.json").read_text())
    assert cap["cgroup2_controllers"].startswith("ERR FileNotFoundError")
    tree.text("/sys/fs/cgroup/cgroup.subtree_control", cap["cgroup2_subtree"] + "\n")
    for name, value in CI_VM_CPUSET_V1.items():
        tree.text(f"/sys/fs/cgroup/cpuset/{name}", f"{value}\n")
    tree.text("/sys/fs/cgroup/unified/cgroup.controllers", "\n")
    tree.text("/sys/fs/cgroup/unified/cgroup.subtree_control", "\n")
    tree.text("/proc/self/mountinfo", CI_VM_MOUNTINFO)
    tree.text("/sys/kernel/cgroup/features", CGROUP_FEATURES_618)
    return tree


# --------------------------------------------------------------------------------------------
# dual-socket-8gpu
# --------------------------------------------------------------------------------------------

GPU_BAR_STRIDE = 0x80_0000_0000  # 512 GiB of prefetchable space per GPU
GPU_BAR_BASE = 0x1000_0000_0000  # where the captured H200's BAR2 sits


def gpu_config(h200: bytes, index: int, mps: int, lnksta: tuple[int, int]) -> bytes:
    """The captured H200 with only what its place in the tree changes:

    - BAR0/2/4 moved up by ``index`` * 512 GiB so that no two GPUs overlap and each sits inside
      its bridges' prefetchable windows (the captured layout relative to BAR2 is kept);
    - DevCtl MPS as pcie_bus_safe programs it for its hierarchy;
    - LnkSta speed/width as its link trains with the port above it.
    """
    cfg = bytearray(h200)
    for bar in (0x10, 0x18, 0x20):
        addr = u32(cfg, bar) | (u32(cfg, bar + 4) << 32)
        flags, base = addr & 0xF, addr & ~0xF
        assert flags == 0xC, "H200 BARs are 64-bit prefetchable"
        new = base + index * GPU_BAR_STRIDE
        put32(cfg, bar, (new & 0xFFFFFFFF) | flags)
        put32(cfg, bar + 4, new >> 32)
    set_mps(cfg, mps)
    set_lnksta(cfg, *lnksta)
    return bytes(cfg)


def gpu_window(index: int) -> tuple[int, int]:
    base = GPU_BAR_BASE + index * GPU_BAR_STRIDE
    return base, base + GPU_BAR_STRIDE - 1


@dataclass(frozen=True)
class Switch:
    """One root port, a PEX 8749 below it and two GPUs below that."""

    host: str  # "pci0000:00"
    rp: str  # root port BDF
    rp_device_id: int
    usp_bus: int
    first_gpu: int  # GPU index of the first of its two GPUs
    node: int
    mps: int  # what pcie_bus_safe programs: the minimum DevCap MPS under this root port
    dsp_mps_cap: tuple[int, int]  # DevCap MPS of its two downstream ports


DUAL_SWITCHES = (
    # The second downstream port of the first switch supports only 128-byte payloads (DevCap
    # 2:0 = 0, as a PEX port configured for 128 bytes reports). pcie_bus_safe takes the minimum
    # over everything below the root port (pcie_find_smpss), so that whole hierarchy - root
    # port, switch and both GPUs - runs at 128 though the GPU at 03:00.0 has a 256-byte path.
    Switch("pci0000:00", "0000:00:02.0", 0x2F04, 0x01, 0, 0, 128, (256, 128)),
    Switch("pci0000:00", "0000:00:03.0", 0x2F08, 0x05, 2, 0, 256, (256, 256)),
    Switch("pci0000:80", "0000:80:02.0", 0x2F04, 0x81, 4, 1, 256, (256, 256)),
    Switch("pci0000:80", "0000:80:03.0", 0x2F08, 0x85, 6, 1, 256, (256, 256)),
)
DSP_DEVICES = (0x08, 0x10)  # PEX numbers a downstream port's device after its port (8, 16)
DUAL_GPU_IRQ_BASE = 120  # GPU k: INTx line 120+9k, MSI-X vectors 121+9k .. 128+9k


def root_port_config(sw: Switch, j: int) -> bytes:
    """The Haswell-E root port, changed where this tree needs it:

    - device ID 2f08 for the port at device 3 (Root Port 3 is 8086:2f08 in pci.ids; 2f04 only
      exists at device 2);
    - buses, a 1 MiB memory window for the switch's BAR0, the prefetchable window of its GPUs;
    - LnkCap width x16: the captured port was bifurcated x8x8, this one is not (ports 2 and 3
      of Haswell-E are x16 ports);
    - LnkSta 5GT/s x16: its link partner is the PEX 8749 upstream port (5GT/s x16);
    - DevCtl MPS as pcie_bus_safe programs it.
    """
    cfg = bytearray(HASWELL_RP_2F04)
    put16(cfg, 0x02, sw.rp_device_id)
    bus = sw.usp_bus
    set_buses(cfg, 0, bus, bus + 3)
    mgmt = 0x9000_0000 + j * 0x10_0000
    set_mem_window(cfg, mgmt, mgmt + 0xF_FFFF)
    lo, _ = gpu_window(sw.first_gpu)
    _, hi = gpu_window(sw.first_gpu + 1)
    set_pref_window(cfg, lo, hi)
    set_lnkcap_width(cfg, 16)
    set_lnksta(cfg, 2, 16)
    set_mps(cfg, sw.mps)
    return bytes(cfg)


def usp_config(sw: Switch, j: int) -> bytes:
    """PEX 8749 upstream port: BAR0 moved into its root port's memory window, buses, windows
    (I/O and non-prefetchable closed: nothing below needs them), DevCtl MPS per pcie_bus_safe."""
    cfg = bytearray(PEX8749_USP)
    put32(cfg, 0x10, 0x9000_0000 + j * 0x10_0000)
    bus = sw.usp_bus
    set_buses(cfg, bus, bus + 1, bus + 3)
    close_io_and_mem_windows(cfg)
    lo, _ = gpu_window(sw.first_gpu)
    _, hi = gpu_window(sw.first_gpu + 1)
    set_pref_window(cfg, lo, hi)
    set_mps(cfg, sw.mps)
    return bytes(cfg)


def dsp_config(sw: Switch, k: int) -> bytes:
    """PEX 8749 downstream port k (0 or 1) of switch ``sw``:

    - buses and windows (only the prefetchable window of its GPU);
    - LnkCap width x16 and port number = device number: wired as an x16 port (48 lanes: x16 up,
      two x16 down), numbered as PEX numbers ports; the captured port was an x2 port #18;
    - LnkSta x16 (5GT/s, DLActive+ as captured): trained with the GPU below it;
    - DevCap MPS 128 where the scenario wants it; DevCtl MPS per pcie_bus_safe.
    """
    cfg = bytearray(PEX8749_DSP)
    bus = sw.usp_bus + 1
    set_buses(cfg, bus, bus + 1 + k, bus + 1 + k)
    close_io_and_mem_windows(cfg)
    set_pref_window(cfg, *gpu_window(sw.first_gpu + k))
    set_lnkcap_width(cfg, 16, port=DSP_DEVICES[k])
    set_lnksta(cfg, 2, 16)
    set_devcap_mps(cfg, sw.dsp_mps_cap[k])
    set_mps(cfg, sw.mps)
    return bytes(cfg)


def add_switched_gpus(
    tree: Tree, h200: bytes, switches: tuple[Switch, ...], nodes: dict[int, str]
) -> list[tuple[int, str, int, str]]:
    """Each switch's root port, PEX 8749 and two GPUs; returns the GPUs' /proc/interrupts rows.

    Every function's local_cpulist is its node's CPU list, as the kernel prints it for a
    device on that node (drivers/pci/pci-sysfs.c, cpumask_of_node)."""
    nr = len(parse_cpulist(",".join(nodes.values())))
    rows: list[tuple[int, str, int, str]] = []
    for j, sw in enumerate(switches):
        cpus = nodes[sw.node]
        rp_dir = f"/sys/devices/{sw.host}"
        add_function(tree, Function(sw.rp, rp_dir, root_port_config(sw, j), sw.node, cpus, 11))
        usp_bdf = f"0000:{sw.usp_bus:02x}:00.0"
        usp_dir = f"{rp_dir}/{sw.rp}"
        add_function(tree, Function(usp_bdf, usp_dir, usp_config(sw, j), sw.node, cpus, 0))
        for k, dev in enumerate(DSP_DEVICES):
            dsp_bdf = f"0000:{sw.usp_bus + 1:02x}:{dev:02x}.0"
            dsp_dir = f"{usp_dir}/{usp_bdf}"
            clkpm = {"clkpm": "0"}  # GPU has ClockPM+, CLKREQ# not enabled (policy default)
            add_function(
                tree,
                Function(dsp_bdf, dsp_dir, dsp_config(sw, k), sw.node, cpus, 0, {}, None, clkpm),
            )
            g = sw.first_gpu + k
            gpu_bdf = f"0000:{sw.usp_bus + 2 + k:02x}:00.0"
            irq = DUAL_GPU_IRQ_BASE + 9 * g
            vectors = list(range(irq + 1, irq + 9))
            add_function(
                tree,
                Function(
                    gpu_bdf,
                    f"{dsp_dir}/{dsp_bdf}",
                    gpu_config(h200, g, sw.mps, (2, 16)),
                    sw.node,
                    cpus,
                    irq,
                    {n: "msix" for n in vectors},
                    None,
                    clkpm,
                ),
            )
            for hw, n in enumerate(vectors):
                add_irq(tree, n, format_cpulist(range(nr)), nr)
                rows.append((n, f"PCI-MSIX-{gpu_bdf}", hw, "nvidia"))
    return rows


def add_gpu_host_files(
    tree: Tree, rows: list[tuple[int, str, int, str]], nodes: dict[int, str]
) -> None:
    """/proc/interrupts with the GPUs' rows, every IRQ allowed on every CPU, an Ubuntu kernel's
    command line, the default ASPM policy (owned by the OS) and cgroup v2 with cpuset."""
    nr = len(parse_cpulist(",".join(nodes.values())))
    tree.text("/proc/interrupts", interrupts_text(nr, rows))
    tree.text("/proc/irq/default_smp_affinity", format_mask(range(nr), nr) + "\n")
    tree.text(
        "/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.8.0-49-generic root=/dev/sda2 ro quiet\n"
    )
    tree.text(ASPM_POLICY_PATH, ASPM_POLICY_DEFAULT)
    add_cgroup2(tree, format_cpulist(range(nr)), format_cpulist(nodes))


def add_captured_cpus(
    tree: Tree, shape: str, renumber: Callable[[int], int] | None
) -> dict[int, str]:
    """The CPU and node files of a topology capture (tests/data/topology); node -> cpulist."""
    files, nodes = topology_sysfs.cpu_files(shape, renumber)
    for path, text in files.items():
        tree.text(path, text)
    return nodes


def topology_source(shape: str) -> str:
    cap = topology_sysfs.load(shape)
    return (
        f"CPU topology and NUMA files from tests/data/topology/{shape}.json: {cap['source']}, "
        f"QEMU -smp {cap['qemu_topology'][-1]}, captured {cap['captured']}"
    )


def build_dual_socket(shared: Path) -> Tree:
    h200 = h200_config(shared)
    # Two sockets of 16 cores, 2 threads each, numbered as such servers' firmware does: every
    # core's first thread, socket by socket, then every second thread (siblings N and N+32).
    nodes_renumber = topology_sysfs.cores_first(2, 16, 2)
    tree = Tree(
        "dual-socket-8gpu",
        "synthetic",
        "Two sockets of 16 cores with 2 SMT threads each, 64 CPUs numbered as two-socket "
        "servers' firmware usually numbers them (node0 0-15,32-47, node1 16-31,48-63; siblings "
        "N and N+32), 8 NVIDIA H200 in pairs behind four "
        "PLX PEX 8749 switches, each under its own Intel Haswell-E root port (00:02.0, 00:03.0 "
        "on node 0; 80:02.0, 80:03.0 on node 1). Config spaces are real dumps, edited only where "
        "the topology needs it (tests/data/build_trees.py names every edit): GPUs from the "
        "captured H200 of h200-vm; root ports from pciutils tests/cap-aer-root (lspci -vvxxxx "
        "of 8086:2f04 Haswell-E Root Port 2); switch ports from the lspci -vvxxx of an Arm "
        "N1SDP (PEX 8749 01:00.0 upstream, 02:12.0 downstream) attached to 'Re: [PATCH] pcie: "
        "Add quirk for the Arm Neoverse N1SDP platform' (linux-arm-kernel, 2019-12-11, "
        "<20191211110049.54a2d6f3@donnerap.cambridge.arm.com>); that switch is limited to "
        "5GT/s, so every GPU link trains at 5GT/s x16 (below its 32GT/s capability, x16 of "
        "x16). Downstream port 02:10.0 supports only 128-byte payloads: the GPU 04:00.0 behind "
        "it has a 128-byte path; MPS was programmed as pcie_bus_safe does, the minimum under "
        "each root port, so root port 00:02.0, its switch and both its GPUs run at 128 and the "
        "other three hierarchies at 256. The OS owns ASPM (policy writable, default): links "
        "from a switch port to a GPU show link/clkpm (the H200 has ClockPM+); no link shows "
        "l1_aspm because the H200 accepts at most 1us of L1 exit latency and every L1 exit "
        "latency here is longer (pcie_aspm_check_latency). 8 MSI-X vectors per GPU, all IRQs on "
        f"all CPUs. Bridge IRQs are not modelled. {topology_source('2s16c2t')}; CPUs "
        "renumbered from QEMU's order (siblings 2k, 2k+1) to the one above "
        "(tests/data/topology/sysfs.py cores_first), every list and mask with them.",
    )
    nodes = add_captured_cpus(tree, "2s16c2t", nodes_renumber)
    add_gpu_host_files(tree, add_switched_gpus(tree, h200, DUAL_SWITCHES, nodes), nodes)
    return tree


# --------------------------------------------------------------------------------------------
# four-gpu-one-socket and two-gpu-one-node
# --------------------------------------------------------------------------------------------

FOUR_SWITCHES = (
    Switch("pci0000:00", "0000:00:02.0", 0x2F04, 0x01, 0, 0, 256, (256, 256)),
    Switch("pci0000:00", "0000:00:03.0", 0x2F08, 0x05, 2, 0, 256, (256, 256)),
)


def build_four_gpu(shared: Path) -> Tree:
    tree = Tree(
        "four-gpu-one-socket",
        "synthetic",
        "Two sockets of 16 cores with 2 SMT threads each, 64 CPUs numbered as QEMU numbers "
        "them (siblings 2k, 2k+1; node0 0-31, node1 32-63), and 4 NVIDIA H200, all on socket 0: "
        "in pairs behind two PLX PEX 8749 switches under the Haswell-E root ports 00:02.0 and "
        "00:03.0, built as in dual-socket-8gpu (same templates and edits, every switch port "
        "supporting 256-byte payloads, so every hierarchy runs at MPS 256; links at 5GT/s x16). "
        "Socket 1 has no GPU. 8 MSI-X vectors per GPU, all IRQs on all CPUs; bridge IRQs are "
        f"not modelled. {topology_source('2s16c2t')}, as the guest numbered them.",
    )
    nodes = add_captured_cpus(tree, "2s16c2t", None)
    rows = add_switched_gpus(tree, h200_config(shared), FOUR_SWITCHES, nodes)
    add_gpu_host_files(tree, rows, nodes)
    return tree


def build_two_gpu(shared: Path) -> Tree:
    tree = Tree(
        "two-gpu-one-node",
        "synthetic",
        "One socket of 8 cores with 2 SMT threads each, 16 CPUs on one NUMA node, numbered as "
        "QEMU numbers them (siblings 2k, 2k+1), and 2 NVIDIA H200 (captured config of h200-vm), "
        "each directly under its own Intel Haswell-E root port (pciutils tests/cap-aer-root, "
        "8086:2f04; the port at device 3 as 8086:2f08), edited as in degraded-link but healthy: "
        "x16 ports, links trained at 8GT/s x16 (the root port's top speed), ASPM disabled "
        "(policy default, owned by the OS: link/clkpm on both ends), MPS 256 on both ends. "
        "8 MSI-X vectors per GPU, all IRQs on all CPUs; bridge IRQs are not "
        f"modelled. {topology_source('1s8c2t')}, as the guest numbered them.",
    )
    nodes = add_captured_cpus(tree, "1s8c2t", None)
    h200 = h200_config(shared)
    rows: list[tuple[int, str, int, str]] = []
    for g, (dev, dev_id) in enumerate(((0x02, 0x2F04), (0x03, 0x2F08))):
        rp_bdf, gpu_bdf = f"0000:00:{dev:02x}.0", f"0000:{g + 1:02x}:00.0"
        rp = bytearray(HASWELL_RP_2F04)
        put16(rp, 0x02, dev_id)
        set_buses(rp, 0, g + 1, g + 1)
        put32(rp, 0x20, 0x0000FFF0)  # no non-prefetchable window: the H200's BARs are prefetchable
        set_pref_window(rp, *gpu_window(g))
        set_lnkcap_width(rp, 16)  # x16 ports, not bifurcated (as in dual-socket-8gpu)
        set_lnksta(rp, 3, 16)
        root = "/sys/devices/pci0000:00"
        # link/clkpm on both ends, as in dual-socket-8gpu: the H200 has ClockPM+ (so the link
        # can do clock PM); no l1_aspm, the H200's 1us acceptable L1 latency is shorter than
        # the root port's L1 exit (pcie_aspm_check_latency)
        clkpm = {"clkpm": "0"}
        add_function(tree, Function(rp_bdf, root, bytes(rp), 0, nodes[0], 11, {}, None, clkpm))
        irq = 39 + 9 * g
        vectors = list(range(irq + 1, irq + 9))
        gpu = gpu_config(h200, g, 256, (3, 16))
        msix = {n: "msix" for n in vectors}
        add_function(
            tree, Function(gpu_bdf, f"{root}/{rp_bdf}", gpu, 0, nodes[0], irq, msix, None, clkpm)
        )
        for hw, n in enumerate(vectors):
            add_irq(tree, n, "0-15", 16)
            rows.append((n, f"PCI-MSIX-{gpu_bdf}", hw, "nvidia"))
    add_gpu_host_files(tree, rows, nodes)
    return tree


# --------------------------------------------------------------------------------------------
# degraded-link
# --------------------------------------------------------------------------------------------


def build_degraded_link(shared: Path) -> Tree:
    tree = Tree(
        "degraded-link",
        "synthetic",
        "One NVIDIA H200 (captured config of h200-vm) behind an Intel Haswell-E root port "
        "(pciutils tests/cap-aer-root, 8086:2f04), 8 CPUs, one NUMA node, cgroup v2. The link "
        "trained at x8 of x16 on both ends (a lane fault: the GPU and the root port are both "
        "x16 capable) and at 8GT/s, the root port's top speed. ASPM policy powersave, owned "
        "by the OS: L1 enabled in LnkCtl of both ends, CLKREQ# enabled on the GPU, link/l1_aspm "
        "and link/clkpm read 1. Caveat: a real kernel would not enable L1 here - the H200 "
        "accepts 1us of L1 exit latency and both ends take longer, so pcie_aspm_check_latency "
        "(drivers/pci/pcie/aspm.c) removes L1 from the link's capable states; this tree shows "
        "the state as if that check had passed, to exercise ASPM detection and tuning.",
    )
    rp = bytearray(HASWELL_RP_2F04)
    set_buses(rp, 0, 1, 1)
    put32(rp, 0x20, 0x0000FFF0)  # no non-prefetchable window: the H200's BARs are prefetchable
    set_pref_window(rp, *gpu_window(0))
    set_lnkcap_width(rp, 16)  # an x16 port (not bifurcated), as in dual-socket-8gpu
    set_lnksta(rp, 3, 8)  # trained 8GT/s x8: the fault this tree is about
    set_lnkctl(rp, 0x0002, 0x0003)  # ASPM control = 10b, L1 (powersave policy)
    gpu = bytearray(gpu_config(h200_config(shared), 0, 256, (3, 8)))
    # ASPM L1 and Enable Clock Power Management (LnkCtl bit 8): powersave turns on CLKREQ# on
    # the downstream device when the link is capable of it (policy_to_clkpm_state, aspm.c).
    set_lnkctl(gpu, 0x0102, 0x0103)
    aspm = {"clkpm": "1", "l1_aspm": "1"}
    rp_bdf, gpu_bdf = "0000:00:02.0", "0000:01:00.0"
    add_function(
        tree, Function(rp_bdf, "/sys/devices/pci0000:00", bytes(rp), 0, "0-7", 11, {}, None, aspm)
    )
    vectors = list(range(40, 48))
    add_function(
        tree,
        Function(
            gpu_bdf,
            f"/sys/devices/pci0000:00/{rp_bdf}",
            bytes(gpu),
            0,
            "0-7",
            39,
            {n: "msix" for n in vectors},
            None,
            aspm,
        ),
    )
    for n in vectors:
        add_irq(tree, n, "0-7", 8)
    rows = [(n, f"PCI-MSIX-{gpu_bdf}", hw, "nvidia") for hw, n in enumerate(vectors)]
    tree.text("/proc/interrupts", interrupts_text(8, rows))
    tree.text("/proc/irq/default_smp_affinity", "ff\n")
    tree.text(
        "/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.8.0-49-generic root=/dev/sda2 ro quiet\n"
    )
    tree.text(ASPM_POLICY_PATH, ASPM_POLICY_POWERSAVE)
    add_cpus_and_nodes(tree, "0-7", {0: "0-7"})
    add_cgroup2(tree, "0-7", "0")
    return tree


def main() -> None:
    shared = shared_hosts_dir()
    builders = (build_h200_vm, build_ci_vm, build_dual_socket, build_degraded_link)
    for build in (*builders, build_four_gpu, build_two_gpu):
        build(shared).write()


if __name__ == "__main__":
    main()
