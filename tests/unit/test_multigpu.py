"""Multi-GPU and multi-socket hosts, planned on the trees: IRQs per GPU and per node, partitions
per node or per GPU, the guards, and what plan and inspect print (issue 15)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.cli import main as cli
from gputuned.cpulist import format_mask, parse_cpulist
from gputuned.engine.apply import ApplyError, apply_profile, revert_all
from gputuned.engine.inspect import inspect
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.kernel.pci import scan
from gputuned.profile.load import load_profile, parse_profile
from gputuned.profile.model import Profile
from tests.conftest import TREES_DIR
from tests.fakeproc import add_process, add_user
from tests.faults import tree_kernel
from tests.unit.test_apply import SERVER_UID, SERVER_USER, digest

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
SHIPPED = ("shared-host", "dedicated-inference", "latency-critical")
GPU_TREES = (
    "h200-vm",
    "degraded-link",
    "two-gpu-one-node",
    "four-gpu-one-socket",
    "dual-socket-8gpu",
)


def shipped(name: str) -> Profile:
    return load_profile(PROFILES / f"{name}.toml")


def plan(tree: str | Path, profile: Profile, **kw: Any) -> PlanResult:
    root = TREES_DIR / tree if isinstance(tree, str) else tree
    return plan_profile(tree_kernel(root), profile, **kw)


def node_cpus(tree: str) -> dict[int, frozenset[int]]:
    base = TREES_DIR / tree / "sys/devices/system/node"
    return {
        int(d.name[4:]): parse_cpulist((d / "cpulist").read_text())
        for d in base.iterdir()
        if d.name.startswith("node") and d.name[4:].isdigit()
    }


def gpu_vectors(tree: str | Path) -> dict[int, tuple[str, frozenset[int]]]:
    """IRQ -> (GPU BDF, its local CPUs), from sysfs (msi_irqs, local_cpulist)."""
    root = TREES_DIR / tree if isinstance(tree, str) else tree
    return {
        i.irq: (g.bdf, g.local_cpus or frozenset())
        for g in scan(tree_kernel(root)).gpus()
        for i in g.irqs
    }


def irq_targets(result: PlanResult) -> dict[int, frozenset[int]]:
    return {
        int(c.path.split("/")[3]): parse_cpulist(c.wanted)
        for c in result.settings
        if c.tuner == "irq" and c.path.startswith("/proc/irq/") and c.path.count("/") == 4
    }


def copy(tree: str, tmp_path: Path) -> Path:
    root = tmp_path / tree
    shutil.copytree(TREES_DIR / tree, root, symlinks=True)
    return root


# -- the shipped profiles on every GPU tree ---------------------------------------------------


@pytest.mark.parametrize("tree", GPU_TREES)
@pytest.mark.parametrize("name", SHIPPED)
def test_no_gpu_vector_leaves_its_node(name: str, tree: str) -> None:
    result = plan(tree, shipped(name))
    assert not result.blocked, result.blocked
    targets = irq_targets(result)
    vectors = gpu_vectors(tree)
    assert set(vectors) <= set(targets), "every GPU vector is planned"
    per_gpu: dict[str, list[int]] = {}
    for irq, (bdf, local) in vectors.items():
        assert len(targets[irq]) == 1, "spread: one CPU per vector"
        assert targets[irq] <= local, f"{tree}: irq {irq} of {bdf} goes off its node"
        per_gpu.setdefault(bdf, []).append(min(targets[irq]))
    inference = parse_cpulist(result.sets["inference"])
    for bdf, cpus in per_gpu.items():
        # a GPU's vectors spread over its own block: no CPU twice while it has CPUs to spare
        member = parse_cpulist(
            next(g for g in result.layout["gpus"] if g["bdf"] == bdf)["sets"]["inference"]
        )
        assert set(cpus) <= member <= inference
        assert len(set(cpus)) == min(len(cpus), len(member))
    assert not any("off its node" in n for n in result.notes)


@pytest.mark.parametrize("tree", GPU_TREES)
@pytest.mark.parametrize("name", SHIPPED)
def test_every_node_keeps_housekeeping_and_other_irqs_stay_off_the_server(
    name: str, tree: str
) -> None:
    result = plan(tree, shipped(name))
    housekeeping = parse_cpulist(result.sets["housekeeping"])
    inference = parse_cpulist(result.sets["inference"])
    for node, cpus in node_cpus(tree).items():
        assert housekeeping & cpus, f"node {node} has no housekeeping CPU"
        left = next(n for n in result.layout["nodes"] if n["node"] == node)["rest"]
        assert parse_cpulist(left) >= housekeeping & cpus
    vectors = gpu_vectors(tree)
    for irq, target in irq_targets(result).items():
        if irq not in vectors:
            assert target <= housekeeping and not target & inference


def test_dedicated_inference_on_eight_gpus_plans_per_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = plan("dual-socket-8gpu", shipped("dedicated-inference"))
    expected = {
        "0000:03:00.0": "1-4,33-36",
        "0000:04:00.0": "5-8,37-40",
        "0000:07:00.0": "9-12,41-44",
        "0000:08:00.0": "13-15,45-47",
        "0000:83:00.0": "17-20,49-52",
        "0000:84:00.0": "21-24,53-56",
        "0000:87:00.0": "25-28,57-60",
        "0000:88:00.0": "29-31,61-63",
    }
    layout = {g["bdf"]: g for g in result.layout["gpus"]}
    assert {b: g["sets"]["inference"] for b, g in layout.items()} == expected
    assert {b: g["vector_cpus"] for b, g in layout.items()} == expected
    assert [g["node"] for g in result.layout["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert not any(g["off_node"] for g in result.layout["gpus"])
    # spread one per core first: GPU 0's 8 vectors 121-128 go to 1, 2, 3, 4, then 33 .. 36
    targets = irq_targets(result)
    assert [min(targets[i]) for i in range(121, 129)] == [1, 2, 3, 4, 33, 34, 35, 36]
    # one isolated partition over both nodes; every node keeps its first core
    part = [c for c in result.settings if c.target == "gputuned.inference cpuset.cpus"]
    assert [c.wanted for c in part] == ["1-15,17-31,33-47,49-63"]
    assert [n["rest"] for n in result.layout["nodes"]] == ["0,32", "16,48"]
    assert result.sets["housekeeping"] == "0,16,32,48"
    # and the plan prints it per GPU and per node
    rc = cli.main(
        [
            "plan",
            "--root",
            str(TREES_DIR / "dual-socket-8gpu"),
            str(PROFILES / "dedicated-inference.toml"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "Per GPU (2 threads per core, siblings N and N+32)" in out
    assert "│ 7   │ 0000:88:00.0 │ 1    │ 16-31,48-63 │ 29-31,61-63 │ 8 → 29-31,61-63 │" in out
    assert "│ 1    │ 16-31,48-63 │ 4, 5, 6, 7 │ 16,48        │ 17-31,49-63 │" in out


def test_plan_json_has_the_layout(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        [
            "plan",
            "--root",
            str(TREES_DIR / "four-gpu-one-socket"),
            str(PROFILES / "shared-host.toml"),
            "--json",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert data["layout"]["smt"] == "2 threads per core, siblings next to each other (2k, 2k+1)"
    assert [g["sets"]["inference"] for g in data["layout"]["gpus"]] == [
        "2-5",
        "6-9",
        "10-13",
        "14-17",
    ]
    node1 = data["layout"]["nodes"][1]
    assert (node1["gpus"], node1["sets"]["inference"], node1["rest"]) == ([], "", "32-63")


def test_tensor_parallel_server_is_placed_over_every_gpus_cpus(tmp_path: Path) -> None:
    """The vLLM API server of a TP-8 server, placed by the shipped rule: moved into the one
    partition, which spans the CPUs of all 8 GPUs on both sockets (not socket 0 alone)."""
    root = copy("dual-socket-8gpu", tmp_path)
    add_user(root, SERVER_USER, SERVER_UID)  # the account the shipped rule names
    add_process(
        root,
        5000,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "-tp", "8"],
        exe="/usr/bin/python3.11",
        start_time=100,
        threads=[5001, 5002],
        cpus="0-63",
        uid=SERVER_UID,
    )
    for name in SHIPPED:
        result = plan(root, shipped(name))
        moves = [
            c for c in result.settings if c.target.startswith("pid 5000") and "cgroup" in c.target
        ]
        assert [c.wanted for c in moves] == ["/gputuned.inference"]
        (aff,) = [
            c for c in result.settings if c.target.startswith("pid 5000") and "affinity" in c.target
        ]
        used = set().union(*(parse_cpulist(v) for v in aff.data["threads"].values()))
        inference = parse_cpulist(result.sets["inference"])
        assert used <= inference
        nodes = node_cpus("dual-socket-8gpu")
        assert inference & nodes[0] and inference & nodes[1]


# -- other IRQs on their own node --------------------------------------------------------------


def add_bridge_irq(root: Path, bdf_dir: str, irq: int, nr: int = 64) -> None:
    """Give a PCI function an MSI vector (as portdrv's PME/AER service has one), for a test."""
    dev = root / bdf_dir.lstrip("/")
    (dev / "msi_irqs").mkdir(exist_ok=True)
    (dev / "msi_irqs" / str(irq)).write_text("msi\n")
    irqdir = root / f"proc/irq/{irq}"
    irqdir.mkdir(parents=True)
    (irqdir / "smp_affinity_list").write_text(f"0-{nr - 1}\n")
    (irqdir / "smp_affinity").write_text(format_mask(range(nr), nr) + "\n")
    text = (root / "proc/interrupts").read_text().splitlines(keepends=True)
    zeros = "".join(f" {0:>10d}" for _ in range(nr))
    row = f"{irq:>3d}:{zeros} PCI-MSI-{bdf_dir.rsplit('/', 1)[-1]} 0-edge  PCIe PME, aerdrv\n"
    text.insert(1, row)
    (root / "proc/interrupts").write_text("".join(text))


def test_other_irqs_go_to_housekeeping_of_their_devices_node(tmp_path: Path) -> None:
    root = copy("dual-socket-8gpu", tmp_path)
    add_bridge_irq(root, "/sys/devices/pci0000:80/0000:80:02.0", 200)
    add_bridge_irq(root, "/sys/devices/pci0000:00/0000:00:03.0", 201)
    for name in SHIPPED:
        result = plan(root, shipped(name))
        targets = irq_targets(result)
        assert targets[200] == {16, 48}, name  # node 1's housekeeping core
        assert targets[201] == {0, 32}, name
        (change,) = [c for c in result.settings if c.path == "/proc/irq/200/smp_affinity_list"]
        assert change.why == "not a GPU vector -> irq.others_cpus (housekeeping, node 1)"


# -- off-node vectors are said, not hidden ------------------------------------------------------


def test_a_set_on_one_node_sends_the_other_nodes_vectors_there_and_says_so() -> None:
    prof = parse_profile(
        {
            "name": "t",
            "cpusets": {"low": {"cpus": "1-8"}},
            "irq": {"gpu_cpus": "low"},
        },
        "test",
    )
    result = plan("dual-socket-8gpu", prof)
    off = [n for n in result.notes if "off its node" in n]
    assert len(off) == 4 and off[0] == (
        "irq: set 'low' has no CPU on node 1, the NUMA node of GPU 4 (0000:83:00.0); its 8 "
        "vectors go to 1-8, off its node"
    )
    assert [g["off_node"] for g in result.layout["gpus"]] == [False] * 4 + [True] * 4
    # GPUs 0-3 share 1-8 in one round robin: 32 vectors, each CPU four times
    targets = irq_targets(result)
    node0 = [min(targets[i]) for i in sorted(targets) if i < 157]
    assert sorted(node0) == sorted(list(range(1, 9)) * 4)


# -- the one-CPU guard ------------------------------------------------------------------------


def one_cpu_profile(**irq: Any) -> Profile:
    return parse_profile(
        {
            "name": "t",
            "cpusets": {"zero": {"cpus": "0"}},
            "irq": {"gpu_cpus": "zero", "others_cpus": "zero", **irq},
        },
        "test",
    )


def test_every_irq_on_one_cpu_of_a_big_host_is_refused() -> None:
    result = plan("dual-socket-8gpu", one_cpu_profile(), allow_blocked=True)
    (refusal,) = result.blocked
    assert refusal.target == "all IRQs"
    assert refusal.reason.startswith("every movable IRQ (64) would land on CPU 0 of 64 online CPUs")
    with pytest.raises(errors.PlanError, match="every movable IRQ"):
        plan("dual-socket-8gpu", one_cpu_profile())
    report = plan("dual-socket-8gpu", one_cpu_profile(report_only=True))
    assert not report.blocked and report.refused[-1].reason.startswith("report only:")
    # 16 CPUs: one CPU for all IRQs is the profile's choice there
    small = plan("two-gpu-one-node", one_cpu_profile())
    assert not [r for r in small.refused if r.target == "all IRQs"]


# -- partitions per node and per GPU -------------------------------------------------------------


def partition_profile(partitions: str, hk: dict[str, Any] | None = None) -> Profile:
    return parse_profile(
        {
            "name": "t",
            "cpusets": {
                "housekeeping": hk or {"per": "node", "cores": 1},
                "inference": {"per": "gpu", "exclude": ["housekeeping"]},
            },
            "cpuset": {"mode": "isolated", "cpus": "inference", "partitions": partitions},
            "irq": {"gpu_cpus": "inference", "others_cpus": "housekeeping"},
        },
        "test",
    )


def test_a_partition_per_node_is_made_read_back_and_reverted(tmp_path: Path) -> None:
    root = copy("dual-socket-8gpu", tmp_path)
    before = digest(root)
    result, report = apply_profile(tree_kernel(root), partition_profile("node"))
    assert report.failed == []
    cg = root / "sys/fs/cgroup"
    for node, cpus in ((0, "1-15,33-47"), (1, "17-31,49-63")):
        d = cg / f"gputuned.inference.node{node}"
        assert (d / "cpuset.cpus.partition").read_text().strip() == "isolated"
        assert (d / "cpuset.cpus").read_text().strip() == cpus
    assert not (cg / "gputuned.inference").exists()
    assert [p["cgroup"] for p in result.layout["partitions"]] == [
        "gputuned.inference.node0",
        "gputuned.inference.node1",
    ]
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_each_partition_is_read_back_and_an_invalid_one_is_reported(tmp_path: Path) -> None:
    """Under a parent that is not a partition root the kernel takes the writes and turns each
    partition "isolated invalid (Parent is not a partition root)": apply says which and why,
    and puts everything back."""
    root = copy("dual-socket-8gpu", tmp_path)
    host = tree_kernel(root)
    host.mkdir("/sys/fs/cgroup/m")
    host.write_text("/sys/fs/cgroup/m/cgroup.subtree_control", "+cpuset")
    before = digest(root)
    data = partition_profile("node").model_dump(exclude_none=True)
    data["cpuset"]["cgroup"] = "m/gputuned"
    with pytest.raises(ApplyError) as info:
        apply_profile(tree_kernel(root), parse_profile(data, "test"))
    msg = str(info.value)
    assert "m/gputuned.node0 cpuset.cpus.partition" in msg
    assert "isolated invalid (Parent is not a partition root)" in msg
    assert digest(root) == before


def test_a_partition_per_gpu(tmp_path: Path) -> None:
    result = plan("dual-socket-8gpu", partition_profile("gpu"))
    made = {c.target: c.wanted for c in result.settings if c.target.endswith("cpuset.cpus")}
    assert made == {
        "gputuned.inference.gpu0 cpuset.cpus": "1-4,33-36",
        "gputuned.inference.gpu1 cpuset.cpus": "5-8,37-40",
        "gputuned.inference.gpu2 cpuset.cpus": "9-12,41-44",
        "gputuned.inference.gpu3 cpuset.cpus": "13-15,45-47",
        "gputuned.inference.gpu4 cpuset.cpus": "17-20,49-52",
        "gputuned.inference.gpu5 cpuset.cpus": "21-24,53-56",
        "gputuned.inference.gpu6 cpuset.cpus": "25-28,57-60",
        "gputuned.inference.gpu7 cpuset.cpus": "29-31,61-63",
    }
    root = copy("dual-socket-8gpu", tmp_path)
    _, report = apply_profile(tree_kernel(root), partition_profile("gpu"))
    assert report.failed == []
    part = root / "sys/fs/cgroup/gputuned.inference.gpu7/cpuset.cpus.partition"
    assert part.read_text().strip() == "isolated"


def test_gpus_sharing_cores_cannot_have_a_partition_each() -> None:
    # node 0 keeps 14 cores for housekeeping: its 4 GPUs share 2 cores
    hk = {"numa_node": 0, "cores": 14}
    result = plan("dual-socket-8gpu", partition_profile("gpu", hk), allow_blocked=True)
    (refusal,) = [r for r in result.blocked if r.target == "partitions gputuned.inference.*"]
    assert "gputuned.inference.gpu0 and gputuned.inference.gpu2 on 14,46" in refusal.reason
    assert "use partitions = 'node'" in refusal.reason


def test_a_layout_without_housekeeping_on_a_node_is_refused_in_plan() -> None:
    prof = partition_profile("one", {"cpus": "0"})
    result = plan("dual-socket-8gpu", prof, allow_blocked=True)
    assert [(r.tuner, r.target) for r in result.blocked] == [("cpuset", "housekeeping on node 1")]
    with pytest.raises(errors.PlanError, match=r"node 1 .* keeps 0 whole core"):
        plan("dual-socket-8gpu", prof)


# -- inspect: topology per GPU, NVML beside sysfs ----------------------------------------------


def test_inspect_shows_each_gpus_node_local_cpus_and_smt() -> None:
    topo = inspect(tree_kernel(TREES_DIR / "dual-socket-8gpu"))["topology"]
    assert topo["smt"] == "2 threads per core, siblings N and N+32"
    assert [(n["node"], n["cpus"], n["cores"], n["gpus"]) for n in topo["nodes"]] == [
        (0, "0-15,32-47", "16 cores", [0, 1, 2, 3]),
        (1, "16-31,48-63", "16 cores", [4, 5, 6, 7]),
    ]
    g4 = topo["gpus"][4]
    assert (g4["bdf"], g4["node"], g4["local_cpus"], g4["local_cores"]) == (
        "0000:83:00.0",
        1,
        "16-31,48-63",
        "16 cores",
    )
    assert g4["nvml_cpu_affinity"] is None and g4["findings"] == []
    one = inspect(tree_kernel(TREES_DIR / "h200-vm"))["topology"]
    assert one["smt"] == "unknown (no topology/thread_siblings_list): each CPU counted as a core"


def with_nvml(root: Path, affinities: list[str]) -> None:
    meta_path = root / "gputuned-tree.json"
    meta = json.loads(meta_path.read_text())
    bdfs = [g.bdf for g in scan(tree_kernel(root)).gpus()]
    meta["nvml"] = [
        {"index": i, "bdf": b, "name": "NVIDIA H200", "pids": [], "cpu_affinity": a}
        for i, (b, a) in enumerate(zip(bdfs, affinities, strict=True))
    ]
    meta_path.write_text(json.dumps(meta))


def test_nvml_affinity_that_disagrees_with_sysfs_is_a_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy("two-gpu-one-node", tmp_path)
    with_nvml(root, ["0-15", "0-7"])
    topo = inspect(tree_kernel(root))["topology"]
    assert topo["nvml"] is True
    assert [g["nvml_cpu_affinity"] for g in topo["gpus"]] == ["0-15", "0-7"]
    assert topo["gpus"][0]["findings"] == []
    (finding,) = topo["gpus"][1]["findings"]
    assert finding["level"] == "warning"
    assert finding["message"].startswith(
        "NVML's CPU affinity (0-7) differs from sysfs local_cpulist (0-15)"
    )
    assert cli.main(["inspect", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "warning GPU 1 0000:02:00.0: NVML's CPU affinity (0-7) differs" in out
    assert "2 threads per core, siblings next to each other (2k, 2k+1)" in out


def test_a_gpu_without_numa_node_does_not_take_a_nodes_cores(tmp_path: Path) -> None:
    """Firmware without _PXM for one GPU: sysfs says numa_node -1 and every CPU is local. The
    GPUs that do sit on node 1 keep its cores; the one without a node is told and shares."""
    root = copy("dual-socket-8gpu", tmp_path)
    gpu = root / "sys/devices/pci0000:80/0000:80:02.0/0000:81:00.0/0000:82:08.0/0000:83:00.0"
    (gpu / "numa_node").write_text("-1\n")
    (gpu / "local_cpulist").write_text("0-63\n")
    result = plan(root, shipped("dedicated-inference"))
    members = {g["index"]: g["sets"].get("inference") for g in result.layout["gpus"]}
    assert [members[i] for i in (5, 6, 7)] == [
        "17-21,49-53",
        "22-26,54-58",
        "27-31,59-63",
    ]
    assert members[4] == ""
    assert "cpusets.inference: GPU 4 (local CPUs 0-63): no core left for them" in " ".join(
        result.notes
    )
    topo = inspect(tree_kernel(root))["topology"]
    (finding,) = topo["gpus"][4]["findings"]
    assert finding["message"].startswith("local CPUs 0-63 span NUMA nodes (sysfs numa_node -1)")
