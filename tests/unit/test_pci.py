"""gputuned.kernel.pci on every tree, against values written out by hand.

The expected values below were read off the trees' sources (the captures in shared/hosts and
the register edits in tests/data/build_trees.py), not computed by gputuned: if the parser or
the topology walk changes what it reports, these tables say so.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from gputuned.kernel.pci import ASPM_POLICY, read_aspm_policy, read_cmdline, scan
from gputuned.kernel.pciconfig import CAP_EXP, parse_config, read_registers
from tests.conftest import ALL_TREES
from tests.faults import FaultKernel, tree_kernel

HOSTS = Path(__file__).resolve().parents[1] / "data" / "hosts"

L1 = ("L1",)
NONE: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pcie:
    port: str
    devcap_mps: int
    devctl_mps: int
    mrrs: int
    lnkcap: tuple[float, int]  # speed GT/s, width
    lnksta: tuple[float, int]
    aspm_supported: tuple[str, ...]
    aspm_enabled: tuple[str, ...]


@dataclass(frozen=True)
class Fn:
    vendor: int
    device: int
    class_code: int
    pcie: Pcie | None
    path: tuple[str, ...]  # endpoint first, up to the root port / root bus
    path_max_mps: int | None
    numa_node: int | None
    local_cpus: frozenset[int]
    irqs: dict[int, frozenset[int]]  # MSI/MSI-X vector -> smp_affinity_list
    link_files: dict[str, str] = field(default_factory=dict)


def cpus(lo: int, hi: int) -> frozenset[int]:
    return frozenset(range(lo, hi + 1))


def vectors(first: int, last: int, affinity: frozenset[int]) -> dict[int, frozenset[int]]:
    return {n: affinity for n in range(first, last + 1)}


C16, C2, C8 = cpus(0, 15), cpus(0, 1), cpus(0, 7)
# dual-socket-8gpu numbers SMT siblings N and N+32: node 0 is 0-15,32-47
N0, N1, ALL64 = cpus(0, 15) | cpus(32, 47), cpus(16, 31) | cpus(48, 63), cpus(0, 63)
ONE = frozenset({1})

# ---- h200-vm: shared/hosts/h200-vm.json ----------------------------------------------------
H200_VM = {
    "0000:00:00.0": Fn(0x8086, 0x0D57, 0x060000, None, ("0000:00:00.0",), None, None, C16, {}),
    "0000:00:01.0": Fn(
        0x1AF4, 0x1042, 0x018000, None, ("0000:00:01.0",), None, None, C16, vectors(30, 31, C16)
    ),
    "0000:00:02.0": Fn(
        0x1AF4, 0x1042, 0x018000, None, ("0000:00:02.0",), None, None, C16, vectors(32, 33, C16)
    ),
    "0000:00:03.0": Fn(
        0x1AF4, 0x1041, 0x020000, None, ("0000:00:03.0",), None, None, C16, vectors(34, 36, C16)
    ),
    "0000:00:04.0": Fn(
        0x1AF4, 0x1053, 0xFFFF00, None, ("0000:00:04.0",), None, None, C16, vectors(37, 40, C16)
    ),
    "0000:00:05.0": Fn(
        0x1AF4, 0x1044, 0xFFFF00, None, ("0000:00:05.0",), None, None, C16, vectors(28, 29, C16)
    ),
    "0000:00:06.0": Fn(
        0x10DE,
        0x2335,
        0x030200,
        Pcie("endpoint", 256, 256, 4096, (32.0, 16), (32.0, 16), L1, NONE),
        ("0000:00:06.0",),
        256,
        None,
        C16,
        vectors(42, 49, C16),
    ),
}

# ---- ci-vm: shared/hosts/ci-vm.json (affinity "1" except IRQ 36, "0-1") --------------------
CI_VM = {
    "0000:00:00.0": Fn(0x8086, 0x0D57, 0x060000, None, ("0000:00:00.0",), None, None, C2, {}),
    "0000:00:01.0": Fn(
        0x1AF4, 0x1045, 0xFFFF00, None, ("0000:00:01.0",), None, None, C2, vectors(28, 32, ONE)
    ),
    "0000:00:02.0": Fn(
        0x1AF4, 0x1042, 0x018000, None, ("0000:00:02.0",), None, None, C2, {35: ONE, 36: C2}
    ),
    "0000:00:03.0": Fn(
        0x1AF4, 0x1041, 0x020000, None, ("0000:00:03.0",), None, None, C2, vectors(37, 39, ONE)
    ),
    "0000:00:04.0": Fn(
        0x1AF4, 0x1053, 0xFFFF00, None, ("0000:00:04.0",), None, None, C2, vectors(40, 43, ONE)
    ),
    "0000:00:05.0": Fn(
        0x1AF4, 0x1044, 0xFFFF00, None, ("0000:00:05.0",), None, None, C2, vectors(33, 34, ONE)
    ),
}

# ---- dual-socket-8gpu ------------------------------------------------------------------------
# Root port 00:02.0's hierarchy runs at MPS 128 (its downstream port 02:10.0 supports only
# 128; pcie_bus_safe programs the minimum under the root port); the three others at 256.
# Every link trains at 5GT/s x16 (the PEX 8749 is limited to 5GT/s).
CLKPM0 = {"clkpm": "0"}


def rp(mps: int) -> Pcie:
    return Pcie("root-port", 256, mps, 128, (8.0, 16), (5.0, 16), L1, NONE)


def usp(mps: int) -> Pcie:
    return Pcie("upstream-port", 256, mps, 128, (5.0, 16), (5.0, 16), L1, NONE)


def dsp(cap: int, mps: int) -> Pcie:
    return Pcie("downstream-port", cap, mps, 128, (5.0, 16), (5.0, 16), L1, NONE)


def gpu(mps: int) -> Pcie:
    return Pcie("endpoint", 256, mps, 4096, (32.0, 16), (5.0, 16), L1, NONE)


RP2, RP3 = (0x8086, 0x2F04, 0x060400), (0x8086, 0x2F08, 0x060400)
PEX, H200 = (0x10B5, 0x8749, 0x060400), (0x10DE, 0x2335, 0x030200)

DUAL = {
    # socket 0 (node 0), root port 00:02.0: MPS 128 everywhere below it
    "0000:00:02.0": Fn(*RP2, rp(128), ("0000:00:02.0",), 256, 0, N0, {}),
    "0000:01:00.0": Fn(*PEX, usp(128), ("0000:01:00.0", "0000:00:02.0"), 256, 0, N0, {}),
    "0000:02:08.0": Fn(
        *PEX,
        dsp(256, 128),
        ("0000:02:08.0", "0000:01:00.0", "0000:00:02.0"),
        256,
        0,
        N0,
        {},
        CLKPM0,
    ),
    "0000:02:10.0": Fn(
        *PEX,
        dsp(128, 128),
        ("0000:02:10.0", "0000:01:00.0", "0000:00:02.0"),
        128,
        0,
        N0,
        {},
        CLKPM0,
    ),
    "0000:03:00.0": Fn(
        *H200,
        gpu(128),
        ("0000:03:00.0", "0000:02:08.0", "0000:01:00.0", "0000:00:02.0"),
        256,
        0,
        N0,
        vectors(121, 128, ALL64),
        CLKPM0,
    ),
    "0000:04:00.0": Fn(
        *H200,
        gpu(128),
        ("0000:04:00.0", "0000:02:10.0", "0000:01:00.0", "0000:00:02.0"),
        128,
        0,
        N0,
        vectors(130, 137, ALL64),
        CLKPM0,
    ),
    # socket 0, root port 00:03.0 (Root Port 3, 8086:2f08)
    "0000:00:03.0": Fn(*RP3, rp(256), ("0000:00:03.0",), 256, 0, N0, {}),
    "0000:05:00.0": Fn(*PEX, usp(256), ("0000:05:00.0", "0000:00:03.0"), 256, 0, N0, {}),
    "0000:06:08.0": Fn(
        *PEX,
        dsp(256, 256),
        ("0000:06:08.0", "0000:05:00.0", "0000:00:03.0"),
        256,
        0,
        N0,
        {},
        CLKPM0,
    ),
    "0000:06:10.0": Fn(
        *PEX,
        dsp(256, 256),
        ("0000:06:10.0", "0000:05:00.0", "0000:00:03.0"),
        256,
        0,
        N0,
        {},
        CLKPM0,
    ),
    "0000:07:00.0": Fn(
        *H200,
        gpu(256),
        ("0000:07:00.0", "0000:06:08.0", "0000:05:00.0", "0000:00:03.0"),
        256,
        0,
        N0,
        vectors(139, 146, ALL64),
        CLKPM0,
    ),
    "0000:08:00.0": Fn(
        *H200,
        gpu(256),
        ("0000:08:00.0", "0000:06:10.0", "0000:05:00.0", "0000:00:03.0"),
        256,
        0,
        N0,
        vectors(148, 155, ALL64),
        CLKPM0,
    ),
    # socket 1 (node 1), root port 80:02.0
    "0000:80:02.0": Fn(*RP2, rp(256), ("0000:80:02.0",), 256, 1, N1, {}),
    "0000:81:00.0": Fn(*PEX, usp(256), ("0000:81:00.0", "0000:80:02.0"), 256, 1, N1, {}),
    "0000:82:08.0": Fn(
        *PEX,
        dsp(256, 256),
        ("0000:82:08.0", "0000:81:00.0", "0000:80:02.0"),
        256,
        1,
        N1,
        {},
        CLKPM0,
    ),
    "0000:82:10.0": Fn(
        *PEX,
        dsp(256, 256),
        ("0000:82:10.0", "0000:81:00.0", "0000:80:02.0"),
        256,
        1,
        N1,
        {},
        CLKPM0,
    ),
    "0000:83:00.0": Fn(
        *H200,
        gpu(256),
        ("0000:83:00.0", "0000:82:08.0", "0000:81:00.0", "0000:80:02.0"),
        256,
        1,
        N1,
        vectors(157, 164, ALL64),
        CLKPM0,
    ),
    "0000:84:00.0": Fn(
        *H200,
        gpu(256),
        ("0000:84:00.0", "0000:82:10.0", "0000:81:00.0", "0000:80:02.0"),
        256,
        1,
        N1,
        vectors(166, 173, ALL64),
        CLKPM0,
    ),
    # socket 1, root port 80:03.0
    "0000:80:03.0": Fn(*RP3, rp(256), ("0000:80:03.0",), 256, 1, N1, {}),
    "0000:85:00.0": Fn(*PEX, usp(256), ("0000:85:00.0", "0000:80:03.0"), 256, 1, N1, {}),
    "0000:86:08.0": Fn(
        *PEX,
        dsp(256, 256),
        ("0000:86:08.0", "0000:85:00.0", "0000:80:03.0"),
        256,
        1,
        N1,
        {},
        CLKPM0,
    ),
    "0000:86:10.0": Fn(
        *PEX,
        dsp(256, 256),
        ("0000:86:10.0", "0000:85:00.0", "0000:80:03.0"),
        256,
        1,
        N1,
        {},
        CLKPM0,
    ),
    "0000:87:00.0": Fn(
        *H200,
        gpu(256),
        ("0000:87:00.0", "0000:86:08.0", "0000:85:00.0", "0000:80:03.0"),
        256,
        1,
        N1,
        vectors(175, 182, ALL64),
        CLKPM0,
    ),
    "0000:88:00.0": Fn(
        *H200,
        gpu(256),
        ("0000:88:00.0", "0000:86:10.0", "0000:85:00.0", "0000:80:03.0"),
        256,
        1,
        N1,
        vectors(184, 191, ALL64),
        CLKPM0,
    ),
}

# ---- degraded-link: x8 of x16 at 8GT/s, ASPM L1 on, policy powersave ------------------------
ASPM_ON = {"clkpm": "1", "l1_aspm": "1"}
DEGRADED = {
    "0000:00:02.0": Fn(
        *RP2,
        Pcie("root-port", 256, 256, 128, (8.0, 16), (8.0, 8), L1, L1),
        ("0000:00:02.0",),
        256,
        0,
        C8,
        {},
        ASPM_ON,
    ),
    "0000:01:00.0": Fn(
        *H200,
        Pcie("endpoint", 256, 256, 4096, (32.0, 16), (8.0, 8), L1, L1),
        ("0000:01:00.0", "0000:00:02.0"),
        256,
        0,
        C8,
        vectors(40, 47, C8),
        ASPM_ON,
    ),
}

# ---- four-gpu-one-socket: dual-socket-8gpu's socket 0 alone, every port at MPS 256 ----------
# (QEMU's CPU numbering: node 0 is 0-31)
S0 = cpus(0, 31)


def switch_below(
    rp_ids: tuple[int, int, int], rp_bdf: str, bus: int, irqs: tuple[int, int]
) -> dict[str, Fn]:
    """A root port of node 0, its PEX 8749 (upstream port on ``bus``) and the two GPUs below."""
    usp_bdf = f"0000:{bus:02x}:00.0"
    out = {
        rp_bdf: Fn(*rp_ids, rp(256), (rp_bdf,), 256, 0, S0, {}),
        usp_bdf: Fn(*PEX, usp(256), (usp_bdf, rp_bdf), 256, 0, S0, {}),
    }
    for k, dev in enumerate((0x08, 0x10)):
        dsp_bdf, gpu_bdf = f"0000:{bus + 1:02x}:{dev:02x}.0", f"0000:{bus + 2 + k:02x}:00.0"
        up = (dsp_bdf, usp_bdf, rp_bdf)
        out[dsp_bdf] = Fn(*PEX, dsp(256, 256), up, 256, 0, S0, {}, CLKPM0)
        first = irqs[k]
        out[gpu_bdf] = Fn(
            *H200, gpu(256), (gpu_bdf, *up), 256, 0, S0, vectors(first, first + 7, ALL64), CLKPM0
        )
    return out


FOUR = {
    **switch_below(RP2, "0000:00:02.0", 0x01, (121, 130)),
    **switch_below(RP3, "0000:00:03.0", 0x05, (139, 148)),
}

# ---- two-gpu-one-node: two H200 under their own root ports, 8GT/s x16, MPS 256 --------------
RP8 = Pcie("root-port", 256, 256, 128, (8.0, 16), (8.0, 16), L1, NONE)
GPU8 = Pcie("endpoint", 256, 256, 4096, (32.0, 16), (8.0, 16), L1, NONE)
TWO = {
    "0000:00:02.0": Fn(*RP2, RP8, ("0000:00:02.0",), 256, 0, C16, {}, CLKPM0),
    "0000:01:00.0": Fn(
        *H200, GPU8, ("0000:01:00.0", "0000:00:02.0"), 256, 0, C16, vectors(40, 47, C16), CLKPM0
    ),
    "0000:00:03.0": Fn(*RP3, RP8, ("0000:00:03.0",), 256, 0, C16, {}, CLKPM0),
    "0000:02:00.0": Fn(
        *H200, GPU8, ("0000:02:00.0", "0000:00:03.0"), 256, 0, C16, vectors(49, 56, C16), CLKPM0
    ),
}

EXPECTED: dict[str, dict[str, Fn]] = {
    "h200-vm": H200_VM,
    # `gputunectl capture` of the same lent H200 VM: same functions, IRQs and affinities
    "h200-captured": H200_VM,
    "ci-vm": CI_VM,
    "dual-socket-8gpu": DUAL,
    "degraded-link": DEGRADED,
    "four-gpu-one-socket": FOUR,
    "two-gpu-one-node": TWO,
}
CASES = [(tree, bdf) for tree, fns in EXPECTED.items() for bdf in fns]


def host(tree: str) -> FaultKernel:
    return tree_kernel(HOSTS / tree)


def test_every_tree_on_disk_has_a_table() -> None:
    on_disk = sorted(p.name for p in HOSTS.iterdir() if (p / "gputuned-tree.json").is_file())
    assert on_disk == sorted(EXPECTED) == sorted(ALL_TREES)


@pytest.mark.parametrize("tree", sorted(EXPECTED))
def test_scan_finds_exactly_the_listed_functions(tree: str) -> None:
    assert sorted(scan(host(tree)).devices) == sorted(EXPECTED[tree])


@pytest.mark.parametrize(("tree", "bdf"), CASES)
def test_function(tree: str, bdf: str) -> None:
    want = EXPECTED[tree][bdf]
    topo = scan(host(tree))
    d = topo.devices[bdf]
    assert (d.vendor, d.device, d.config.class_code) == (want.vendor, want.device, want.class_code)
    p = d.config.pcie
    if want.pcie is None:
        assert p is None
    else:
        assert p is not None
        got = Pcie(
            p.port_type_name,
            p.mps_supported,
            p.mps,
            p.mrrs or 0,
            (p.cap_speed_gts or 0.0, p.cap_width or 0),
            (p.speed_gts or 0.0, p.width or 0),
            p.aspm_supported,
            p.aspm_enabled,
        )
        assert got == want.pcie
    assert tuple(x.bdf for x in topo.path(bdf)) == want.path
    assert topo.path_max_mps(bdf) == want.path_max_mps
    assert d.parent == (want.path[1] if len(want.path) > 1 else None)
    assert d.numa_node == want.numa_node
    assert d.local_cpus == want.local_cpus
    assert {i.irq: i.affinity for i in d.irqs} == want.irqs
    assert [i.irq for i in d.irqs] == sorted(want.irqs)
    assert d.link_aspm == want.link_files


GPUS = {
    "h200-vm": ["0000:00:06.0"],
    "h200-captured": ["0000:00:06.0"],
    "ci-vm": [],
    "dual-socket-8gpu": [
        "0000:03:00.0",
        "0000:04:00.0",
        "0000:07:00.0",
        "0000:08:00.0",
        "0000:83:00.0",
        "0000:84:00.0",
        "0000:87:00.0",
        "0000:88:00.0",
    ],
    "degraded-link": ["0000:01:00.0"],
    "four-gpu-one-socket": ["0000:03:00.0", "0000:04:00.0", "0000:07:00.0", "0000:08:00.0"],
    "two-gpu-one-node": ["0000:01:00.0", "0000:02:00.0"],
}


@pytest.mark.parametrize("tree", sorted(GPUS))
def test_gpus(tree: str) -> None:
    assert [g.bdf for g in scan(host(tree)).gpus()] == GPUS[tree]


def test_h200_vm_gpu(tree_host: Callable[[str], FaultKernel]) -> None:
    """The lent H200 as measured: Gen5 x16 of Gen5 x16, MPS 256 of 256, MRRS 4096, L1 off."""
    topo = scan(tree_host("h200-vm"))
    (g,) = topo.gpus()
    p = g.config.pcie
    assert p is not None
    assert (g.bdf, g.vendor, g.device) == ("0000:00:06.0", 0x10DE, 0x2335)
    assert (p.speed_gts, p.width, p.cap_speed_gts, p.cap_width) == (32.0, 16, 32.0, 16)
    assert (p.mps, p.mps_supported, p.mrrs) == (256, 256, 4096)
    assert (p.aspm_supported, p.aspm_enabled) == (("L1",), ())
    assert [i.irq for i in g.irqs] == [42, 43, 44, 45, 46, 47, 48, 49]
    assert g.parent is None and topo.path_max_mps(g.bdf) == 256


def test_dual_socket_mps_paths() -> None:
    """One 128-byte downstream port: its GPU's path is 128, every other GPU's 256."""
    topo = scan(host("dual-socket-8gpu"))
    assert {g.bdf: topo.path_max_mps(g.bdf) for g in topo.gpus()} == {
        "0000:03:00.0": 256,
        "0000:04:00.0": 128,
        "0000:07:00.0": 256,
        "0000:08:00.0": 256,
        "0000:83:00.0": 256,
        "0000:84:00.0": 256,
        "0000:87:00.0": 256,
        "0000:88:00.0": 256,
    }


FIRMWARE = "firmware owns ASPM"
OS_OWNS = "the OS controls ASPM (per-link ASPM files present)"
CHOICES = ("default", "performance", "powersave", "powersupersave")
POLICY = {
    "h200-vm": ("default", False, FIRMWARE),
    "h200-captured": ("default", False, FIRMWARE),
    "ci-vm": ("default", False, FIRMWARE),
    "dual-socket-8gpu": ("default", True, OS_OWNS),
    "degraded-link": ("powersave", True, OS_OWNS),
    "four-gpu-one-socket": ("default", True, OS_OWNS),
    "two-gpu-one-node": ("default", True, OS_OWNS),
}


@pytest.mark.parametrize("tree", sorted(POLICY))
def test_aspm_policy(tree: str) -> None:
    h = host(tree)
    pol = read_aspm_policy(h, scan(h), read_cmdline(h))
    value, writable, reason = POLICY[tree]
    assert (pol.value, pol.choices, pol.writable) == (value, CHOICES, writable)
    assert pol.reason.startswith(reason), pol.reason


H200_WRITE_ERRORS = {
    ASPM_POLICY,
    "/proc/irq/31/smp_affinity_list",
    "/proc/irq/33/smp_affinity_list",
}
WRITE_ERRORS = {
    "h200-vm": H200_WRITE_ERRORS,
    "h200-captured": H200_WRITE_ERRORS,
    "ci-vm": {ASPM_POLICY, "/proc/irq/36/smp_affinity_list", "/proc/irq/36/smp_affinity"},
    "dual-socket-8gpu": set(),
    "degraded-link": set(),
    "four-gpu-one-socket": set(),
    "two-gpu-one-node": set(),
}


@pytest.mark.parametrize("tree", sorted(WRITE_ERRORS))
def test_write_errors_recorded(tree: str) -> None:
    assert host(tree).recorded_refusals == dict.fromkeys(WRITE_ERRORS[tree], errno.EPERM)


def _configs() -> list[tuple[str, Path]]:
    return sorted(
        (tree, p)
        for tree in sorted(ALL_TREES)
        for p in (HOSTS / tree / "sys" / "devices").rglob("config")
    )


@pytest.mark.parametrize(("tree", "path"), _configs(), ids=lambda v: str(v)[-22:])
def test_read_registers_decodes_as_the_whole_space(tree: str, path: Path) -> None:
    """The sparse read decodes exactly what the first 256 bytes decode, in fewer reads."""
    whole = path.read_bytes()[:256]
    spans: list[tuple[int, int]] = []

    def read(off: int, size: int) -> bytes:
        spans.append((off, size))
        return whole[off : off + size]

    full = parse_config(whole)
    sparse = parse_config(read_registers(read))
    assert replace(sparse, raw=b"") == replace(full, raw=b""), f"{tree} {path}"
    read_bytes = sum(size for _off, size in spans)
    # header (16 + 4 bytes), 4 per capability, 16 more for the PCIe capability
    assert read_bytes == 20 + 4 * len(full.caps) + (16 if full.pcie else 0)
    assert read_bytes < 256


def test_read_registers_h200_gpu_reads_13_dwords() -> None:
    """The H200 of the lent VM: 13 config dwords instead of 64 (each one traps there)."""
    raw = next((HOSTS / "h200-vm" / "sys" / "devices").rglob("0000:00:06.0/config")).read_bytes()
    spans: list[tuple[int, int]] = []

    def read(off: int, size: int) -> bytes:
        spans.append((off, size))
        return raw[off : off + size]

    cfg = parse_config(read_registers(read))
    assert cfg.pcie is not None and cfg.pcie.mps_supported == 256
    assert sum(size for _off, size in spans) // 4 == 13
    assert all(off % 4 == 0 and size % 4 == 0 for off, size in spans)


def test_read_registers_short_spaces() -> None:
    """A 64-byte space (the header only) has no capabilities and says why; a shorter one is
    decoded as far as it goes and says it was cut short (never a ValueError: issue 14)."""
    raw = next((HOSTS / "h200-vm" / "sys" / "devices").rglob("0000:00:06.0/config")).read_bytes()
    header = raw[:64]
    assert header[0x06] & 0x10 and header[0x34] >= 0x40  # it does point at a capability list
    cfg = parse_config(read_registers(lambda off, size: header[off : off + size]))
    assert cfg.caps == () and cfg.pcie is None and cfg.vendor == 0x10DE
    assert cfg.state == "header only" and "run as root" in cfg.unreadable[0][1]
    short = parse_config(read_registers(lambda off, size: raw[:12][off : off + size]))
    assert short.state == "short" and short.vendor == 0x10DE and short.pcie is None
    assert "config space is 12 bytes" in short.unreadable[0][1]


def test_read_registers_stops_on_a_capability_loop() -> None:
    raw = bytearray(256)
    raw[0x06] = 0x10
    raw[0x34] = 0x40
    raw[0x40:0x42] = bytes([CAP_EXP, 0x50])
    raw[0x50:0x52] = bytes([0x05, 0x40])  # MSI, pointing back at the first
    spans: list[int] = []

    def read(off: int, size: int) -> bytes:
        spans.append(off)
        return bytes(raw[off : off + size])

    cfg = parse_config(read_registers(read))
    assert [c for c, _ in cfg.caps] == [CAP_EXP, 0x05] and cfg.msi_present
    assert spans.count(0x40) == 1 and spans.count(0x50) == 1


def test_read_bytes_asks_the_kernel_for_the_size_given(tmp_path: Path) -> None:
    """A buffered read of 4 bytes would ask for a whole buffer: for a sysfs config file that
    is all 4 KiB of config space (20 ms for the H200 behind passthrough). A pipe shows what
    was asked for: the bytes not asked for must still be in it."""
    fifo = tmp_path / "config"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)  # a writer that stays, so opening for read does not block
    try:
        os.write(fd, bytes(range(16)))
        assert tree_kernel(tmp_path).read_bytes("/config", 0, 4) == bytes(range(4))
        os.set_blocking(fd, False)
        assert os.read(fd, 64) == bytes(range(4, 16))
    finally:
        os.close(fd)
