"""Each process on its own GPU's CPUs (issue 18): which GPU a process uses (NVML, /dev/nvidiaN
open, CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES), per-GPU and per-node partitions, the
union case, and a GPU opened after the daemon placed the process. On the 8-GPU two-socket
tree (tests/data/hosts/dual-socket-8gpu: node 0 = 0-15,32-47 with GPUs 0-3, node 1 =
16-31,48-63 with GPUs 4-7)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gputuned.cpulist import parse_cpulist
from gputuned.daemon import placing
from gputuned.daemon.core import Daemon
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.kernel import gpuuse as host_gpuuse
from gputuned.kernel.gpuuse import device_minors, driver_minors, gpu_environ
from gputuned.profile.load import parse_profile
from gputuned.profile.model import Profile
from gputuned.tuners.gpuuse import Gpu, env_gpus
from tests.fakeproc import add_process, add_user
from tests.faults import tree_kernel
from tests.unit.conftest import Events
from tests.unit.test_apply import SERVER_UID, SERVER_USER, digest
from tests.unit.test_multigpu import copy
from tests.unit.test_pci import GPUS

TREE = "dual-socket-8gpu"
BDFS = tuple(GPUS[TREE])  # in PCI order: gputuned's GPU indexes 0-7
#: Minor numbers the driver gave each GPU: not the GPU's index, so that a mapping by index
#: instead of by the driver's table fails.
MINOR = {i: 7 - i for i in range(8)}
#: Each GPU's member of the per-GPU set (tests/unit/test_multigpu.py test_a_partition_per_gpu).
MEMBER = {
    0: "1-4,33-36",
    1: "5-8,37-40",
    2: "9-12,41-44",
    3: "13-15,45-47",
    4: "17-20,49-52",
    5: "21-24,53-56",
    6: "25-28,57-60",
    7: "29-31,61-63",
}
#: The housekeeping cores of the two nodes: the only CPUs outside the partitions.
OUTSIDE = parse_cpulist("0,16,32,48")
VLLM = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "-tp", "8"]
SPAWN = ["/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()"]


def gpu_host(tmp_path: Path, nvml: list[dict[str, Any]] | None = None) -> Path:
    """The 8-GPU tree with the driver's view of its GPUs: device nodes (a tree holds no device
    files: gputuned-tree.json says what each /dev path is), /proc/driver/nvidia/gpus."""
    root = copy(TREE, tmp_path)
    add_user(root, SERVER_USER, SERVER_UID)
    meta = json.loads((root / "gputuned-tree.json").read_text())
    meta["char_devices"] = {
        **{f"/dev/nvidia{m}": [195, m] for m in range(8)},
        "/dev/nvidiactl": [195, 255],
        "/dev/nvidia-modeset": [195, 254],
        "/dev/nvidia-uvm": [510, 0],
    }
    if nvml is not None:
        meta["nvml"] = nvml
    (root / "gputuned-tree.json").write_text(json.dumps(meta))
    for i, bdf in enumerate(BDFS):
        d = root / "proc/driver/nvidia/gpus" / bdf
        d.mkdir(parents=True)
        (d / "information").write_text(f"Model: \t\t NVIDIA H200\nDevice Minor: \t {MINOR[i]}\n")
    return root


def opens(root: Path, pid: int, *devices: str) -> None:
    """Process ``pid`` has these device paths open (fd 3, 4, ... as /proc/PID/fd shows)."""
    fd = root / "proc" / str(pid) / "fd"
    fd.mkdir(exist_ok=True)
    have = len(list(fd.iterdir()))
    for n, dev in enumerate(devices, start=3 + have):
        (fd / str(n)).symlink_to(dev)


def environ(root: Path, pid: int, **env: str) -> None:
    data = b"PATH=/usr/bin\0" + b"".join(f"{k}={v}\0".encode() for k, v in env.items())
    (root / "proc" / str(pid) / "environ").write_bytes(data)


def server(root: Path, gpus: range = range(8), *, open_now: bool = True) -> dict[str, int]:
    """A vLLM-shaped TP server: API 5000 -> EngineCore 5001 -> one worker per GPU (5010 + i),
    each with its GPU's device node, nvidiactl and nvidia-uvm open (as CUDA holds them)."""
    add_process(root, 5000, comm="python3", cmdline=VLLM, exe="/usr/bin/python3.11",
                start_time=100, threads=[5100], cpus="0-63", uid=SERVER_UID)  # fmt: skip
    add_process(root, 5001, comm="VLLM::EngineCor", cmdline=SPAWN, exe="/usr/bin/python3.11",
                start_time=110, cpus="0-63", ppid=5000, uid=SERVER_UID)  # fmt: skip
    pids = {"api": 5000, "engine": 5001}
    for i in gpus:
        pid = 5010 + i
        add_process(root, pid, comm=f"VLLM::Worker_TP{i}", cmdline=SPAWN,
                    exe="/usr/bin/python3.11", start_time=120 + i, threads=[pid + 100],
                    cpus="0-63", ppid=5001, uid=SERVER_UID)  # fmt: skip
        if open_now:
            opens(root, pid, "/dev/nvidiactl", f"/dev/nvidia{MINOR[i]}", "/dev/nvidia-uvm")
        pids[f"worker{i}"] = pid
    return pids


