"""Config space that lies: reserved encodings, all-ones, header-only and truncated reads.

Each case takes a tree's real registers and changes the bytes a failing device would show
(issue 14, findings 19-21): a register that reads all-ones has the reserved Max_Payload_Size
encoding 7 in DevCap and DevCtl; a GPU that fell off the bus (or sits in D3cold) reads all-ones
in every byte while sysfs still holds the vendor and class the kernel cached at enumeration; an
unprivileged read returns only the first 64 bytes (drivers/pci/pci-sysfs.c pci_read_config).
Each must become a finding for that device alone, named by field, and never a traceback, a
dropped GPU or a placeholder value in a plan.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from gputuned.cli import main as cli
from gputuned.engine.inspect import inspect
from gputuned.engine.plan import plan_profile
from gputuned.kernel.pciconfig import CAP_EXP, DEVCAP, DEVCTL, parse_config
from gputuned.profile.load import parse_profile
from tests.faults import tree_kernel
from tests.unit.test_apply import tree_copy

GPU = "0000:03:00.0"  # the first of the eight GPUs of dual-socket-8gpu
SWITCH_PORT = "0000:02:08.0"  # the downstream port above it
PAYLOAD = {
    "name": "payload",
    "pcie_payload": {"mrrs": 4096, "mps": "max-safe", "allow_mps_change": True},
}


def config_path(root: Path, bdf: str) -> Path:
    return next((root / "sys" / "devices").rglob(f"{bdf}/config"))


def pcie_offset(raw: bytes) -> int:
    cfg = parse_config(raw)
    return next(off for cap, off in cfg.caps if cap == CAP_EXP)


def set_field(root: Path, bdf: str, reg: int, mask: int, shift: int, code: int) -> None:
    path = config_path(root, bdf)
    raw = bytearray(path.read_bytes())
    at = pcie_offset(bytes(raw)) + reg
    value = struct.unpack_from("<H", raw, at)[0]
    struct.pack_into("<H", raw, at, (value & ~mask) | (code << shift))
    path.write_bytes(bytes(raw))


def by_bdf(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["bdf"]: d for d in data["devices"]}


def messages(dev: dict[str, Any]) -> str:
    return " | ".join(f["message"] for f in dev["findings"])


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# -- finding 19: reserved Max_Payload_Size -------------------------------------------------


@pytest.mark.parametrize(
    ("reg", "mask", "shift", "field"),
    [
        (DEVCAP, 0x7, 0, "DevCap Max_Payload_Size"),
        (DEVCTL, 0xE0, 5, "DevCtl Max_Payload_Size"),
    ],
)
def test_reserved_mps_is_unreadable_for_that_device_only(
    tmp_path: Path, reg: int, mask: int, shift: int, field: str
) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    set_field(root, GPU, reg, mask, shift, 7)
    data = inspect(tree_kernel(root))
    devs = by_bdf(data)
    assert data["gpu_count"] == 8 and len(devs) == 8, "one bad function hides no other device"
    bad = devs[GPU]
    assert f"{field} unreadable" in messages(bad) and "encoding 7 is reserved" in messages(bad)
    assert all(f["level"] == "unreadable" for f in bad["findings"] if field in f["message"])
    for bdf, dev in devs.items():
        if bdf != GPU:
            assert dev["mps"]["supported"] == 256 and "unreadable" not in messages(dev)


def test_reserved_mps_on_a_port_is_named_on_the_gpu_below_it(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    set_field(root, SWITCH_PORT, DEVCAP, 0x7, 0, 6)
    devs = by_bdf(inspect(tree_kernel(root)))
    assert devs[GPU]["mps"]["path_max"] is None
    assert f"{SWITCH_PORT} DevCap Max_Payload_Size unreadable" in messages(devs[GPU])
    plan = plan_profile(tree_kernel(root), parse_profile(PAYLOAD, "t"))
    refused = {r.target: r.reason for r in plan.refused}
    assert "DevCap Max_Payload_Size unreadable" in refused[f"{GPU} MPS"]
    assert not any(c.key == f"pcie:{GPU}:MPS" for c in plan.settings)
    # The GPUs under the other root ports are planned as before.
    assert any(c.key == "pcie:0000:83:00.0:MRRS" for c in plan.settings)


def test_reserved_mrrs_is_refused_not_a_placeholder(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    set_field(root, GPU, DEVCTL, 0x7000, 12, 7)
    plan = plan_profile(tree_kernel(root), parse_profile(PAYLOAD, "t"))
    assert not any(c.key == f"pcie:{GPU}:MRRS" for c in plan.settings), "no 'MRRS 0 -> 4096'"
    assert all(c.current not in ("0", "None") for c in plan.settings if c.kind == "pcie")
    refused = {r.target: r.reason for r in plan.refused}
    assert "DevCtl Max_Read_Request_Size unreadable" in refused[f"{GPU} MRRS"]


def test_reserved_mps_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    set_field(root, GPU, DEVCAP, 0x7, 0, 7)
    set_field(root, GPU, DEVCTL, 0xE0, 5, 7)
    prof = tmp_path / "p.toml"
    prof.write_text(
        'name = "payload"\n[pcie_payload]\nmrrs = 512\nmps = "max-safe"\nallow_mps_change = true\n'
    )
    code, out, err = run_cli(capsys, "inspect", "--root", str(root))
    assert code == 0 and "Traceback" not in err
    assert "DevCap Max_Payload_Size unreadable" in " ".join(out.split())
    code, out, err = run_cli(capsys, "plan", "--root", str(root), str(prof))
    assert code == 0, err
    text = " ".join(out.split())
    assert "DevCtl Max_Payload_Size unreadable" in text and "4096 → 512" in text  # other GPUs
    assert "0 → 512" not in text and "None" not in text
    code, out, err = run_cli(capsys, "apply", "--root", str(root), str(prof), "--json")
    assert code == 0, err
    assert json.loads(out)["failed"] == []


# -- finding 20: a GPU that reads all-ones --------------------------------------------------


def test_gpu_reading_all_ones_is_not_responding_not_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_copy("h200-vm", tmp_path, server=False)
    path = config_path(root, "0000:00:06.0")
    path.write_bytes(b"\xff" * len(path.read_bytes()))
    data = inspect(tree_kernel(root))
    assert data["gpu_count"] == 1
    (gpu,) = data["devices"]
    assert gpu["vendor"] == "0x10de" and gpu["class"] == "0x030200"  # from sysfs
    assert "not responding" in messages(gpu) and "all-ones" in messages(gpu)
    plan = plan_profile(tree_kernel(root), parse_profile(PAYLOAD, "t"))
    refused = {r.target: r.reason for r in plan.refused}
    assert "not responding" in refused["0000:00:06.0 MRRS"]
    assert not [c for c in plan.settings if c.kind == "pcie"]
    code, out, err = run_cli(capsys, "inspect", "--root", str(root))
    assert code == 0 and "No GPUs found" not in out and "not responding" in out, err


# -- finding 21: config space readable only in its first 64 bytes -----------------------------


def test_header_only_config_says_run_as_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_copy("h200-vm", tmp_path, server=False)
    path = config_path(root, "0000:00:06.0")
    path.write_bytes(path.read_bytes()[:64])
    (gpu,) = inspect(tree_kernel(root))["devices"]
    assert "run as root to read config space" in messages(gpu)
    code, out, err = run_cli(capsys, "inspect", "--root", str(root))
    assert code == 0 and "run as root to read config space" in " ".join(out.split()), err
    plan = plan_profile(tree_kernel(root), parse_profile(PAYLOAD, "t"))
    refused = {r.target: r.reason for r in plan.refused}
    assert "run as root to read config space" in refused["0000:00:06.0 MRRS"]


# -- shorter still, and capabilities that run off the end -------------------------------------


def test_config_shorter_than_the_header_is_a_finding(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    path = config_path(root, GPU)
    path.write_bytes(path.read_bytes()[:12])
    devs = by_bdf(inspect(tree_kernel(root)))
    assert len(devs) == 8
    assert "config space is 12 bytes" in messages(devs[GPU])


@pytest.mark.parametrize("size", [0, 10])
def test_a_gpu_whose_config_cannot_be_read_stays_a_gpu_and_keeps_its_cpus(
    tmp_path: Path, size: int
) -> None:
    """Issue 30, item 9: a GPU whose config space read gave 0 or 10 bytes dropped out (its class
    read as all-ones), and a set of its local CPUs widened to every CPU. sysfs still names it an
    NVIDIA 3D controller: it stays a GPU, reported unreadable, and keeps its CPUs."""
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    prof = parse_profile(
        {"name": "t", "cpusets": {"g": {"gpu_local": 0}}, "irq": {"gpu_cpus": "g"}}, "t"
    )
    before = plan_profile(tree_kernel(root), prof).sets["g"]
    path = config_path(root, GPU)
    path.write_bytes(path.read_bytes()[:size])
    devs = by_bdf(inspect(tree_kernel(root)))
    assert len(devs) == 8
    assert f"config space is {size} bytes" in messages(devs[GPU])
    assert devs[GPU]["vendor"] == "0x10de" and devs[GPU]["class"] == "0x030200"  # from sysfs
    assert plan_profile(tree_kernel(root), prof).sets["g"] == before


def test_pcie_capability_past_the_end_is_a_finding(tmp_path: Path) -> None:
    root = tree_copy("h200-vm", tmp_path, server=False)
    path = config_path(root, "0000:00:06.0")
    raw = bytearray(path.read_bytes()[:256])
    raw[0x34] = 0xFC  # the capability list now starts with a PCIe capability at 0xfc
    raw[0xFC:0x100] = bytes([CAP_EXP, 0x00, 0x02, 0x00])
    path.write_bytes(bytes(raw))
    (gpu,) = inspect(tree_kernel(root))["devices"]
    assert "PCI Express capability at 0xfc unreadable: runs past the end" in messages(gpu)


def test_gpu_not_responding_keeps_its_link_aspm(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    for bdf in (GPU, "0000:04:00.0"):  # L1 on: the kernel shows l1_aspm on L1-capable links
        (config_path(root, bdf).parent / "link" / "l1_aspm").write_text("1\n")
    path = config_path(root, GPU)
    path.write_bytes(b"\xff" * len(path.read_bytes()))
    prof = parse_profile({"name": "links", "pcie_aspm": {"gpu_links": "disable"}}, "t")
    plan = plan_profile(tree_kernel(root), prof)
    refused = {r.target: r.reason for r in plan.refused}
    assert refused[f"{GPU} link"].startswith("not responding: config space reads all-ones")
    assert not any(c.target.startswith(GPU) for c in plan.settings)
    assert any(c.target.startswith("0000:04:00.0 link") for c in plan.settings)


def test_read_cut_short_inside_the_pcie_registers_is_not_decoded_as_zeros(
    tmp_path: Path,
) -> None:
    """Found by benchmarks/config_fuzz.py: the PCIe registers half read were zeros (MPS 128)."""
    root = tree_copy("h200-vm", tmp_path, server=False)
    path = config_path(root, "0000:00:06.0")
    raw = bytearray(path.read_bytes())
    at = pcie_offset(bytes(raw))
    raw[at + 1] = 0  # the last capability in the list: nothing past it is looked for
    path.write_bytes(bytes(raw[: at + DEVCTL]))  # DevCap can be read, DevCtl on cannot
    (gpu,) = inspect(tree_kernel(root))["devices"]
    assert gpu["mps"] is None and "the device cut the read short" in messages(gpu)


def test_inspect_all_lists_a_function_whose_pcie_capability_became_unreadable(
    tmp_path: Path,
) -> None:
    """Found by benchmarks/config_fuzz.py: --all listed PCIe functions only, so a port read
    as the header alone was named nowhere."""
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    path = config_path(root, "0000:81:00.0")  # a switch's upstream port
    path.write_bytes(path.read_bytes()[:64])
    devs = by_bdf(inspect(tree_kernel(root), all_functions=True))
    assert "run as root to read config space" in messages(devs["0000:81:00.0"])
    assert len(devs) == 24
