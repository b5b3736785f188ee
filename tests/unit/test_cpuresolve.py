"""A profile's named CPU sets resolved on the host trees (gputuned/profile/cpuresolve.py): whole
cores on SMT hosts, max_percent, GPUs sharing a node, the refusal each profile mistake gets, and
the housekeeping guard.

Hosts are read from the committed trees (tests/data/hosts, docs/dev/trees.md) through the same
reader plan uses; a few are those trees with one thing changed (CPUs taken offline, a GPU whose
firmware gives no NUMA node), each said where it is made.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from gputuned.changes import Refusal
from gputuned.cpulist import parse_cpulist
from gputuned.errors import PlanError
from gputuned.kernel.pci import scan
from gputuned.kernel.system import read_host_cpus
from gputuned.kernel.topology import HostCpus
from gputuned.profile.cpuresolve import housekeeping_guard, resolve_cpusets
from gputuned.profile.cpusets import ResolvedCpus
from gputuned.profile.load import parse_profile
from gputuned.profile.model import Profile
from tests.conftest import TREES_DIR
from tests.faults import tree_kernel

#: Siblings N and N+32; node 0 = 0-15,32-47 with GPUs 0-3, node 1 = 16-31,48-63 with GPUs 4-7.
EIGHT = "dual-socket-8gpu"
#: Siblings 2k and 2k+1; node 0 = 0-31 with GPUs 0-3, node 1 = 32-63 without GPU.
FOUR = "four-gpu-one-socket"
#: Siblings 2k and 2k+1, one node 0-15, GPUs 0 and 1.
TWO = "two-gpu-one-node"
#: 16 CPUs without SMT, one node, one GPU whose firmware gives no NUMA node.
H200 = "h200-vm"
#: 2 CPUs without SMT, no GPU.
CI = "ci-vm"


def cpus(text: str) -> frozenset[int]:
    return parse_cpulist(text)


@cache
def tree(name: str) -> HostCpus:
    """The host's CPUs, NUMA nodes, SMT siblings and GPUs as plan reads them from the tree."""
    kernel = tree_kernel(TREES_DIR / name)
    return read_host_cpus(kernel, scan(kernel, gpu_trees_only=True), None)


def offline(name: str, gone: str) -> HostCpus:
    """The tree's host with CPUs ``gone`` taken offline (echo 0 > cpuN/online): the NUMA
    listing still names them, cpu/online no longer does."""
    host = tree(name)
    return replace(host, online=host.online - cpus(gone))


def profile(sets: dict[str, Any], **tables: Any) -> Profile:
    return parse_profile({"name": "t", "cpusets": sets, **tables}, "t.toml")


def resolve(host: HostCpus, sets: dict[str, Any], **tables: Any) -> ResolvedCpus:
    return resolve_cpusets(profile(sets, **tables), host)


def refused(host: HostCpus, sets: dict[str, Any], **tables: Any) -> list[str]:
    """The lines of the PlanError that refuses the profile, after its first."""
    with pytest.raises(PlanError) as info:
        resolve(host, sets, **tables)
    head, *lines = str(info.value).split("\n")
    assert head == "profile 't' cannot be planned on this host; nothing was changed."
    return [line.strip() for line in lines]


def guard(host: HostCpus, sets: dict[str, Any], **tables: Any) -> list[Refusal]:
    p = profile(sets, **tables)
    return housekeeping_guard(p, resolve_cpusets(p, host), host)


# -- whole cores on SMT hosts --------------------------------------------------------------------

#: Excluding CPU 0 alone: each kind of set loses CPU 0's whole core, its sibling too.
EXCLUDE_ONE_THREAD = {
    "hk": {"cpus": "0"},
    "plain": {"numa_node": 0, "exclude": ["hk"], "count": 4},
    "node": {"per": "node", "exclude": ["hk"], "cores": 1},
    "gpu": {"per": "gpu", "exclude": ["hk"], "cores": 1},
}