def per_gpu(partitions: str = "gpu", **rule: Any) -> Profile:
    return parse_profile(
        {
            "name": "per-gpu",
            "cpusets": {
                "housekeeping": {"per": "node", "cores": 1},
                "inference": {"per": "gpu", "exclude": ["housekeeping"]},
            },
            "cpuset": {"mode": "root", "cpus": "inference", "partitions": partitions},
            "process": [
                {
                    "name": "server",
                    "match": {"user": SERVER_USER, "cmdline": "vllm"},
                    "cpus": "inference",
                    "move_to_partition": True,
                    "by_gpu": True,
                    "nice": -10,
                    **rule,
                }
            ],
        },
        "test",
    )


def placed(result: PlanResult, pid: int) -> tuple[str | None, frozenset[int]]:
    """(cgroup it is moved to or None, the CPUs its threads get) in a plan."""
    mine = [c for c in result.settings if c.target.startswith(f"pid {pid} ")]
    cg = next((c.wanted for c in mine if c.kind == "proc_cgroup"), None)
    aff = next(c for c in mine if c.target.endswith(" affinity"))
    cpus = {frozenset(parse_cpulist(v)) for v in aff.data["threads"].values()}
    assert len(cpus) == 1, cpus
    return cg, cpus.pop()


# ---- the environment --------------------------------------------------------------------------


def gpus(*names: str) -> list[Gpu]:
    """GPUs in NVML (PCI) order, with UUIDs GPU-aaaa0..., GPU-aaaa1..."""
    return [Gpu(i, BDFS[i], f"GPU-aaaa{i}-{i:04x}", MINOR[i], n) for i, n in enumerate(names)]


H200 = gpus(*["NVIDIA H200"] * 8)
MIXED = gpus("NVIDIA H200", "NVIDIA L4", "NVIDIA H200", "NVIDIA L4")


@pytest.mark.parametrize(
    ("env", "among", "want"),
    [
        ({}, H200, None),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, H200, {0, 2}),  # one model: PCI order
        ({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, MIXED, {1}),
        ({"CUDA_VISIBLE_DEVICES": "0,9,1"}, H200, {0}),  # CUDA stops at an invalid entry
        ({"CUDA_VISIBLE_DEVICES": ""}, H200, set()),  # no GPU at all
        ({"CUDA_VISIBLE_DEVICES": "GPU-aaaa5"}, H200, {5}),  # a unique UUID prefix
        ({"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}, H200, set()),  # ambiguous: names none
        ({"NVIDIA_VISIBLE_DEVICES": "4,5", "CUDA_VISIBLE_DEVICES": "1"}, H200, {5}),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa6-0006"}, H200, {6}),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, H200, set(range(8))),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, H200, set()),
        ({"CUDA_VISIBLE_DEVICES": "1,\u00b2"}, H200, {1}),  # "²" is no index: the list ends
    ],
)
def test_the_environment_maps_to_gpus(
    env: dict[str, str], among: list[Gpu], want: set[int] | None
) -> None:
    got, why = env_gpus(env, among)
    assert why == ""
    assert got == (None if want is None else frozenset(want))


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"CUDA_VISIBLE_DEVICES": "1"}, "fastest-first"),  # GPUs of two models, CUDA's order
        ({"CUDA_VISIBLE_DEVICES": "MIG-1234"}, "MIG"),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-ffff"}, "names no GPU"),
    ],
)
def test_an_environment_gputuned_cannot_map_says_why(env: dict[str, str], reason: str) -> None:
    got, why = env_gpus(env, MIXED)
    assert got is None and reason in why


