"""gputuned's config-space parser against an independent one: the real ``lspci``.

Every function of every tree is written out in the dump format ``lspci -xxxx`` prints, read
back with ``lspci -vv -nn -D -F <dump>`` (pciutils), and each field lspci decodes is compared
with ``gputuned.kernel.pciconfig``: identity, port type, DevCap/DevCtl payload sizes, LnkCap,
LnkCtl ASPM and LnkSta. lspci is a test dependency (``scripts/test`` installs it); without it
this module fails rather than skips, because a skipped cross-check looks like a passing one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from gputuned.kernel.pci import PciDevice, scan
from tests.faults import FaultKernel, tree_kernel

HOSTS = Path(__file__).resolve().parents[1] / "data" / "hosts"

# PCIe functions per tree, counted by hand from the trees (see tests/data/build_trees.py), so a
# parser that stops finding PCIe capabilities cannot pass by comparing nothing with nothing.
PCIE_FUNCTIONS = {
    "h200-vm": 1,  # the H200; the host bridge and the virtio devices are conventional PCI
    "h200-captured": 1,  # `gputunectl capture` of the same VM
    "ci-vm": 0,  # virtio on conventional PCI only
    "dual-socket-8gpu": 24,  # 4 root ports, 4 upstream + 8 downstream switch ports, 8 GPUs
    "degraded-link": 2,  # root port + H200
    "four-gpu-one-socket": 12,  # 2 root ports, 2 upstream + 4 downstream switch ports, 4 GPUs
    "two-gpu-one-node": 4,  # 2 root ports, 2 GPUs
}
ALL_FUNCTIONS = {
    "h200-vm": 7,
    "h200-captured": 7,
    "ci-vm": 6,
    "dual-socket-8gpu": 24,
    "degraded-link": 2,
    "four-gpu-one-socket": 12,
    "two-gpu-one-node": 4,
}

# lspci's names (ls-caps.c cap_express) -> gputuned's PORT_TYPES names.
LSPCI_PORT_TYPES = {
    "Endpoint": "endpoint",
    "Legacy Endpoint": "legacy-endpoint",
    "Root Port": "root-port",
    "Upstream Port": "upstream-port",
    "Downstream Port": "downstream-port",
    "PCI-Express to PCI/PCI-X Bridge": "pcie-to-pci-bridge",
    "PCI/PCI-X to PCI-Express Bridge": "pci-to-pcie-bridge",
    "Root Complex Integrated Endpoint": "rc-integrated-endpoint",
    "Root Complex Event Collector": "rc-event-collector",
}
# lspci's aspm_support()/aspm_enabled() words -> gputuned's tuples.
LSPCI_ASPM = {
    "not supported": (),
    "Disabled": (),
    "L0s": ("L0s",),
    "L1": ("L1",),
    "L0s L1": ("L0s", "L1"),
}


@dataclass(frozen=True)
class LspciFunction:
    bdf: str
    class_code: int  # base class and subclass, as -nn shows them
    vendor: int
    device: int
    port_type: str | None  # None: no Express capability
    devcap_mps: int | None = None
    devctl_mps: int | None = None
    mrrs: int | None = None
    lnkcap: tuple[float | None, int, tuple[str, ...]] | None = None
    lnkctl_aspm: tuple[str, ...] | None = None
    lnksta: tuple[float | None, int] | None = None


def lspci_path() -> str:
    path = shutil.which("lspci")
    if path is None:
        pytest.fail(
            "lspci not found: the cross-check needs pciutils; run `apt-get install pciutils` "
            "(scripts/test installs it)",
            pytrace=False,
        )
    return path


def render_dump(host: FaultKernel, devices: list[PciDevice]) -> str:
    """The text ``lspci -xxxx`` prints: a header line per function, then "off: hh ..." lines.

    The bytes are the tree's own (its config files' first 256), not what gputuned read:
    gputuned reads only the registers it decodes, and lspci must see the whole space."""
    out = []
    for d in devices:
        raw = host.read_bytes(f"{d.sysfs}/config", 0, 256)
        out.append(f"{d.bdf} Class {d.config.class_code >> 8:04x}: {d.vendor:04x}:{d.device:04x}")
        for off in range(0, len(raw), 16):
            width = 2 if off < 0x100 else 3
            out.append(f"{off:0{width}x}: " + " ".join(f"{b:02x}" for b in raw[off : off + 16]))
        out.append("")
    return "\n".join(out) + "\n"


def run_lspci(dump: Path) -> str:
    proc = subprocess.run(
        [lspci_path(), "-vv", "-nn", "-D", "-F", str(dump)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"lspci failed ({proc.returncode}): {proc.stderr}"
    return proc.stdout


_HEADER = re.compile(
    r"^(?P<bdf>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) .*?\[(?P<cls>[0-9a-f]{4})\]: "
    r".*\[(?P<ven>[0-9a-f]{4}):(?P<dev>[0-9a-f]{4})\]"
)
_EXPRESS = re.compile(
    r"^\tCapabilities: \[[0-9a-f]+\] Express \(v\d\) (?P<type>.+?)(?: \(Slot[+-]\))?, "
)
_SPEED = r"(?P<speed>[\d.]+GT/s|unknown)"


def _speed(text: str) -> float | None:
    return None if text == "unknown" else float(text.removesuffix("GT/s"))


def _one(pattern: str, text: str, what: str, bdf: str) -> re.Match[str]:
    m = re.search(pattern, text, re.M | re.S)
    assert m is not None, f"{bdf}: lspci printed no {what} in:\n{text}"
    return m


def parse_lspci(text: str) -> dict[str, LspciFunction]:
    out: dict[str, LspciFunction] = {}
    for block in text.strip("\n").split("\n\n"):
        lines = block.splitlines()
        h = _HEADER.match(lines[0])
        assert h is not None, f"unexpected lspci header: {lines[0]!r}"
        bdf = h["bdf"]
        ident = {
            "bdf": bdf,
            "class_code": int(h["cls"], 16),
            "vendor": int(h["ven"], 16),
            "device": int(h["dev"], 16),
        }
        start = next((i for i, ln in enumerate(lines) if _EXPRESS.match(ln)), None)
        if start is None:
            out[bdf] = LspciFunction(port_type=None, **ident)
            continue
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].startswith("\tCapabilities:")),
            len(lines),
        )
        cap = "\n".join(lines[start:end])
        express = _EXPRESS.match(lines[start])
        assert express is not None
        devcap = _one(r"\bDevCap:\s+MaxPayload (\d+) bytes", cap, "DevCap", bdf)
        devctl = _one(
            r"\bDevCtl:.*?MaxPayload (\d+) bytes, MaxReadReq (\d+) bytes", cap, "DevCtl", bdf
        )
        lnkcap = _one(
            rf"\bLnkCap:\s+Port #\d+, Speed {_SPEED}, Width x(?P<width>\d+), "
            r"ASPM (?P<aspm>not supported|L0s L1|L0s|L1)",
            cap,
            "LnkCap",
            bdf,
        )
        lnkctl = _one(r"\bLnkCtl:\s+ASPM (Disabled|L0s L1|L0s|L1)\b", cap, "LnkCtl", bdf)
        lnksta = _one(
            rf"\bLnkSta:\s+Speed {_SPEED}(?: \([a-z]+\))?, Width x(?P<width>\d+)",
            cap,
            "LnkSta",
            bdf,
        )
        out[bdf] = LspciFunction(
            port_type=LSPCI_PORT_TYPES[express["type"]],
            devcap_mps=int(devcap[1]),
            devctl_mps=int(devctl[1]),
            mrrs=int(devctl[2]),
            lnkcap=(_speed(lnkcap["speed"]), int(lnkcap["width"]), LSPCI_ASPM[lnkcap["aspm"]]),
            lnkctl_aspm=LSPCI_ASPM[lnkctl[1]],
            lnksta=(_speed(lnksta["speed"]), int(lnksta["width"])),
            **ident,
        )
    return out


def gputuned_view(d: PciDevice) -> LspciFunction:
    """The same fields as gputuned decodes them."""
    p = d.config.pcie
    ident = {
        "bdf": d.bdf,
        "class_code": d.config.class_code >> 8,
        "vendor": d.vendor,
        "device": d.device,
    }
    if p is None:
        return LspciFunction(port_type=None, **ident)
    assert p.cap_width is not None and p.width is not None
    return LspciFunction(
        port_type=p.port_type_name,
        devcap_mps=p.mps_supported,
        devctl_mps=p.mps,
        mrrs=p.mrrs,
        lnkcap=(p.cap_speed_gts, p.cap_width, p.aspm_supported),
        lnkctl_aspm=p.aspm_enabled,
        lnksta=(p.speed_gts, p.width),
        **ident,
    )


def test_every_tree_has_a_count() -> None:
    trees = sorted(p.name for p in HOSTS.iterdir() if (p / "gputuned-tree.json").is_file())
    assert trees == sorted(PCIE_FUNCTIONS), "add the new tree's function counts here"


@pytest.mark.parametrize("tree", sorted(PCIE_FUNCTIONS))
def test_lspci_agrees_with_gputuned(tree: str, tmp_path: Path) -> None:
    host = tree_kernel(HOSTS / tree)
    topo = scan(host)
    devices = list(topo.devices.values())
    assert len(devices) == ALL_FUNCTIONS[tree]
    dump = tmp_path / f"{tree}.lspci"
    dump.write_text(render_dump(host, devices))
    theirs = parse_lspci(run_lspci(dump))
    ours = {d.bdf: gputuned_view(d) for d in devices}

    assert sorted(theirs) == sorted(ours), "lspci and gputuned see different functions"
    for bdf in sorted(ours):
        assert theirs[bdf] == ours[bdf], f"{tree} {bdf}: lspci != gputuned"

    checked = [bdf for bdf, f in theirs.items() if f.port_type is not None]
    assert len(checked) == PCIE_FUNCTIONS[tree], f"{tree}: PCIe functions lspci decoded"
    assert len([d for d in topo.devices.values() if d.config.pcie]) == PCIE_FUNCTIONS[tree]


def test_cross_check_is_not_vacuous() -> None:
    assert sum(PCIE_FUNCTIONS.values()) == 44
