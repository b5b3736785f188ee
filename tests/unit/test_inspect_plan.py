"""inspect, plan and capture against every tree; plan writes nothing."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cli import main as cli
from gputuned.engine.inspect import inspect
from gputuned.engine.plan import plan_profile
from gputuned.kernel.capture import capture
from gputuned.profile.load import load_profile, parse_profile
from tests.conftest import ALL_TREES, TREES_DIR
from tests.faults import tree_kernel

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
SHIPPED = sorted(p.name for p in PROFILES.glob("*.toml"))


def _digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def _copy_tree(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(TREES_DIR / name, dest, symlinks=True)
    return dest


def _plan(tree: str, profile: str | dict[str, object]):  # type: ignore[no-untyped-def]
    prof = (
        load_profile(PROFILES / profile)
        if isinstance(profile, str)
        else parse_profile(profile, "test")
    )
    return plan_profile(tree_kernel(TREES_DIR / tree), prof)


# -- inspect ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["h200-vm", "h200-captured"])
def test_inspect_h200(tree: str) -> None:
    data = inspect(tree_kernel(TREES_DIR / tree))
    assert data["gpu_count"] == 1
    (gpu,) = data["devices"]
    assert gpu["bdf"] == "0000:00:06.0"
    assert (gpu["vendor"], gpu["device"]) == ("0x10de", "0x2335")
    assert gpu["link"] == {"cap_speed_gts": 32.0, "cap_width": 16, "speed_gts": 32.0, "width": 16}
    assert gpu["mps"] == {"supported": 256, "current": 256, "path_max": 256}
    assert gpu["mrrs"] == 4096
    assert gpu["aspm"]["supported"] == ["L1"] and gpu["aspm"]["enabled"] == []
    assert [i["irq"] for i in gpu["irqs"]] == list(range(42, 50))
    assert {i["affinity"] for i in gpu["irqs"]} == {"0-15"}
    assert gpu["path"] == ["0000:00:06.0"]
    assert gpu["local_cpus"] == "0-15"
    assert gpu["findings"] == []
    pol = data["aspm_policy"]
    assert (pol["value"], pol["writable"]) == ("default", False)
    assert pol["reason"].startswith("firmware owns ASPM")
    assert gpu["name"] == ("NVIDIA H200" if tree == "h200-captured" else None)
    assert gpu["driver"] == ("nvidia" if tree == "h200-captured" else None)


def test_inspect_degraded_link_flags_width_fault_and_speed_note() -> None:
    data = inspect(tree_kernel(TREES_DIR / "degraded-link"))
    (gpu,) = data["devices"]
    assert gpu["link"] == {"cap_speed_gts": 32.0, "cap_width": 16, "speed_gts": 8.0, "width": 8}
    assert gpu["findings"] == [
        {
            "level": "fault",
            "message": "link trained at x8 of x16: lanes are lost (reseat the card, check the "
            "slot, riser or cable)",
        },
        {"level": "note", "message": "link at 8 GT/s of 32 GT/s: may be idle downclocking"},
    ]
    assert gpu["aspm"]["enabled"] == ["L1"]
    assert data["aspm_policy"]["value"] == "powersave"
    assert data["aspm_policy"]["writable"] is True


def test_inspect_slow_link_is_a_fault_when_nvml_says_busy(tmp_path: Path) -> None:
    root = _copy_tree("h200-captured", tmp_path)
    cfg = root / "sys/devices/pci0000:00/0000:00:06.0/config"
    raw = bytearray(cfg.read_bytes())
    # PCIe capability at 0x60 (see test_pci); LnkSta at +0x12: speed code 4 = 16 GT/s.
    raw[0x60 + 0x12] = (raw[0x60 + 0x12] & 0xF0) | 0x4
    cfg.write_bytes(bytes(raw))
    idle = inspect(tree_kernel(root))["devices"][0]["findings"]
    assert idle == [
        {"level": "note", "message": "link at 16 GT/s of 32 GT/s: may be idle downclocking"}
    ]
    meta = json.loads((root / "gputuned-tree.json").read_text())
    meta["nvml"][0]["utilization_gpu"] = 87
    (root / "gputuned-tree.json").write_text(json.dumps(meta))
    busy = inspect(tree_kernel(root))["devices"][0]["findings"]
    assert busy == [
        {"level": "fault", "message": "link at 16 GT/s of 32 GT/s while the GPU is busy"}
    ]


def test_inspect_all_lists_switch_path_and_path_minimum() -> None:
    data = inspect(tree_kernel(TREES_DIR / "dual-socket-8gpu"), all_functions=True)
    by = {d["bdf"]: d for d in data["devices"]}
    assert len(by) == 24 and data["gpu_count"] == 8
    assert by["0000:04:00.0"]["path"] == [
        "0000:04:00.0",
        "0000:02:10.0",
        "0000:01:00.0",
        "0000:00:02.0",
    ]
    assert by["0000:04:00.0"]["mps"]["path_max"] == 128
    assert by["0000:03:00.0"]["mps"]["path_max"] == 256
    assert by["0000:83:00.0"]["numa_node"] == 1
    assert by["0000:83:00.0"]["local_cpus"] == "16-31,48-63"  # SMT siblings N and N+32


def test_inspect_ci_vm_has_no_pcie() -> None:
    data = inspect(tree_kernel(TREES_DIR / "ci-vm"), all_functions=True)
    assert data["devices"] == [] and data["gpu_count"] == 0


# -- plan ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ALL_TREES)
@pytest.mark.parametrize("profile", SHIPPED)
def test_plan_writes_nothing_on_any_tree(tree: str, profile: str, tmp_path: Path) -> None:
    root = _copy_tree(tree, tmp_path)
    before = _digest(root)
    host = tree_kernel(root)
    try:
        result = plan_profile(host, load_profile(PROFILES / profile))
    except errors.PlanError as exc:
        # Only the 2-CPU CI machine cannot hold the dedicated profiles' two housekeeping CPUs.
        assert tree == "ci-vm" and profile != "shared-host.toml", exc
    else:
        json.dumps(result.to_json())
        assert result.changes or result.refused or result.pending_boot
    assert host.writes == []
    assert _digest(root) == before


def test_plan_h200_shared_host() -> None:
    result = _plan("h200-captured", "shared-host.toml")
    assert result.sets == {"housekeeping": "0", "inference": "1-8", "others": "0,9-15"}
    got = {(c.tuner, c.target): (c.current, c.wanted) for c in result.changes}
    gpu_irqs = {k: v for k, v in got.items() if k[1].endswith("(nvidia)")}
    assert gpu_irqs == {
        ("irq", f"irq {n} (nvidia)"): ("0-15", str(1 + (n - 42) % 8)) for n in range(42, 50)
    }
    assert got[("irq", "default_smp_affinity")] == ("ffff", "0001")
    assert got[("cpuset", "gputuned.inference cpuset.cpus")] == ("-", "1-8")
    assert got[("cpuset", "gputuned.inference cpuset.cpus.exclusive")] == ("-", "1-8")
    assert got[("cpuset", "gputuned.inference cpuset.cpus.partition")] == ("-", "root")
    assert got[("cpuset", "cgroup gputuned.inference")] == ("absent", "present")
    refused = {(r.tuner, r.target): r.reason for r in result.refused}
    assert refused[("irq", "irq 31 (virtio0-req.0)")].startswith("unmovable (EPERM)")
    assert refused[("irq", "irq 33 (virtio1-req.0)")].startswith("unmovable (EPERM)")
    assert refused[("pcie_aspm", "policy")].startswith("not possible here: firmware owns ASPM")
    assert ("irq", "irq 31 (virtio0-req.0)") not in got
    assert result.pending_boot == []


def test_plan_ci_vm_without_gpu_plans_cpu_and_irq_work() -> None:
    result = _plan("ci-vm", "shared-host.toml")
    assert (
        "no GPU found on this host: PCIe tuning has nothing to do; CPU and IRQ work is still planned"
        in result.notes
    )
    assert result.sets == {"housekeeping": "0", "inference": "1", "others": "0"}
    assert any(c.tuner == "irq" for c in result.changes)
    (cpuset,) = [r for r in result.refused if r.tuner == "cpuset"]
    assert (
        "cgroup hybrid host" in cpuset.reason
        and "falling back to per-thread affinity on 1" in cpuset.reason
    )
    assert not any(c.tuner.startswith("pcie") for c in result.changes)


def _mps_profile(mps: object, allow: bool) -> dict[str, object]:
    return {
        "name": "mps",
        "pcie_payload": {"mps": mps, "mrrs": "keep", "allow_mps_change": allow},
    }


def test_plan_mps_above_path_minimum_is_refused() -> None:
    result = _plan("dual-socket-8gpu", _mps_profile(256, True))
    refused = {r.target: r.reason for r in result.refused if r.tuner == "pcie_payload"}
    assert refused["0000:04:00.0 MPS"] == (
        "MPS 256 is above the path's minimum DevCap MPS 128 (0000:02:10.0 supports 128): "
        "a receiver drops larger TLPs as malformed"
    )
    # The sibling under the same root port is limited by the shared ports above it.
    assert refused["0000:03:00.0 MPS"].startswith("MPS 256 is above 128, the smallest DevCap MPS")
    assert not [
        c
        for c in result.changes
        if c.target.startswith(("0000:03", "0000:04", "0000:02", "0000:01", "0000:00:02"))
    ]


def test_plan_mps_needs_opt_in() -> None:
    result = _plan("degraded-link", _mps_profile(128, False))
    (r,) = [r for r in result.refused if r.tuner == "pcie_payload"]
    assert r.reason == (
        "MPS would change to 128 on 2 function(s) under root port 0000:00:02.0; "
        "set pcie_payload.allow_mps_change = true to allow it"
    )
    assert not [c for c in result.changes if c.tuner == "pcie_payload"]


def test_plan_mps_lowering_goes_endpoint_first() -> None:
    result = _plan("degraded-link", _mps_profile(128, True))
    assert [
        (c.target, c.current, c.wanted) for c in result.changes if c.tuner == "pcie_payload"
    ] == [
        ("0000:01:00.0 MPS", "256", "128"),
        ("0000:00:02.0 MPS", "256", "128"),
    ]


def test_plan_aspm_on_degraded_link() -> None:
    prof = {"name": "a", "pcie_aspm": {"policy": "performance", "gpu_links": "disable"}}
    result = _plan("degraded-link", prof)
    got = [(c.target, c.current, c.wanted, c.path) for c in result.changes]
    assert got[0] == (
        "policy",
        "powersave",
        "performance",
        "/sys/module/pcie_aspm/parameters/policy",
    )
    assert (
        "0000:01:00.0 link l1_aspm",
        "1",
        "0",
        "/sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/link/l1_aspm",
    ) in got


def test_plan_bootargs_pending() -> None:
    result = _plan("h200-captured", "latency-critical.toml")
    assert result.pending_boot == [
        "nohz_full=2-15",
        "rcu_nocbs=2-15",
        "irqaffinity=0-1",
        "pcie_aspm.policy=performance",
    ]


def test_plan_cpuset_names_cpus_the_host_lacks() -> None:
    prof = {
        "name": "x",
        "cpusets": {"hk": {"cpus": "0"}, "big": {"cpus": "1-31"}},
        "cpuset": {"mode": "root", "cpus": "big"},
    }
    with pytest.raises(errors.PlanError) as info:
        _plan("h200-captured", prof)
    # refused whole, not trimmed to the CPUs the host has (issue 15)
    assert "cpusets.big.cpus: names CPUs 16-31 this host does not have online" in str(info.value)


@pytest.mark.parametrize(
    ("cpuset", "note"),
    [
        (
            {"cpus": "inference"},
            "cpuset: mode 'none' makes no partition and pins nothing: [cpuset] does nothing; "
            "cpus = 'inference' takes effect with mode = 'root', 'isolated' or 'affinity'",
        ),
        (
            {"cpus": "inference", "favordynmods": True},
            "cpuset: mode 'none' makes no partition and pins nothing: cpus = 'inference' does "
            "nothing; it takes effect with mode = 'root', 'isolated' or 'affinity'",
        ),
        ({}, "cpuset: mode 'none' makes no partition and pins nothing: [cpuset] does nothing"),
        (
            {"mode": "affinity", "cpus": "inference", "cgroup": "mine", "in_place": False},
            "cpuset: mode 'affinity' makes no cgroup: cgroup and in_place do nothing; they take "
            "effect with mode = 'root' or 'isolated'",
        ),
    ],
)
def test_a_cpuset_table_that_does_nothing_says_so(cpuset: dict[str, object], note: str) -> None:
    """Issue 31, item 8: `[cpuset] cpus = "..."` with mode left at "none" planned without a
    word."""
    prof = {
        "name": "x",
        "cpusets": {"hk": {"cpus": "0"}, "inference": {"cpus": "1-3"}},
        "cpuset": cpuset,
    }
    notes = _plan("h200-captured", prof).notes
    assert note in notes, notes


def test_a_cpuset_table_that_does_something_has_no_such_note() -> None:
    notes = _plan("h200-captured", "shared-host.toml").notes
    assert not any("does nothing" in n for n in notes), notes


# -- capture ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["h200-captured", "dual-socket-8gpu", "degraded-link"])
def test_capture_of_a_tree_is_complete(tree: str, tmp_path: Path) -> None:
    """Capturing a tree gives a tree that inspects and plans the same: capture misses nothing."""
    dest = tmp_path / "copy"
    progress: list[str] = []
    capture(tree_kernel(TREES_DIR / tree), dest, progress=progress.append)
    assert progress[-1].startswith("done: ") and "PCI devices" in progress
    a = inspect(tree_kernel(TREES_DIR / tree), all_functions=True)
    b = inspect(tree_kernel(dest), all_functions=True)
    a.pop("root"), b.pop("root")
    assert a == b
    prof = load_profile(PROFILES / "shared-host.toml")
    pa = plan_profile(tree_kernel(TREES_DIR / tree), prof).to_json()
    pb = plan_profile(tree_kernel(dest), prof).to_json()
    pa.pop("root"), pb.pop("root")
    assert pa == pb
    assert (
        json.loads((dest / "gputuned-tree.json").read_text())["write_errors"]
        == json.loads((TREES_DIR / tree / "gputuned-tree.json").read_text())["write_errors"]
    )


def test_capture_refuses_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    with pytest.raises(errors.GputunedError, match="is not empty"):
        capture(tree_kernel(TREES_DIR / "ci-vm"), tmp_path)


# -- CLI ----------------------------------------------------------------------------------------


def test_cli_inspect_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["inspect", "--root", str(TREES_DIR / "h200-vm"), "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"][0]["link"]["cap_speed_gts"] == 32.0


def test_cli_plan_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    root = str(TREES_DIR / "h200-captured")
    assert cli.main(["plan", str(PROFILES / "shared-host.toml"), "--root", root]) == 0
    text = capsys.readouterr().out
    assert "irq 42 (nvidia)" in text and "refused pcie_aspm policy" in text
    assert cli.main(["plan", str(PROFILES / "shared-host.toml"), "--root", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"] == "shared-host"


def test_cli_bad_profile_exit_4_names_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[pcie_payload]\nmrrs = 5000\n')
    rc = cli.main(["plan", str(bad), "--root", str(TREES_DIR / "h200-vm")])
    err = capsys.readouterr().err
    assert rc == 4
    assert "invalid profile; nothing was changed" in err and "pcie_payload.mrrs" in err


def test_cli_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"cpusets", "irq", "cpuset", "process", "bootargs"} <= set(schema["properties"])


def test_cli_missing_profile(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["plan", "/nonexistent/p.toml", "--root", str(TREES_DIR / "ci-vm")])
    assert rc == 4
    assert "/nonexistent/p.toml does not exist" in capsys.readouterr().err