# ---- what the kernel shows, read as hostile input ------------------------------------------------


def test_device_nodes_are_read_by_number_and_only_gpus_count(tmp_path: Path) -> None:
    root = gpu_host(tmp_path)
    add_process(root, 700, comm="x", cmdline=["x"], exe="/usr/bin/x", start_time=5)
    opens(root, 700, "/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/null",
          "socket:[12345]", "/dev/nvidia3", "/dev/nvidia9")  # fmt: skip
    (root / "proc/700/fd/notanfd").symlink_to("/dev/nvidia2")
    host = tree_kernel(root)
    assert device_minors(host, 700) == {3}  # 195:3; nvidia9 is no device of this host
    assert device_minors(host, 701) == frozenset()  # no such process
    assert driver_minors(host) == {MINOR[i]: BDFS[i] for i in range(8)}


def test_descriptors_past_the_limit_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = gpu_host(tmp_path)
    add_process(root, 700, comm="x", cmdline=["x"], exe="/usr/bin/x", start_time=5)
    opens(root, 700, *["/dev/null"] * 5, "/dev/nvidia3")
    monkeypatch.setattr(host_gpuuse, "FD_LIMIT", 5)
    assert device_minors(tree_kernel(root), 700) == frozenset()
    monkeypatch.setattr(host_gpuuse, "FD_LIMIT", 6)
    assert device_minors(tree_kernel(root), 700) == {3}


def test_a_hostile_environment_is_read_bounded_and_without_error(tmp_path: Path) -> None:
    root = gpu_host(tmp_path)
    add_process(root, 700, comm="x", cmdline=["x"], exe="/usr/bin/x", start_time=5)
    env = root / "proc/700/environ"
    # The variable past the read limit is not seen; binary junk and a key without '=' are no
    # error; a value with control characters is dropped.
    env.write_bytes(
        b"\xff\xfe\x00NOEQUALS\0CUDA_DEVICE_ORDER=PCI\x1b[2J\0"
        + b"JUNK=" + b"x" * host_gpuuse.ENVIRON_LIMIT + b"\0CUDA_VISIBLE_DEVICES=3\0"
    )  # fmt: skip
    assert gpu_environ(tree_kernel(root), 700) == {}
    env.write_bytes(b"CUDA_VISIBLE_DEVICES=3\0CUDA_VISIBLE_DEVICES=5\0")
    assert gpu_environ(tree_kernel(root), 700) == {
        "CUDA_VISIBLE_DEVICES": "3"
    }  # the first, as getenv
    env.unlink()  # another user's process: environ not readable
    assert gpu_environ(tree_kernel(root), 700) == {}


# ---- placement ------------------------------------------------------------------------------------


def test_tensor_parallel_workers_each_go_to_their_gpus_partition(tmp_path: Path) -> None:
    """TP-8 over two sockets, a partition per GPU: each worker in its GPU's partition on that
    GPU's CPUs; API server and engine (no GPU; their tree uses GPUs on both nodes) outside
    the partitions on the CPUs of both nodes no partition holds, and the plan says so."""
    root = gpu_host(tmp_path)
    pids = server(root)
    before = digest(root)
    result = plan_profile(tree_kernel(root), per_gpu("gpu"))
    for i in range(8):
        assert placed(result, pids[f"worker{i}"]) == (
            f"/gputuned.inference.gpu{i}",
            parse_cpulist(MEMBER[i]),
        ), i
    for role in ("api", "engine"):
        assert placed(result, pids[role]) == (None, OUTSIDE), role
        note = next(n for n in result.notes if f"pid {pids[role]} uses" in n)
        assert "stays outside them" in note and "0,16,32,48" in note, note
    _, report = apply_profile(tree_kernel(root), per_gpu("gpu"))
    assert report.failed == []
    for i in range(8):
        procs = root / f"sys/fs/cgroup/gputuned.inference.gpu{i}/cgroup.procs"
        assert procs.read_text().split() == [str(pids[f"worker{i}"])]
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_a_server_on_one_node_goes_into_that_nodes_partition(tmp_path: Path) -> None:
    """TP-4 on GPUs 4-7 (node 1), a partition per node: every process of the tree in node 1's
    partition; each worker on its own GPU's CPUs, the API server on those of all four."""
    root = gpu_host(tmp_path)
    pids = server(root, range(4, 8))
    result = plan_profile(tree_kernel(root), per_gpu("node"))
    for i in range(4, 8):
        assert placed(result, pids[f"worker{i}"]) == (
            "/gputuned.inference.node1",
            parse_cpulist(MEMBER[i]),
        )
    four = frozenset().union(*(parse_cpulist(MEMBER[i]) for i in range(4, 8)))
    assert placed(result, pids["api"]) == ("/gputuned.inference.node1", four)
    assert not [n for n in result.notes if "stays outside" in n]


