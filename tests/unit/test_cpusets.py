"""CPU sets resolved on hosts of every shape: whole cores, per-GPU and per-node sets, refusals,
the housekeeping guard, and the static checks of several partitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputuned.errors import PlanError, ProfileError
from gputuned.kernel.topology import GpuRef, HostCpus
from gputuned.profile.cpuresolve import housekeeping_guard, resolve_cpusets
from gputuned.profile.cpusets import ResolvedCpus
from gputuned.profile.load import load_profile
from gputuned.profile.model import Profile
from tests.unit.test_profile import problems

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "profiles"
SHIPPED = ("shared-host", "dedicated-inference", "latency-critical")


def cpus(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


# -- hosts: the shapes the shipped profiles must fit ---------------------------------------------


def smt_pairs(pairs: list[tuple[int, int]]) -> tuple[frozenset[int], ...]:
    return tuple(frozenset(p) for p in pairs)


# The lent H200 host: 16 vCPUs, one NUMA node, one GPU, no SMT (lscpu: 1 thread per core).
HOST16 = HostCpus(
    online=cpus("0-15"),
    numa={0: cpus("0-15")},
    gpus=(GpuRef(0, "0000:19:00.0", 0, cpus("0-15"), "NVIDIA H200"),),
)
# A small CI machine: two CPUs, no GPU, no NUMA information.
HOST2 = HostCpus(online=cpus("0-1"))
# 2 GPUs on one node: 8 cores, siblings next to each other (2k, 2k+1).
HOST_2GPU = HostCpus(
    online=cpus("0-15"),
    numa={0: cpus("0-15")},
    gpus=tuple(GpuRef(i, f"0000:0{i + 1}:00.0", 0, cpus("0-15")) for i in range(2)),
    smt=smt_pairs([(2 * k, 2 * k + 1) for k in range(8)]),
)
# 4 GPUs on socket 0 of two: 2 x 16 cores, siblings next to each other; node 1 has no GPU.
NODE0_ADJ, NODE1_ADJ = cpus("0-31"), cpus("32-63")
HOST_4GPU = HostCpus(
    online=cpus("0-63"),
    numa={0: NODE0_ADJ, 1: NODE1_ADJ},
    gpus=tuple(GpuRef(i, f"0000:0{i + 3}:00.0", 0, NODE0_ADJ) for i in range(4)),
    smt=smt_pairs([(2 * k, 2 * k + 1) for k in range(32)]),
)
# 8 GPUs on two sockets, 4 per socket, siblings N and N+32 (node0 0-15,32-47).
NODE0, NODE1 = cpus("0-15,32-47"), cpus("16-31,48-63")
HOST64 = HostCpus(
    online=cpus("0-63"),
    numa={0: NODE0, 1: NODE1},
    gpus=tuple(
        GpuRef(i, f"0000:{0x18 + i:02x}:00.0", i // 4, NODE0 if i < 4 else NODE1) for i in range(8)
    ),
    smt=smt_pairs([(k, k + 32) for k in range(32)]),
)
SHAPES = {"1gpu": HOST16, "2gpu": HOST_2GPU, "4gpu": HOST_4GPU, "8gpu": HOST64}


def shipped(name: str) -> Profile:
    return load_profile(PROFILES / f"{name}.toml")


def load(tmp_path: Path, text: str) -> Profile:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return load_profile(path)


def plan_error(profile: Profile, host: HostCpus) -> str:
    with pytest.raises(PlanError) as info:
        resolve_cpusets(profile, host)
    return str(info.value)


def whole(host: HostCpus, cpus_: frozenset[int]) -> bool:
    return host.whole_cores(cpus_) == cpus_


# -- the shipped profiles on every shape ---------------------------------------------------------


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_give_every_gpu_its_own_whole_cores_on_its_node(
    name: str, shape: str
) -> None:
    host = SHAPES[shape]
    r = resolve_cpusets(shipped(name), host)
    members = r.per_gpu["inference"]
    assert sorted(members) == [g.index for g in host.gpus]
    seen: frozenset[int] = frozenset()
    for g in host.gpus:
        mine = members[g.index]
        assert mine, f"GPU {g.index} got no CPUs"
        assert mine <= g.local_cpus, f"GPU {g.index}: {sorted(mine - g.local_cpus)} off its node"
        assert whole(host, mine), f"GPU {g.index} holds half a core"
        assert not mine & seen, f"GPU {g.index} shares CPUs with another GPU"
        seen |= mine
    hk = r.per_node["housekeeping"]
    assert sorted(hk) == sorted(host.nodes)
    for node, cpus_ in hk.items():
        assert cpus_ and cpus_ <= host.nodes[node] and whole(host, cpus_)
    assert not r.sets["housekeeping"] & r.sets["inference"]
    assert housekeeping_guard(shipped(name), r, host) == []


def test_shipped_profiles_on_the_16_cpu_gpu_host_are_what_was_measured() -> None:
    # One GPU, no SMT: the sets the H200 measurements were made with (docs/dev/benchmarks.md).
    expected = {
        "shared-host": {
            "housekeeping": cpus("0"),
            "inference": cpus("1-8"),
            "others": cpus("0,9-15"),  # what [neighbours] may cap to (report only)
        },
        # Both include shared-host: its "others" set is what is not theirs here.
        "dedicated-inference": {
            "housekeeping": cpus("0-1"),
            "inference": cpus("2-15"),
            "others": cpus("0-1"),
        },
        "latency-critical": {
            "housekeeping": cpus("0-1"),
            "inference": cpus("2-15"),
            "others": cpus("0-1"),
        },
    }
    for name in SHIPPED:
        r = resolve_cpusets(shipped(name), HOST16)
        assert r.sets == expected[name]
        assert r.per_gpu == {"inference": {0: expected[name]["inference"]}}
        assert r.notes == []


def test_shared_host_on_eight_gpus_keeps_half_of_each_node() -> None:
    r = resolve_cpusets(shipped("shared-host"), HOST64)
    assert r.per_node["housekeeping"] == {0: cpus("0,32"), 1: cpus("16,48")}
    # count = 8 per GPU is 4 cores; max_percent = 50 leaves 8 of a node's 16 cores for its
    # 4 GPUs, so each gets 2 whole cores, next to the others of its node.
    assert r.per_gpu["inference"] == {
        0: cpus("1-2,33-34"),
        1: cpus("3-4,35-36"),
        2: cpus("5-6,37-38"),
        3: cpus("7-8,39-40"),
        4: cpus("17-18,49-50"),
        5: cpus("19-20,51-52"),
        6: cpus("21-22,53-54"),
        7: cpus("23-24,55-56"),
    }
    assert len(r.sets["inference"]) == 32
    assert r.notes == [
        f"cpusets.inference: GPUs {g} (local CPUs {n}): count = 8 per GPU needs 16 cores, 8 are "
        "left (max_percent = 50); each GPU gets 2 core(s)"
        for g, n in (("0-3", "0-15,32-47"), ("4-7", "16-31,48-63"))
    ]


def test_dedicated_inference_on_eight_gpus_shares_each_node_out() -> None:
    r = resolve_cpusets(shipped("dedicated-inference"), HOST64)
    assert r.per_node["housekeeping"] == {0: cpus("0,32"), 1: cpus("16,48")}
    # 15 cores per node after housekeeping, 4 GPUs: 4, 4, 4 and 3 cores.
    assert r.per_gpu["inference"] == {
        0: cpus("1-4,33-36"),
        1: cpus("5-8,37-40"),
        2: cpus("9-12,41-44"),
        3: cpus("13-15,45-47"),
        4: cpus("17-20,49-52"),
        5: cpus("21-24,53-56"),
        6: cpus("25-28,57-60"),
        7: cpus("29-31,61-63"),
    }
    assert r.sets["inference"] == cpus("0-63") - cpus("0,16,32,48")
    assert r.notes == []


def test_four_gpus_on_one_socket_leave_the_other_socket_alone() -> None:
    r = resolve_cpusets(shipped("dedicated-inference"), HOST_4GPU)
    assert r.per_node["housekeeping"] == {0: cpus("0-1"), 1: cpus("32-33")}
    assert r.per_gpu["inference"] == {
        0: cpus("2-9"),
        1: cpus("10-17"),
        2: cpus("18-25"),
        3: cpus("26-31"),
    }
    assert not r.sets["inference"] & NODE1_ADJ


def test_two_gpus_on_one_node() -> None:
    shared = resolve_cpusets(shipped("shared-host"), HOST_2GPU)
    assert shared.per_gpu["inference"] == {0: cpus("2-5"), 1: cpus("6-9")}
    dedicated = resolve_cpusets(shipped("dedicated-inference"), HOST_2GPU)
    assert dedicated.per_gpu["inference"] == {0: cpus("2-9"), 1: cpus("10-15")}


def test_shared_host_on_two_cpus_without_gpu_falls_back_and_says_so() -> None:
    r = resolve_cpusets(shipped("shared-host"), HOST2)
    assert r == ResolvedCpus(
        sets={"housekeeping": cpus("0"), "inference": cpus("1"), "others": cpus("0")},
        per_gpu={"inference": {}},
        per_node={"housekeeping": {0: cpus("0")}},
        notes=[
            "cpusets.inference: no GPU on this host; using all online CPUs",
            "cpusets.inference: count = 8, but only 1 CPU is left (1); using what there is",
        ],
    )


def test_dedicated_profiles_on_two_cpus_leave_the_server_nothing() -> None:
    users = {
        "dedicated-inference": "irq.gpu_cpus, cpuset.cpus, process[0].cpus, process[1].cpus",
        "latency-critical": (
            "irq.gpu_cpus, cpuset.cpus, process[0].cpus, process[1].cpus, bootargs.nohz_full, "
            "bootargs.rcu_nocbs"
        ),
    }
    for name, needed_by in users.items():
        assert plan_error(shipped(name), HOST2) == (
            f"profile {name!r} cannot be planned on this host; nothing was changed.\n"
            "  cpusets.inference: has no CPUs on this host: excluding 'housekeeping' leaves "
            f"none of 0-1; needed by {needed_by}"
        )


# -- whole cores ----------------------------------------------------------------------------------


def test_exclude_takes_the_whole_core_and_count_takes_whole_cores(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.hk]\ncpus = "0"\n[cpusets.inf]\nnuma_node = 0\n'
    text += 'exclude = ["hk"]\ncount = 3\n[irq]\ngpu_cpus = "inf"\n'
    r = resolve_cpusets(load(tmp_path, text), HOST64)
    # CPU 0's sibling 32 goes with it (to nobody: the rest of the system); 3 CPUs are 2 cores.
    assert r.sets == {"hk": cpus("0"), "inf": cpus("1-2,33-34")}
    assert r.notes == [
        "cpusets.hk: its CPUs share cores with CPUs 32 outside the set (SMT siblings), which "
        "other work can use; list whole cores or use a computed set"
    ]


def test_cores_and_max_percent(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.a]\nper = "node"\ncores = 2\n'
    text += "[cpusets.b]\nall = true\nmax_percent = 25\n[cpusets.c]\nall = true\ncores = 40\n"
    r = resolve_cpusets(load(tmp_path, text), HOST64)
    assert r.per_node["a"] == {0: cpus("0-1,32-33"), 1: cpus("16-17,48-49")}
    assert r.sets["b"] == cpus("0-3,32-35,16-19,48-51")  # a quarter of each node's 16 cores
    assert r.sets["c"] == cpus("0-63")
    assert r.notes == ["cpusets.c: cores = 40, but only 32 left (0-63); using what there is"]


def test_count_and_cores_are_exclusive(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('name = "t"\n[cpusets.a]\nall = true\ncount = 2\ncores = 1\n')
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert info.value.problems == [("cpusets.a", "give count (CPUs) or cores, not both")]


def test_fewer_cores_than_gpus_share_and_say_so(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.hk]\nnuma_node = 0\ncores = 14\n[cpusets.g]\nper = "gpu"\n'
    text += 'exclude = ["hk"]\n[irq]\ngpu_cpus = "g"\n'
    r = resolve_cpusets(load(tmp_path, text), HOST64)
    # node 0 has 2 cores left for 4 GPUs: GPUs 0 and 2 share one, 1 and 3 the other
    assert r.per_gpu["g"][0] == r.per_gpu["g"][2] == cpus("14,46")
    assert r.per_gpu["g"][1] == r.per_gpu["g"][3] == cpus("15,47")
    assert r.notes == [
        "cpusets.g: GPUs 0-3 (local CPUs 0-15,32-47): 2 core(s) for 4 GPUs, so GPUs share "
        "cores; give fewer CPUs to the excluded sets"
    ]


def test_per_gpu_without_gpus(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.g]\nper = "gpu"\nfallback_all = false\n[irq]\ngpu_cpus = "g"\n'
    assert plan_error(load(tmp_path, text), HOST2) == (
        "profile 't' cannot be planned on this host; nothing was changed.\n"
        "  cpusets.g.per: this host has no GPU; set fallback_all = true to use all online CPUs "
        "here, or use a set that does not depend on GPUs"
    )


# -- CPUs the host lacks: refused, not trimmed ---------------------------------------------------


def test_cpus_the_host_lacks_are_refused_not_trimmed(tmp_path: Path) -> None:
    # The case: cpus = "12-20" on a 16-CPU host applied 12-15 and exited 0.
    text = 'name = "t"\n[cpusets.big]\ncpus = "12-20"\n[irq]\ngpu_cpus = "big"\n'
    assert plan_error(load(tmp_path, text), HOST16) == (
        "profile 't' cannot be planned on this host; nothing was changed.\n"
        "  cpusets.big.cpus: names CPUs 16-20 this host does not have online (online: 0-15); a "
        "set is not trimmed to fit: name CPUs this host has, or use gpu_local, numa_node or per"
    )


def test_an_unused_set_with_cpus_the_host_lacks_is_only_noted(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.big]\ncpus = "12-20"\n[cpusets.ok]\ncpus = "1"\n'
    text += '[irq]\ngpu_cpus = "ok"\n'
    r = resolve_cpusets(load(tmp_path, text), HOST16)
    assert r.notes == [
        "cpusets.big: names CPUs 16-20 this host does not have; no table uses the set"
    ]


def test_a_set_excluded_by_a_used_set_is_used_too(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.hk]\ncpus = "0,40"\n[cpusets.inf]\nall = true\n'
    text += 'exclude = ["hk"]\n[irq]\ngpu_cpus = "inf"\n'
    assert "cpusets.hk.cpus: names CPUs 40 this host does not have" in plan_error(
        load(tmp_path, text), HOST16
    )


def test_gpu_local_and_numa_node_pick_the_right_node(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.g1]\ngpu_local = 1\n[cpusets.g5]\ngpu_local = 5\n'
    text += "[cpusets.n1]\nnuma_node = 1\n[cpusets.g6]\ngpu_local = 6\ncount = 3\n"
    r = resolve_cpusets(load(tmp_path, text), HOST64)
    assert r.sets == {"g1": NODE0, "g5": NODE1, "n1": NODE1, "g6": cpus("16-17,48-49")}


def test_excludes_resolve_in_dependency_order(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.a]\nall = true\nexclude = ["b"]\n'
    text += '[cpusets.b]\ncpus = "0-1"\nexclude = ["c"]\n[cpusets.c]\ncpus = "1"\n'
    r = resolve_cpusets(load(tmp_path, text), HOST16)
    assert r.sets == {"a": cpus("1-15"), "b": cpus("0"), "c": cpus("1")}


def test_a_needed_set_with_no_cpu_left_cannot_be_planned(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.hk]\ncpus = "0-15"\n[cpusets.far]\nall = true\n'
    text += 'exclude = ["hk"]\n[irq]\nothers_cpus = "far"\n'
    assert plan_error(load(tmp_path, text), HOST16) == (
        "profile 't' cannot be planned on this host; nothing was changed.\n"
        "  cpusets.far: has no CPUs on this host: excluding 'hk' leaves none of 0-15; "
        "needed by irq.others_cpus"
    )


def test_missing_gpu_without_fallback_and_missing_numa_node(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.g]\ngpu_local = 0\nfallback_all = false\n'
    text += "[cpusets.n]\nnuma_node = 2\n"
    assert plan_error(load(tmp_path, text), HOST2) == (
        "profile 't' cannot be planned on this host; nothing was changed.\n"
        "  cpusets.g.gpu_local: no GPU 0 on this host (GPUs: none); use another index or "
        "fallback_all = true\n"
        "  cpusets.n.numa_node: no NUMA node 2 on this host (nodes: none)"
    )


def test_overlap_and_whole_host_partition_found_on_the_host(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.housekeeping]\ncpus = "0"\n[cpusets.gpu]\ngpu_local = 0\n'
    text += '[cpuset]\nmode = "root"\ncpus = "gpu"\n[irq]\nothers_cpus = "housekeeping"\n'
    assert plan_error(load(tmp_path, text), HOST16) == (
        "profile 't' cannot be planned on this host; nothing was changed.\n"
        "  cpuset.cpus: set 'gpu' holds every online CPU (0-15); a partition must leave at "
        "least one to the rest of the system: exclude a housekeeping set\n"
        "  irq.others_cpus: set 'housekeeping' (0) overlaps set 'gpu' of cpuset.cpus (0-15) on "
        "CPUs 0; IRQs there would interrupt the partition; use a set outside it"
    )


def test_gpu_without_local_cpus_uses_all_online(tmp_path: Path) -> None:
    host = HostCpus(online=cpus("0-3"), gpus=(GpuRef(0, "0000:01:00.0", None, frozenset()),))
    r = resolve_cpusets(load(tmp_path, 'name = "t"\n[cpusets.g]\ngpu_local = 0\n'), host)
    assert r.sets == {"g": cpus("0-3")}
    assert r.notes == [
        "cpusets.g: GPU 0 (0000:01:00.0) reports no online local CPUs; using all online CPUs"
    ]


# -- looking sets up per GPU and per node ---------------------------------------------------------


def test_for_gpu_and_for_node(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.g]\nper = "gpu"\ncores = 1\n[cpusets.n]\nper = "node"\ncores = 1\n'
    text += '[cpusets.low]\ncpus = "0-7"\n'
    r = resolve_cpusets(load(tmp_path, text), HOST64)
    gpu5 = HOST64.gpus[5]
    assert r.for_gpu("g", gpu5, HOST64) == (cpus("17,49"), "own")
    assert r.for_gpu("n", gpu5, HOST64) == (cpus("16,48"), "local")
    assert r.for_gpu("low", HOST64.gpus[1], HOST64) == (cpus("0-7"), "local")
    assert r.for_gpu("low", gpu5, HOST64) == (cpus("0-7"), "elsewhere")
    assert r.for_node("n", 1, HOST64) == cpus("16,48")
    assert r.for_node("low", 1, HOST64) == cpus("0-7")  # none there: the whole set
    assert r.for_node("n", None, HOST64) == cpus("0,16,32,48")
    assert r.per_gpu["g"][7] == cpus("19,51")
    assert r.per_node["n"] == {0: cpus("0,32"), 1: cpus("16,48")}


# -- the housekeeping guard ---------------------------------------------------------------------


def test_guard_refuses_a_node_left_without_a_core(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.hk]\ncpus = "0"\n[cpusets.inf]\nall = true\nexclude = ["hk"]\n'
    text += '[cpuset]\nmode = "isolated"\ncpus = "inf"\n'
    profile = load(tmp_path, text)
    r = resolve_cpusets(profile, HOST64)
    (refusal,) = housekeeping_guard(profile, r, HOST64)
    assert refusal.blocking and refusal.target == "housekeeping on node 1"
    assert refusal.reason == (
        "node 1 (16-31,48-63) keeps 0 whole core(s) outside the partition (set 'inf') (CPUs "
        "left: none); the rest of the system needs at least 1 per node ([cpuset] "
        "housekeeping_cores): exclude a housekeeping set with per = 'node' and cores = 1 from "
        "those sets"
    )
    off = load(tmp_path, text + "housekeeping_cores = 0\n")
    assert housekeeping_guard(off, resolve_cpusets(off, HOST64), HOST64) == []
    report = load(tmp_path, text + "report_only = true\n")
    (r2,) = housekeeping_guard(report, resolve_cpusets(report, HOST64), HOST64)
    assert not r2.blocking and r2.reason.startswith("report only: node 1")


def test_guard_counts_nohz_full_and_asks_for_whole_cores(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.hk]\ncpus = "0,16"\n[cpusets.tick]\nall = true\n'
    text += 'exclude = ["hk"]\n[bootargs]\nnohz_full = "tick"\n'
    profile = load(tmp_path, text)
    assert housekeeping_guard(profile, resolve_cpusets(profile, HOST64), HOST64) == []
    text2 = text + '[cpuset]\nhousekeeping_cores = 2\nmode = "none"\n'
    profile2 = load(tmp_path, text2)
    refusals = housekeeping_guard(profile2, resolve_cpusets(profile2, HOST64), HOST64)
    assert [r.target for r in refusals] == ["housekeeping on node 0", "housekeeping on node 1"]
    assert "keeps 1 whole core(s) outside nohz_full (set 'tick')" in refusals[0].reason


# -- several partitions: checks without a host ---------------------------------------------------


def test_several_partitions_need_by_gpu_to_move_into_one(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.g]\nper = "gpu"\n[cpuset]\nmode = "root"\ncpus = "g"\n'
    text += 'partitions = "node"\n[[process]]\nname = "s"\nmatch.comm = "x"\nmatch.uid = 0\ncpus = "g"\n'
    text += "move_to_partition = true\n"
    assert problems(tmp_path, text) == [
        (
            "process[0].move_to_partition",
            "[cpuset] partitions = 'node' makes several partitions and a process can be in only "
            "one; set by_gpu = true (each process into the partition of the GPU it uses), use "
            "partitions = 'one', or move_to_partition = false",
        )
    ]
    assert load(tmp_path, text + "by_gpu = true\n").process[0].by_gpu


def test_partitions_per_gpu_need_a_per_gpu_set_and_a_partition_mode(tmp_path: Path) -> None:
    text = 'name = "t"\n[cpusets.n]\nper = "node"\n[cpuset]\nmode = "root"\ncpus = "n"\n'
    text += 'partitions = "gpu"\n'
    assert problems(tmp_path, text) == [
        (
            "cpuset.partitions",
            "'gpu' makes one partition per member of a per = 'gpu' set, and set 'n' has no "
            "per = 'gpu'; give the set per = 'gpu' or use partitions = 'node' or 'one'",
        )
    ]
    text = 'name = "t"\n[cpusets.n]\nper = "node"\n[cpuset]\nmode = "affinity"\ncpus = "n"\n'
    text += 'partitions = "node"\n'
    assert problems(tmp_path, text) == [
        (
            "cpuset.partitions",
            "'node' makes partitions, and mode 'affinity' makes none; use mode 'root' or "
            "'isolated', or partitions = 'one'",
        )
    ]
