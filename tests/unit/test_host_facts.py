"""What counts as a GPU and a CPU, and what recommend says about them (issue 31, item 9).

Seen on real hosts: a server's onboard display chip (the BMC's AMD ES1000 VGA) counted as an
inference GPU and given cores before the Tesla; a host with 4 online CPUs numbered up to 25
shown as 26 CPUs; "no shipped profile fits" above a list where shared-host fits; "CPUs of its
own" where the GPUs share cores; a reason printed twice; no word in plan about a GPU whose
firmware gives no NUMA node on a host of several.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.cli import main as cli
from gputuned.cpulist import parse_cpulist
from gputuned.engine.inspect import inspect
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.engine.recommend import recommend
from gputuned.kernel.pci import is_inference_gpu, scan
from gputuned.profile.load import parse_profile
from gputuned.profile.model import Profile
from tests.conftest import TREES_DIR
from tests.faults import tree_kernel

BMC_VGA = "0000:00:01.0"  # where the fixture puts the ES1000: before both GPUs
GPUS = ("0000:01:00.0", "0000:02:00.0")  # two-gpu-one-node's two GPUs


def copy(tree: str, tmp_path: Path) -> Path:
    root = tmp_path / tree
    shutil.copytree(TREES_DIR / tree, root, symlinks=True)
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = cli.main(list(args))
    return rc, capsys.readouterr().out


def set_online(root: Path, cpus: str) -> None:
    """Only ``cpus`` online, all on node 0 (CPUs offlined, or firmware numbering with gaps)."""
    (root / "sys/devices/system/cpu/online").write_text(f"{cpus}\n")
    (root / "sys/devices/system/node/node0/cpulist").write_text(f"{cpus}\n")


def add_display_function(
    root: Path, bdf: str, vendor: int, device: int, cls: int, driver: str | None = None
) -> None:
    """A function on the root bus as sysfs shows it: a 64-byte header and its attributes."""
    base = root / "sys/devices/pci0000:00" / bdf
    base.mkdir(parents=True)
    cfg = bytearray(64)
    cfg[0:2] = vendor.to_bytes(2, "little")
    cfg[2:4] = device.to_bytes(2, "little")
    cfg[9:12] = cls.to_bytes(3, "little")
    (base / "config").write_bytes(bytes(cfg))
    for name, value in (
        ("vendor", f"0x{vendor:04x}"),
        ("device", f"0x{device:04x}"),
        ("class", f"0x{cls:06x}"),
        ("numa_node", "0"),
        ("local_cpulist", "0-15"),
        ("irq", "10"),
    ):
        (base / name).write_text(f"{value}\n")
    if driver is not None:
        drv = root / "sys/bus/pci/drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        (base / "driver").symlink_to(f"../../../bus/pci/drivers/{driver}")
    (root / "sys/bus/pci/devices" / bdf).symlink_to(f"../../../devices/pci0000:00/{bdf}")


def two_gpus_profile(**extra: Any) -> Profile:
    return parse_profile(
        {
            "name": "t",
            "cpusets": {
                "housekeeping": {"per": "node", "cores": 1},
                "inference": {"per": "gpu", "exclude": ["housekeeping"]},
            },
            "irq": {"gpu_cpus": "inference", "others_cpus": "housekeeping"},
            "pcie_payload": {"mrrs": 4096},
            **extra,
        },
        "test",
    )


def plan(root: Path, profile: Profile) -> PlanResult:
    return plan_profile(tree_kernel(root), profile, allow_blocked=True)


def targets(result: PlanResult) -> str:
    return " ".join(f"{c.path} {c.target}" for c in result.settings)


# -- which PCI functions are inference GPUs ---------------------------------------------------


@pytest.mark.parametrize(
    ("vendor", "device", "cls", "driver", "gpu"),
    [
        (0x10DE, 0x2335, 0x030200, None, True),  # H200, 3D controller, no driver (a tree)
        (0x10DE, 0x2335, 0x030200, "nvidia", True),
        (0x10DE, 0x1EB8, 0x030000, "nvidia", True),  # a Tesla T4 shown as VGA
        (0x1002, 0x740F, 0x038000, "amdgpu", True),  # Instinct MI210
        (0x1002, 0x515E, 0x030000, None, False),  # ES1000: the BMC's VGA
        (0x1002, 0x515E, 0x030000, "radeon", False),
        (0x1A03, 0x2000, 0x030000, "ast", False),  # ASPEED BMC VGA
        (0x102B, 0x0522, 0x030000, "mgag200", False),  # Matrox G200e BMC VGA
        (0x10DE, 0x2335, 0x030200, "vfio-pci", False),  # passed to a VM: not this host's
        (0x10DE, 0x1C82, 0x030000, "nouveau", False),  # no CUDA on nouveau
        (0x8086, 0x3E92, 0x030000, "i915", False),  # a desktop's integrated graphics
        (0x1002, 0x740F, 0x038000, "vfio-pci", False),
        (0x10DE, 0x2335, 0x030200, "pci-stub", False),
        # A driver the rule does not know (the e2e guest's stand-in GPU keeps e1000e bound):
        # the vendor and class decide.
        (0x10DE, 0x2335, 0x030200, "e1000e", True),
        (0x10DE, 0x10F0, 0x040300, "snd_hda_intel", False),  # a GPU's HDMI audio
    ],
)
def test_which_functions_are_inference_gpus(
    vendor: int, device: int, cls: int, driver: str | None, gpu: bool
) -> None:
    assert is_inference_gpu(vendor, device, cls, driver) is gpu


@pytest.mark.parametrize("driver", [None, "radeon"])
def test_a_bmc_display_chip_is_not_a_gpu_and_gets_no_cores(
    tmp_path: Path, driver: str | None
) -> None:
    root = copy("two-gpu-one-node", tmp_path)
    add_display_function(root, BMC_VGA, 0x1002, 0x515E, 0x030000, driver)
    kernel = tree_kernel(root)
    assert tuple(d.bdf for d in scan(kernel).gpus()) == GPUS
    assert tuple(d.bdf for d in scan(kernel, gpu_trees_only=True).gpus()) == GPUS
    result = plan(root, two_gpus_profile())
    layout = [(g["index"], g["bdf"]) for g in result.layout["gpus"]]
    assert layout == [(0, GPUS[0]), (1, GPUS[1])]
    assert BMC_VGA not in targets(result)
    assert recommend(kernel).host.gpus == 2
    # inspect --all still lists it, as a function that is not a GPU
    devices = {d["bdf"]: d for d in inspect(kernel, all_functions=True)["devices"]}
    assert BMC_VGA not in devices or devices[BMC_VGA]["gpu"] is False


# -- a profile names GPUs to leave alone ------------------------------------------------------


def test_a_skipped_gpu_gets_nothing_and_the_plan_says_so(tmp_path: Path) -> None:
    root = copy("two-gpu-one-node", tmp_path)
    whole = plan(root, two_gpus_profile())
    assert GPUS[1] in targets(whole)  # its PCIe registers and its vectors, without skip
    result = plan(root, two_gpus_profile(gpus={"skip": [GPUS[1].upper()]}))
    assert [g["bdf"] for g in result.layout["gpus"]] == [GPUS[0]]
    assert GPUS[1] not in targets(result)
    dev = root / "sys/devices/pci0000:00/0000:00:03.0/0000:02:00.0"
    irqs = {f"/proc/irq/{n.name}/smp_affinity_list" for n in (dev / "msi_irqs").iterdir()}
    inference = set(parse_cpulist(result.sets["inference"]))
    moved = [c for c in result.settings if c.path in irqs]
    assert moved and not any(set(parse_cpulist(c.wanted)) & inference for c in moved)
    assert any(f"{GPUS[1]}: skipped ([gpus] skip)" in n for n in result.notes)
    # the GPU it kept has the node's cores to itself now
    assert result.layout["gpus"][0]["sets"]["inference"] == "2-15"
    # the other GPUs keep their indexes (nvidia-smi's, a partition's name)
    first = plan(root, two_gpus_profile(gpus={"skip": [GPUS[0]]}))
    assert [(g["index"], g["bdf"]) for g in first.layout["gpus"]] == [(1, GPUS[1])]
    # an address that names no GPU here is said, not an error: profiles move between hosts
    other = plan(root, two_gpus_profile(gpus={"skip": ["0000:99:00.0"]}))
    assert len(other.layout["gpus"]) == 2
    assert any("0000:99:00.0" in n and "no GPU" in n for n in other.notes)


def test_a_skip_that_is_not_a_pci_address_is_refused_at_load() -> None:
    with pytest.raises(errors.ProfileError, match=r"gpus.skip.*PCI address"):
        two_gpus_profile(gpus={"skip": ["GPU0"]})


# -- a GPU without a NUMA node on a host of several ------------------------------------------


def test_plan_warns_of_a_gpu_without_numa_node_and_says_what_it_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy("dual-socket-8gpu", tmp_path)
    gpu = root / "sys/devices/pci0000:80/0000:80:02.0/0000:81:00.0/0000:82:08.0/0000:83:00.0"
    (gpu / "numa_node").write_text("-1\n")
    (gpu / "local_cpulist").write_text("0-63\n")
    profile = str(Path(__file__).resolve().parents[2] / "profiles/dedicated-inference.toml")
    rc, out = run(capsys, "plan", profile, "--root", str(root), "--json")
    assert rc == 0
    data = json.loads(out)
    (warning,) = data["warnings"]
    assert warning.startswith(
        "GPU 4 0000:83:00.0: local CPUs 0-63 span NUMA nodes (sysfs numa_node -1): the "
        "firmware does not say which socket this GPU is on"
    )
    assert "the plan took it as local to every node" in warning
    assert "inference: none" in warning
    _, out = run(capsys, "plan", profile, "--root", str(root))
    assert "warning GPU 4 0000:83:00.0: local CPUs 0-63 span NUMA nodes" in " ".join(out.split())
    # one node: nothing to choose between, nothing to warn of
    _, out = run(capsys, "plan", profile, "--root", str(TREES_DIR / "h200-vm"), "--json")
    assert json.loads(out)["warnings"] == []


# -- recommend ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tree", "online", "count"),
    [("h200-vm", "0,8,16,25", 4), ("dual-socket-8gpu", "0-15,88-103", 32)],
)
def test_recommend_counts_the_online_cpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tree: str, online: str, count: int
) -> None:
    root = copy(tree, tmp_path)
    (root / "sys/devices/system/cpu/online").write_text(f"{online}\n")
    assert recommend(tree_kernel(root)).host.cpus == count
    _, out = run(capsys, "recommend", "--root", str(root))
    assert f"; {count} CPUs on " in out


def test_recommend_verdict_agrees_with_its_list(capsys: pytest.CaptureFixture[str]) -> None:
    """No GPU: no profile is recommended, and the list says why for each one."""
    rc, out = run(capsys, "recommend", "--root", str(TREES_DIR / "ci-vm"))
    assert rc == 1
    verdict, listed = out.split("candidates:")
    assert "no inference GPU" in verdict.splitlines()[0]
    if " fits:" in listed:
        assert "no shipped profile fits" not in verdict
    assert "fits: plans here" not in listed


def test_recommend_says_each_reason_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy("h200-vm", tmp_path)
    set_online(root, "0,8,16,25")  # too few for dedicated-inference, which says why
    rec = recommend(tree_kernel(root))
    assert rec.recommended == "shared-host"
    assert len(rec.reasons) == len(set(rec.reasons))
    assert any(r.startswith("dedicated-inference cannot be planned") for r in rec.reasons)
    _, out = run(capsys, "recommend", "--root", str(root))
    bullets = [line for line in out.splitlines() if line.startswith("  - ")]
    assert len(bullets) == len(set(bullets))


def test_cpus_of_its_own_only_where_no_two_gpus_share_a_core(tmp_path: Path) -> None:
    root = copy("two-gpu-one-node", tmp_path)
    set_online(root, "0-1,14-15")  # a core for housekeeping, one core for two GPUs
    rec = recommend(tree_kernel(root))
    assert rec.recommended is not None
    assert not any("of its own" in r for r in rec.reasons)
    chosen = next(c for c in rec.candidates if c.name == rec.recommended)
    assert "shared between GPUs" in chosen.why
    assert any("share" in r for r in rec.reasons)
    # where they do not share, it is said
    whole = recommend(tree_kernel(TREES_DIR / "two-gpu-one-node"))
    assert any("of its own" in r for r in whole.reasons)