def test_a_process_using_gpus_on_two_nodes_gets_the_union_outside_the_partitions(
    tmp_path: Path,
) -> None:
    root = gpu_host(tmp_path)
    pids = server(root, range(0))
    opens(root, pids["api"], f"/dev/nvidia{MINOR[0]}", f"/dev/nvidia{MINOR[4]}")
    result = plan_profile(tree_kernel(root), per_gpu("node"))
    assert placed(result, pids["api"]) == (None, OUTSIDE)
    (note,) = [n for n in result.notes if f"pid {pids['api']} uses" in n]
    assert "GPUs 0, 4 on node(s) 0, 1, in 2 partitions" in note, note
    assert "gputuned.inference.node0, gputuned.inference.node1" in note
    # With one partition over both nodes there is one place to go: the members of both GPUs.
    one = plan_profile(tree_kernel(root), per_gpu("one"))
    both = parse_cpulist(MEMBER[0]) | parse_cpulist(MEMBER[4])
    assert placed(one, pids["api"]) == ("/gputuned.inference", both)


def test_a_process_that_was_in_a_partition_leaves_it_when_it_uses_a_second_node(
    tmp_path: Path,
) -> None:
    root = gpu_host(tmp_path)
    pids = server(root, range(0))
    opens(root, pids["api"], f"/dev/nvidia{MINOR[1]}")
    _, report = apply_profile(tree_kernel(root), per_gpu("node"))
    assert report.failed == []
    status = (root / "proc/5000/cgroup").read_text()
    assert status == "0::/gputuned.inference.node0\n"
    opens(root, pids["api"], f"/dev/nvidia{MINOR[6]}")
    result = plan_profile(tree_kernel(root), per_gpu("node"))
    move = next(
        c for c in result.settings if c.target.startswith("pid 5000 ") and "cgroup" in c.target
    )
    assert move.wanted == "/user.slice/user-0.slice/session-1.scope"  # where it came from
    assert revert_all(tree_kernel(root)).failed == []


def test_without_gpu_sends_the_gpu_less_processes_to_a_named_set(tmp_path: Path) -> None:
    root = gpu_host(tmp_path)
    pids = server(root, range(2))
    result = plan_profile(tree_kernel(root), per_gpu("gpu", without_gpu="housekeeping"))
    assert placed(result, pids["api"]) == (None, OUTSIDE)
    assert placed(result, pids["worker1"])[0] == "/gputuned.inference.gpu1"