@pytest.mark.parametrize(
    ("name", "sibling", "expected"),
    [
        # siblings N, N+32: CPU 0's sibling is 32
        (
            EIGHT,
            32,
            {
                "plain": "1-2,33-34",
                "node": {0: "1,33", 1: "16,48"},
                "gpu": {0: "1,33", 1: "2,34", 2: "3,35", 3: "4,36", 4: "16,48", 7: "19,51"},
            },
        ),
        # siblings 2k, 2k+1: CPU 0's sibling is 1
        (
            FOUR,
            1,
            {
                "plain": "2-5",
                "node": {0: "2-3", 1: "32-33"},
                "gpu": {0: "2-3", 1: "4-5", 2: "6-7", 3: "8-9"},
            },
        ),
    ],
)
def test_excluding_one_thread_of_a_core_leaves_its_sibling_to_nobody(
    name: str, sibling: int, expected: dict[str, Any]
) -> None:
    """A set that excludes a housekeeping set holding one thread of a core gives up that whole
    core, the sibling too, whatever the kind of set and however the firmware numbers siblings:
    the server never shares a core with housekeeping work. The plan says the literal set splits
    a core."""
    r = resolve(tree(name), EXCLUDE_ONE_THREAD, irq={"others_cpus": "plain", "gpu_cpus": "gpu"})
    assert r.sets["plain"] == cpus(expected["plain"])
    assert r.per_node["node"] == {n: cpus(c) for n, c in expected["node"].items()}
    for gpu, member in expected["gpu"].items():
        assert r.per_gpu["gpu"][gpu] == cpus(member)
    for kind in ("plain", "node", "gpu"):
        assert not r.sets[kind] & {0, sibling}, kind
    assert r.notes == [
        f"cpusets.hk: its CPUs share cores with CPUs {sibling} outside the set (SMT siblings), "
        "which other work can use; list whole cores or use a computed set"
    ]


def test_excluding_one_thread_without_gpus_leaves_its_sibling_to_nobody() -> None:
    """On the same SMT host with no GPU visible (driver not loaded), a per = 'gpu' set falls
    back to all online CPUs and still gives up the excluded thread's whole core."""
    host = replace(tree(TWO), gpus=())
    r = resolve(host, {"hk": {"cpus": "0"}, "g": {"per": "gpu", "exclude": ["hk"], "cores": 1}})
    assert r.sets["g"] == cpus("2-3")
    assert r.per_gpu == {"g": {}}


def test_a_literal_set_of_whole_cores_gets_no_note() -> None:
    """Listing both threads of a core is what the note asks for: the plan stays quiet."""
    r = resolve(tree(EIGHT), {"hk": {"cpus": "0,32"}}, irq={"others_cpus": "hk"})
    assert r.sets == {"hk": cpus("0,32")}
    assert r.notes == []


@pytest.mark.parametrize(
    ("count", "taken"),
    [(1, "0-1"), (2, "0-1"), (3, "0-3"), (4, "0-3"), (5, "0-5")],
)
def test_count_takes_the_fewest_whole_cores_that_hold_that_many_cpus(
    count: int, taken: str
) -> None:
    """count = N on a two-thread host takes whole cores until it has N CPUs, and no more; when it
    gets exactly N (or more, by rounding up to a core) nothing is noted."""
    for kind in ({"all": True}, {"per": "node"}):
        r = resolve(tree(TWO), {"s": {**kind, "count": count}}, irq={"others_cpus": "s"})
        assert r.sets["s"] == cpus(taken)
        assert r.notes == []


def test_a_per_node_set_that_cannot_fill_a_node_says_so_per_node() -> None:
    """cores or count larger than a node takes the whole node and tells the user, node by node,
    how much there was."""
    r = resolve(tree(EIGHT), {"n": {"per": "node", "cores": 20}, "c": {"per": "node", "count": 40}})
    assert r.per_node["n"] == r.per_node["c"] == {0: tree(EIGHT).nodes[0], 1: tree(EIGHT).nodes[1]}
    assert r.notes == [
        "cpusets.n: cores = 20, but only 16 left on node 0 (0-15,32-47); using what there is",
        "cpusets.n: cores = 20, but only 16 left on node 1 (16-31,48-63); using what there is",
        "cpusets.c: count = 40, but only 32 CPUs are left on node 0 (0-15,32-47); using what "
        "there is",
        "cpusets.c: count = 40, but only 32 CPUs are left on node 1 (16-31,48-63); using what "
        "there is",
    ]