def test_the_environment_places_a_worker_before_it_opens_its_gpu(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES at exec: by index (one model: PCI order) and, with NVML, by UUID;
    a worker whose device nodes name more GPUs than its environment counts only those."""
    nvml = [
        {"index": i, "bdf": b, "name": "NVIDIA H200", "pids": [], "uuid": f"GPU-{i}e57-aa", "minor": MINOR[i]}
        for i, b in enumerate(BDFS)
    ]  # fmt: skip
    root = gpu_host(tmp_path, nvml)
    pids = server(root, range(3), open_now=False)
    environ(root, pids["worker0"], CUDA_VISIBLE_DEVICES="5")
    environ(root, pids["worker1"], CUDA_VISIBLE_DEVICES="GPU-6e57")
    environ(root, pids["worker2"], CUDA_VISIBLE_DEVICES="2,3")
    opens(root, pids["worker2"], *(f"/dev/nvidia{MINOR[i]}" for i in (0, 1, 2)))  # all it sees
    result = plan_profile(tree_kernel(root), per_gpu("gpu"))
    assert placed(result, pids["worker0"])[0] == "/gputuned.inference.gpu5"
    assert placed(result, pids["worker1"])[0] == "/gputuned.inference.gpu6"
    assert placed(result, pids["worker2"])[0] == "/gputuned.inference.gpu2"


def test_nvml_wins_over_device_nodes(tmp_path: Path) -> None:
    nvml = [
        {"index": i, "bdf": b, "name": "NVIDIA H200", "pids": [5013] if i == 3 else [], "minor": MINOR[i]}
        for i, b in enumerate(BDFS)
    ]  # fmt: skip
    root = gpu_host(tmp_path, nvml)
    pids = server(root, range(4), open_now=False)
    opens(root, pids["worker3"], *(f"/dev/nvidia{MINOR[i]}" for i in range(4)))
    result = plan_profile(tree_kernel(root), per_gpu("gpu"))
    assert placed(result, pids["worker3"])[0] == "/gputuned.inference.gpu3"


def test_uses_gpu_matches_by_device_node_without_nvml(tmp_path: Path) -> None:
    root = gpu_host(tmp_path)
    add_process(root, 800, comm="python3", cmdline=["python3", "x.py"], exe="/usr/bin/python3",
                start_time=9, cpus="0-63", uid=SERVER_UID)  # fmt: skip
    opens(root, 800, f"/dev/nvidia{MINOR[6]}")
    prof = parse_profile(
        {"name": "t", "process": [{"name": "g6", "match": {"uses_gpu": 6}, "nice": 5}]}, "test"
    )
    result = plan_profile(tree_kernel(root), prof)
    assert [c.target for c in result.changes] == ["pid 800 (python3, 1 threads) nice"]
    assert any("device nodes" in n for n in result.notes)


# ---- a GPU opened later ------------------------------------------------------------------------


PER_GPU_TOML = """
name = "per-gpu"
[cpusets.housekeeping]
per = "node"
cores = 1
[cpusets.inference]
per = "gpu"
exclude = ["housekeeping"]
[cpuset]
mode = "root"
cpus = "inference"
partitions = "gpu"
[[process]]
name = "server"
match.user = "inference"
match.cmdline = "vllm"
cpus = "inference"
move_to_partition = true
by_gpu = true
nice = -10
[daemon]
gpu_scan_interval_s = 1
"""


def test_a_worker_that_opens_its_gpu_later_is_moved_to_it(tmp_path: Path, events: Events) -> None:
    """The daemon places a worker at spawn, before it has a GPU (its tree uses none yet: all
    the rule's GPUs, outside the per-GPU partitions); once it opens /dev/nvidiaN, the next GPU
    scan moves it into that GPU's partition, and the API server with it (its tree now uses
    GPU 6 only). Stopping the daemon puts everything back."""
    root = gpu_host(tmp_path)
    prof = tmp_path / "per-gpu.toml"
    prof.write_text(PER_GPU_TOML)
    before = digest(root)
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    pids = server(root, range(6, 7), open_now=False)
    time.sleep((d.watcher.timeout or 0) if d.watcher else 0)  # the next polling scan is due
    d._on_proc_events()
    worker = pids["worker6"]
    assert worker in d.placed
    assert (
        root / f"proc/{worker}/cgroup"
    ).read_text() == "0::/user.slice/user-0.slice/session-1.scope\n"
    assert "Cpus_allowed_list:\t0,16,32,48" in (root / f"proc/{worker}/status").read_text()
    opens(root, worker, "/dev/nvidiactl", f"/dev/nvidia{MINOR[6]}")
    placing.gpu_scan(d)
    assert (root / f"proc/{worker}/cgroup").read_text() == "0::/gputuned.inference.gpu6\n"
    assert f"Cpus_allowed_list:\t{MEMBER[6]}" in (root / f"proc/{worker}/status").read_text()
    assert (root / "proc/5000/cgroup").read_text() == "0::/gputuned.inference.gpu6\n"
    assert d.ctx is not None and d.ctx.gpu_use is not None
    assert worker in d.ctx.gpu_use.opened  # it has its GPU: later scans leave it alone
    placing.gpu_scan(d)
    assert d.stop() == 0
    for pid in (5000, 5001, worker):
        assert "Cpus_allowed_list:\t0-63" in (root / f"proc/{pid}/status").read_text()

    def mine(k: str) -> bool:  # the processes and their cgroup came after `before`
        return "/50" in k or "user.slice" in k

    assert {k: v for k, v in digest(root).items() if not mine(k)} == {
        k: v for k, v in before.items() if not mine(k)
    }