# -- max_percent ---------------------------------------------------------------------------------


def test_max_percent_never_leaves_a_node_without_one_core() -> None:
    """A share that rounds down to no core (1 % of 16 cores) still gives each node its first whole
    core."""
    r = resolve(tree(EIGHT), {"a": {"all": True, "max_percent": 1}})
    assert r.sets["a"] == cpus("0,16,32,48")


def test_max_percent_caps_cpus_outside_the_numa_listing_to_one_core() -> None:
    """CPUs the NUMA listing leaves out (here: node 0 lists only 0-7 of 16) are capped like a
    node of their own with the one-core floor, never given to the set whole."""
    host = replace(tree(H200), numa={0: cpus("0-7")})
    r = resolve(host, {"a": {"all": True, "max_percent": 50}})
    assert r.sets["a"] == cpus("0-3,8")


# -- per-GPU sets: GPUs sharing a node -----------------------------------------------------------


def test_gpus_of_a_node_share_its_cores_equally_in_gpu_order() -> None:
    """Without count or cores, the GPUs of a node divide its cores in equal whole-core blocks,
    GPU 0 first; the other node, which has no GPU, is left alone."""
    r = resolve(tree(FOUR), {"g": {"per": "gpu"}})
    assert r.per_gpu["g"] == {0: cpus("0-7"), 1: cpus("8-15"), 2: cpus("16-23"), 3: cpus("24-31")}
    assert r.notes == []


def test_cores_per_gpu_that_fill_the_node_exactly_are_given_without_a_note() -> None:
    """cores = 4 for two GPUs on an 8-core node is exactly the node: each GPU gets its 4 cores
    and the plan has nothing to say."""
    r = resolve(tree(TWO), {"g": {"per": "gpu", "cores": 4}})
    assert r.per_gpu["g"] == {0: cpus("0-7"), 1: cpus("8-15")}
    assert r.notes == []


def test_cores_per_gpu_the_node_cannot_give_are_shared_out_and_said() -> None:
    """Asking more cores per GPU than a node has shares the node out (the first GPUs get one core
    more) and says what was asked, what was left and what each GPU got."""
    plain = resolve(tree(EIGHT), {"g": {"per": "gpu", "cores": 5}})
    assert plain.per_gpu["g"][0] == cpus("0-3,32-35")
    assert plain.per_gpu["g"][7] == cpus("28-31,60-63")
    assert plain.notes == [
        f"cpusets.g: GPUs {g} (local CPUs {local}): cores = 5 per GPU needs 20 cores, 16 are "
        "left; each GPU gets 4 core(s)"
        for g, local in (("0-3", "0-15,32-47"), ("4-7", "16-31,48-63"))
    ]
    hk = {"hk": {"per": "node", "cores": 1}}
    uneven = resolve(tree(EIGHT), {**hk, "g": {"per": "gpu", "cores": 5, "exclude": ["hk"]}})
    assert [len(uneven.per_gpu["g"][i]) // 2 for i in range(8)] == [4, 4, 4, 3] * 2
    assert uneven.notes == [
        f"cpusets.g: GPUs {g} (local CPUs {local}): cores = 5 per GPU needs 20 cores, 15 are "
        "left; each GPU gets 3 or 4 core(s)"
        for g, local in (("0-3", "0-15,32-47"), ("4-7", "16-31,48-63"))
    ]


def test_a_single_gpu_is_named_as_one_in_the_note() -> None:
    """On a one-GPU host the note speaks of "GPU 0", not "GPUs 0"."""
    r = resolve(tree(H200), {"g": {"per": "gpu", "cores": 20}})
    assert r.per_gpu["g"] == {0: cpus("0-15")}
    assert r.notes == [
        "cpusets.g: GPU 0 (local CPUs 0-15): cores = 20 per GPU needs 20 cores, 16 are left; "
        "each GPU gets 16 core(s)"
    ]


def test_max_percent_is_blamed_only_when_it_cut() -> None:
    """Four GPUs, four cores left after a housekeeping set, max_percent = 50 (8 cores) not reached:
    each GPU gets one core of its own (no sharing), and the note does not name max_percent."""
    sets = {
        "hk": {"numa_node": 0, "cores": 12},
        "g": {"per": "gpu", "cores": 2, "max_percent": 50, "exclude": ["hk"]},
    }
    r = resolve(tree(FOUR), sets)
    assert r.per_gpu["g"] == {
        0: cpus("24-25"),
        1: cpus("26-27"),
        2: cpus("28-29"),
        3: cpus("30-31"),
    }
    assert r.notes == [
        "cpusets.g: GPUs 0-3 (local CPUs 0-31): cores = 2 per GPU needs 8 cores, 4 are left; "
        "each GPU gets 1 core(s)"
    ]


def test_gpus_whose_node_is_all_excluded_get_nothing_and_are_told_why() -> None:
    """When a set excludes a whole node, that node's GPUs get no member (their IRQs go to other
    CPUs, which the note says) and the other node's GPUs are unaffected."""
    r = resolve(tree(EIGHT), {"hk": {"numa_node": 0}, "g": {"per": "gpu", "exclude": ["hk"]}})
    assert [r.per_gpu["g"][i] for i in range(4)] == [frozenset()] * 4
    assert r.per_gpu["g"][4] == cpus("16-19,48-51")
    assert r.sets["g"] == tree(EIGHT).nodes[1]
    assert r.notes == [
        "cpusets.g: GPUs 0-3 (local CPUs 0-15,32-47): no core left for them; their IRQs use "
        "other CPUs"
    ]


def test_a_gpu_without_a_numa_node_takes_only_what_the_node_gpus_leave() -> None:
    """A GPU whose firmware gives no NUMA node (numa_node -1: every CPU local) is served last: the
    GPUs that sit on a node keep that node's first cores, and it gets the next free ones."""
    host = tree(EIGHT)
    lost = replace(host.gpus[0], numa_node=None, local_cpus=host.online)
    r = resolve(replace(host, gpus=(lost, *host.gpus[1:])), {"g": {"per": "gpu", "cores": 2}})
    assert r.per_gpu["g"][1] == cpus("0-1,32-33")
    assert r.per_gpu["g"][3] == cpus("4-5,36-37")
    assert r.per_gpu["g"][4] == cpus("16-17,48-49")
    assert r.per_gpu["g"][0] == cpus("6-7,38-39")
    assert r.notes == []


# -- literal CPUs, GPUs and nodes the host lacks ------------------------------------------------


def test_an_unused_set_naming_cpus_the_host_lacks_is_trimmed_and_noted() -> None:
    """A set no table uses may name CPUs this host lacks: plan shows it with the CPUs the host
    has, and notes the rest instead of refusing the profile."""
    r = resolve(tree(H200), {"big": {"cpus": "12-20"}, "ok": {"cpus": "1"}}, irq={"gpu_cpus": "ok"})
    assert r.sets == {"big": cpus("12-15"), "ok": cpus("1")}
    assert r.notes == [
        "cpusets.big: names CPUs 16-20 this host does not have; no table uses the set"
    ]


def test_a_gpu_the_host_lacks_falls_back_to_all_cpus_and_says_so() -> None:
    """gpu_local names a GPU the host does not have: with fallback_all (the default) the set is
    every online CPU, and the plan says why."""
    r = resolve(tree(EIGHT), {"g": {"gpu_local": 9}})
    assert r.sets == {"g": tree(EIGHT).online}
    assert r.notes == ["cpusets.g: no GPU 9 on this host; using all online CPUs"]


def test_a_node_with_cpus_offline_gives_only_its_online_cpus() -> None:
    """numa_node = 1 after the node's second threads went offline is the CPUs still online."""
    r = resolve(offline(EIGHT, "48-63"), {"n": {"numa_node": 1}}, irq={"others_cpus": "n"})
    assert r.sets == {"n": cpus("16-31")}


@pytest.mark.parametrize(
    ("host", "sets", "tables", "lines"),
    [
        pytest.param(
            EIGHT,
            {"g": {"gpu_local": 9, "fallback_all": False}, "n": {"numa_node": 2}},
            {},
            [
                "cpusets.g.gpu_local: no GPU 9 on this host (GPUs: 0, 1, 2, 3, 4, 5, 6, 7); use "
                "another index or fallback_all = true",
                "cpusets.n.numa_node: no NUMA node 2 on this host (nodes: 0, 1)",
            ],
            id="gpu-and-node-the-host-lacks",
        ),
        pytest.param(
            EIGHT,
            {"big": {"cpus": "60-70"}},
            {"irq": {"gpu_cpus": "big"}},
            [
                "cpusets.big.cpus: names CPUs 64-70 this host does not have online (online: "
                "0-63); a set is not trimmed to fit: name CPUs this host has, or use gpu_local, "
                "numa_node or per"
            ],
            id="cpus-the-host-lacks",
        ),
        pytest.param(
            H200,
            {
                "a": {"cpus": "0-5"},
                "b": {"cpus": "6-10"},
                "c": {"cpus": "11-15"},
                "x": {"all": True, "exclude": ["a", "b", "c"]},
            },
            {"irq": {"others_cpus": "x", "default_affinity": "x"}},
            [
                "cpusets.x: has no CPUs on this host: excluding 'a', 'b' and 'c' leaves none of "
                "0-15; needed by irq.others_cpus, irq.default_affinity"
            ],
            id="plain-set-excluded-to-nothing",
        ),
        pytest.param(
            EIGHT,
            {"hk": {"all": True}, "n": {"per": "node", "exclude": ["hk"]}},
            {"irq": {"others_cpus": "n"}},
            [
                "cpusets.n: has no CPUs on this host: excluding 'hk' leaves no core on any "
                "node; needed by irq.others_cpus"
            ],
            id="per-node-set-excluded-to-nothing",
        ),
        pytest.param(
            EIGHT,
            {"hk": {"all": True}, "g": {"per": "gpu", "exclude": ["hk"]}},
            {"irq": {"gpu_cpus": "g"}},
            [
                "cpusets.g: has no CPUs on this host: excluding 'hk' leaves no core local to "
                "any GPU; needed by irq.gpu_cpus"
            ],
            id="per-gpu-set-excluded-to-nothing",
        ),
        pytest.param(
            CI,
            {"hk": {"all": True}, "g": {"per": "gpu", "exclude": ["hk"]}},
            {"irq": {"gpu_cpus": "g"}},
            [
                "cpusets.g: has no CPUs on this host: excluding 'hk' leaves none of 0-1; needed "
                "by irq.gpu_cpus"
            ],
            id="per-gpu-set-without-gpus-excluded-to-nothing",
        ),
        pytest.param(
            CI,
            {"g": {"per": "gpu", "fallback_all": False}},
            {"irq": {"gpu_cpus": "g"}},
            [
                "cpusets.g.per: this host has no GPU; set fallback_all = true to use all online "
                "CPUs here, or use a set that does not depend on GPUs"
            ],
            id="per-gpu-set-without-gpus-or-fallback",
        ),
        pytest.param(
            H200,
            {"hk": {"cpus": "0"}, "all": {"all": True}},
            {"cpuset": {"mode": "isolated", "cpus": "all"}, "irq": {"others_cpus": "hk"}},
            [
                "cpuset.cpus: set 'all' holds every online CPU (0-15); a partition must leave at "
                "least one to the rest of the system: exclude a housekeeping set",
                "irq.others_cpus: set 'hk' (0) overlaps set 'all' of cpuset.cpus (0-15) on CPUs "
                "0; IRQs there would interrupt the partition; use a set outside it",
            ],
            id="partition-of-every-cpu",
        ),
    ],
)
def test_each_profile_mistake_is_refused_naming_its_key(
    host: str, sets: dict[str, Any], tables: dict[str, Any], lines: list[str]
) -> None:
    """A profile that cannot be built on this host is refused before anything changes, one line
    per mistake, each starting with the key to fix and saying what to do."""
    assert refused(tree(host), sets, **tables) == lines


def test_a_needed_set_on_an_offline_node_is_refused_as_offline() -> None:
    """numa_node = 1 while all of node 1 is offline: the refusal says none of the set's CPUs is
    online (and which are), not that an exclusion emptied it."""
    host = offline(EIGHT, "16-31,48-63")
    for sets in (
        {"n": {"numa_node": 1}},
        {"hk": {"cpus": "0"}, "n": {"numa_node": 1, "exclude": ["hk"]}},
    ):
        assert refused(host, sets, irq={"others_cpus": "n"}) == [
            "cpusets.n: has no CPUs on this host: none of its CPUs is online (online: "
            "0-15,32-47); needed by irq.others_cpus"
        ]


@pytest.mark.parametrize(
    ("gpus", "kind", "key"),
    [(False, "node", "others_cpus"), (False, "gpu", "gpu_cpus"), (True, "gpu", "gpu_cpus")],
    ids=["per-node", "per-gpu-without-gpus", "per-gpu"],
)
def test_a_host_that_reports_no_cpu_online_is_refused_not_crashed(
    gpus: bool, kind: str, key: str
) -> None:
    """A tree or host whose cpu/online reads empty: every needed set is refused with the reason
    that no CPU is online, never an error from inside gputuned."""
    host = replace(tree(H200), online=frozenset(), numa={})
    if not gpus:
        host = replace(host, gpus=())
    assert refused(host, {"s": {"per": kind}}, irq={key: "s"}) == [
        f"cpusets.s: has no CPUs on this host: none of its CPUs is online (online: ); needed by "
        f"irq.{key}"
    ]


# -- the housekeeping guard ---------------------------------------------------------------------


def test_the_guard_counts_a_core_with_one_thread_taken_as_gone() -> None:
    """A partition that leaves CPU 0 but takes its sibling 32 leaves node 0 no whole core: the
    rest of the system would share a core with the server, so the guard refuses node 0, and
    names the CPU that is left. Node 1 keeps the whole core 16,48 and passes."""
    sets = {"p": {"cpus": "1-15,17-47,49-63"}}
    (refusal,) = guard(tree(EIGHT), sets, cpuset={"mode": "isolated", "cpus": "p"})
    assert refusal == Refusal(
        "cpuset",
        "housekeeping on node 0",
        "node 0 (0-15,32-47) keeps 0 whole core(s) outside the partition (set 'p') (CPUs left: "
        "0); the rest of the system needs at least 1 per node ([cpuset] housekeeping_cores): "
        "exclude a housekeeping set with per = 'node' and cores = 1 from those sets",
        blocking=True,
    )


def test_a_node_of_one_core_keeps_it_when_the_partition_is_elsewhere() -> None:
    """A two-node VM with one vCPU per node: a partition on node 1's CPU leaves node 0 its one
    core, so only node 1 is refused."""
    host = replace(tree(CI), numa={0: cpus("0"), 1: cpus("1")})
    refusals = guard(host, {"p": {"numa_node": 1}}, cpuset={"mode": "root", "cpus": "p"})
    assert [r.target for r in refusals] == ["housekeeping on node 1"]
    assert "node 1 (1) keeps 0 whole core(s)" in refusals[0].reason


def test_a_profile_that_takes_no_cpu_is_never_refused_for_housekeeping() -> None:
    """Without a partition or nohz_full nothing leaves the rest of the system, so even a two-CPU
    host and housekeeping_cores = 4 pass."""
    sets = {"p": {"all": True}}
    assert (
        guard(tree(CI), sets, cpuset={"mode": "affinity", "cpus": "p", "housekeeping_cores": 4})
        == []
    )


def test_report_only_cpuset_still_blocks_when_boot_arguments_take_the_cpus() -> None:
    """report_only on [cpuset] makes no partition, but [bootargs] nohz_full is written all the same:
    a nohz_full set that leaves a node no core is refused, blocking."""
    sets = {"t": {"cpus": "1-31,33-63"}}
    refusals = guard(tree(EIGHT), sets, cpuset={"report_only": True}, bootargs={"nohz_full": "t"})
    assert [(r.target, r.blocking) for r in refusals] == [("housekeeping on node 1", True)]
    assert refusals[0].reason.startswith(
        "node 1 (16-31,48-63) keeps 0 whole core(s) outside nohz_full (set 't') (CPUs left: none)"
    )
