"""What `[irq]` plans and writes, on the trees: GPU vectors spread over their own CPUs, every
other IRQ into `others_cpus` (left alone where it already is), default_smp_affinity, unmovable
IRQs, the one-CPU guard on both sides of its limit, and each irqbalance mode."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.changes import Change
from gputuned.cpulist import parse_cpulist
from gputuned.engine.apply import ApplyError, apply_profile, revert_all
from gputuned.engine.plan import PlanResult, plan_profile
from gputuned.profile.load import parse_profile
from gputuned.profile.model import Profile
from gputuned.store.state import JOURNAL
from tests.conftest import TREES_DIR
from tests.fakeproc import add_process, remove_process
from tests.faults import tree_kernel
from tests.unit.test_irqbalance import FakeIrqbalance

IRQ_PID = 700


def copy(tree: str, tmp_path: Path) -> Path:
    """A copy of a committed tree, to plan on or apply to."""
    root = tmp_path / tree
    shutil.copytree(TREES_DIR / tree, root, symlinks=True)
    return root


def put(root: Path, rel: str, text: str) -> None:
    """Replace a file of a tree."""
    path = root / rel
    path.unlink(missing_ok=True)
    path.write_text(text)


def profile(cpusets: dict[str, Any], **irq: Any) -> Profile:
    return parse_profile({"name": "t", "cpusets": cpusets, "irq": irq}, "test")


def plan(root: Path, prof: Profile) -> PlanResult:
    return plan_profile(tree_kernel(root), prof, allow_blocked=True)


def affinity_settings(result: PlanResult) -> dict[int, Change]:
    """IRQ number -> its managed affinity setting (in sync or not)."""
    return {
        int(c.path.split("/")[3]): c
        for c in result.settings
        if c.tuner == "irq" and c.path.endswith("/smp_affinity_list")
    }


def targets(result: PlanResult) -> dict[int, str]:
    return {irq: c.wanted for irq, c in affinity_settings(result).items()}


def set_affinity(root: Path, irq: int, cpus: str) -> None:
    put(root, f"proc/irq/{irq}/smp_affinity_list", f"{cpus}\n")


def unmovable(root: Path, irqs: list[int], name: str = "EIO") -> None:
    """Record that the kernel refuses to move ``irqs`` (as `capture --probe-writes` does)."""
    meta = root / "gputuned-tree.json"
    data = json.loads(meta.read_text())
    data.setdefault("write_errors", {}).update(
        {f"/proc/irq/{n}/smp_affinity_list": name for n in irqs}
    )
    put(root, "gputuned-tree.json", json.dumps(data))


# -- GPU vectors ----------------------------------------------------------------------------


def test_gpus_sharing_a_set_continue_one_round_robin_one_vector_per_core_first(
    tmp_path: Path,
) -> None:
    """Two GPUs whose vectors share the CPUs 1-6 get them in one round robin, first threads of
    every core before any second thread: the user relies on no CPU taking a second vector
    while another CPU of the set has none, across GPUs as within one."""
    root = copy("two-gpu-one-node", tmp_path)  # siblings 2k, 2k+1: 1 | 2,3 | 4,5 | 6
    result = plan(root, profile({"irqs": {"cpus": "1-6"}}, gpu_cpus="irqs"))
    got = targets(result)
    order = ["1", "2", "4", "6", "3", "5"]
    assert [got[i] for i in range(40, 48)] == (order * 2)[:8]  # GPU 0
    assert [got[i] for i in range(49, 57)] == (order * 3)[8:16]  # GPU 1 carries on
    ch = affinity_settings(result)[49]
    assert ch.why == "0000:02:00.0 GPU 1 vector -> irq.gpu_cpus (irqs, node 0)"
    assert ch.compare == "cpulist" and ch.current == "0-15"
    assert set(got) == set(range(40, 48)) | set(range(49, 57)), "no other IRQ is touched"


def test_placed_vectors_are_in_sync_and_written_once(tmp_path: Path) -> None:
    """After apply, the same profile plans every vector as already right and a second apply
    writes nothing: the user relies on re-applying (the daemon does it on every change)
    being free of churn."""
    root = copy("two-gpu-one-node", tmp_path)
    prof = profile({"irqs": {"cpus": "1-6"}}, gpu_cpus="irqs")
    _, report = apply_profile(tree_kernel(root), prof)
    assert report.failed == [] and len(report.written) == 16
    assert (root / "proc/irq/43/smp_affinity_list").read_text() == "6\n"
    again = plan(root, prof)
    assert all(c.in_sync for c in affinity_settings(again).values())
    host = tree_kernel(root)
    _, report = apply_profile(host, prof)
    assert report.written == [] and host.writes == []


def test_without_spread_every_vector_may_use_the_whole_set(tmp_path: Path) -> None:
    """`spread = false` gives each vector every CPU of the set, so a vector pinned to one CPU
    of it is widened to all of them, not left where it is."""
    root = copy("two-gpu-one-node", tmp_path)
    set_affinity(root, 40, "2")
    prof = profile({"irqs": {"cpus": "1-6"}}, gpu_cpus="irqs", spread=False)
    result = plan(root, prof)
    settings = affinity_settings(result)
    assert {c.wanted for c in settings.values()} == {"1-6"}
    assert not settings[40].in_sync and settings[40].current == "2"
    set_affinity(root, 40, "1-6")
    assert affinity_settings(plan(root, prof))[40].in_sync


def test_vectors_are_read_from_sysfs_not_only_from_proc_interrupts(tmp_path: Path) -> None:
    """A vector the driver allocated but has no handler on yet is in the GPU's msi_irqs and
    not in /proc/interrupts: it is still placed, or it would fire on any CPU once the driver
    requests it. A vector freed while plan reads the host is left out, not a crash."""
    root = copy("h200-vm", tmp_path)
    text = (root / "proc/interrupts").read_text().splitlines(keepends=True)
    put(root, "proc/interrupts", "".join(ln for ln in text if not ln.startswith("48:")))
    shutil.rmtree(root / "proc/irq/49")
    result = plan(root, profile({"irqs": {"cpus": "1-8"}}, gpu_cpus="irqs"))
    got = targets(result)
    assert got[48] == "7"
    assert 49 not in got and sorted(got) == list(range(42, 49))


def test_a_gpu_without_vectors_is_passed_over(tmp_path: Path) -> None:
    """A GPU whose driver holds no vectors (not bound) has nothing to place: no vector moves
    and the plan names no off-node vectors of it; the other GPUs are placed as before."""
    root = copy("dual-socket-8gpu", tmp_path)
    gpu7 = root / "sys/devices/pci0000:80/0000:80:03.0/0000:85:00.0/0000:86:10.0/0000:88:00.0"
    shutil.rmtree(gpu7 / "msi_irqs")
    result = plan(root, profile({"low": {"cpus": "1-8"}}, gpu_cpus="low"))
    off = [n for n in result.notes if "off its node" in n]
    assert [n.split("GPU ")[1][:1] for n in off] == ["4", "5", "6"]
    assert len(targets(result)) == 7 * 8


def test_vectors_of_a_gpu_without_a_numa_node_go_to_its_local_cpus(tmp_path: Path) -> None:
    """A GPU whose local CPUs span both sockets (firmware gives no NUMA node) still has its
    vectors on its local CPUs of the set, and the plan says so rather than naming a node."""
    root = copy("dual-socket-8gpu", tmp_path)
    gpu0 = root / "sys/devices/pci0000:00/0000:00:02.0/0000:01:00.0/0000:02:08.0/0000:03:00.0"
    put(gpu0, "local_cpulist", "0-63\n")
    put(gpu0, "numa_node", "-1\n")
    result = plan(root, profile({"low": {"cpus": "1-2,17-18"}}, gpu_cpus="low"))
    whys = {c.why for c in affinity_settings(result).values() if c.why.startswith("0000:03:00.0")}
    assert whys == {"0000:03:00.0 GPU 0 vector -> irq.gpu_cpus (low, its local CPUs)"}
    assert not [n for n in result.notes if "off its node" in n]


# -- every other IRQ ------------------------------------------------------------------------


def test_an_irq_already_inside_others_cpus_is_left_alone(tmp_path: Path) -> None:
    """`others_cpus` only has to keep other IRQs off the server's CPUs: one already on a part
    of the set, or on all of it, stays where it is (a driver or the admin chose that CPU);
    only one that reaches outside the set is moved, to the whole set."""
    root = copy("h200-vm", tmp_path)
    set_affinity(root, 24, "1")  # a part of the set
    set_affinity(root, 25, "0-1")  # the whole set
    prof = profile({"hk": {"cpus": "0-1"}}, others_cpus="hk")
    result = plan(root, prof)
    settings = affinity_settings(result)
    assert settings[24].in_sync and settings[25].in_sync, "still managed, nothing to write"
    assert not settings[26].in_sync and settings[26].wanted == "0-1"
    assert settings[26].why == "not a GPU vector -> irq.others_cpus (hk)"
    assert settings[26].compare == "cpulist_subset"
    assert not set(settings) & set(range(42, 50)), "GPU vectors are not 'other' IRQs"
    host = tree_kernel(root)
    _, report = apply_profile(host, prof)
    assert report.failed == []
    written = {w.path for w in host.writes}
    assert "/proc/irq/26/smp_affinity_list" in written
    assert not written & {"/proc/irq/24/smp_affinity_list", "/proc/irq/25/smp_affinity_list"}
    assert (root / "proc/irq/24/smp_affinity_list").read_text() == "1\n"


def test_unmovable_irqs_are_skipped_and_reported_only_when_out_of_place(
    tmp_path: Path,
) -> None:
    """IRQs the kernel refuses to move (EPERM recorded for virtio 31 and 33 on the H200 VM)
    are never written: reported as unmovable when they sit outside the set, and not mentioned
    at all when they already sit inside it (nothing to do, nothing to worry about)."""
    root = copy("h200-vm", tmp_path)
    host = tree_kernel(root)
    result = plan(root, profile({"hk": {"cpus": "0"}}, others_cpus="hk"))
    refused = {r.target: r.reason for r in result.refused if r.tuner == "irq"}
    assert refused == {
        "irq 31 (virtio0-req.0)": "unmovable (EPERM): the kernel refuses to move this IRQ; skipped",
        "irq 33 (virtio1-req.0)": "unmovable (EPERM): the kernel refuses to move this IRQ; skipped",
    }
    assert not {31, 33} & set(affinity_settings(result))
    _, report = apply_profile(host, profile({"hk": {"cpus": "0"}}, others_cpus="hk"))
    assert report.failed == []
    assert not {w.path for w in host.writes} & {
        "/proc/irq/31/smp_affinity_list",
        "/proc/irq/33/smp_affinity_list",
    }
    wide = plan(
        copy("h200-vm", tmp_path / "b"), profile({"all": {"cpus": "0-15"}}, others_cpus="all")
    )
    assert not [r for r in wide.refused if r.tuner == "irq"]
    assert not {31, 33} & set(affinity_settings(wide))


# -- default_smp_affinity -------------------------------------------------------------------


def test_default_smp_affinity_is_written_so_later_irqs_land_on_the_set(tmp_path: Path) -> None:
    """IRQs allocated after apply (a hot-plugged NIC, a driver loaded later) take
    /proc/irq/default_smp_affinity: it is set to the set, read back as in sync, and put back
    on revert."""
    root = copy("h200-vm", tmp_path)
    prof = profile({"hk": {"cpus": "0-1"}}, default_affinity="hk")
    (ch,) = [c for c in plan(root, prof).settings if c.target == "default_smp_affinity"]
    assert (ch.current, ch.wanted, ch.compare, ch.in_sync) == ("ffff", "0003", "mask", False)
    assert ch.path == "/proc/irq/default_smp_affinity"
    assert ch.why == "IRQs allocated later land on irq.default_affinity (hk)"
    assert targets(plan(root, prof)) == {}, "no IRQ is moved for default_affinity alone"
    _, report = apply_profile(tree_kernel(root), prof)
    assert report.failed == []
    assert (root / "proc/irq/default_smp_affinity").read_text() == "0003\n"
    (again,) = [c for c in plan(root, prof).settings if c.target == "default_smp_affinity"]
    assert again.in_sync
    assert revert_all(tree_kernel(root)).failed == []
    assert (root / "proc/irq/default_smp_affinity").read_text() == "ffff\n"


def test_a_kernel_without_default_smp_affinity_plans_the_rest(tmp_path: Path) -> None:
    """A kernel that shows no /proc/irq/default_smp_affinity (built without SMP) gets no
    setting for it, and the IRQs are planned as usual."""
    root = copy("h200-vm", tmp_path)
    (root / "proc/irq/default_smp_affinity").unlink()
    result = plan(root, profile({"hk": {"cpus": "0"}}, others_cpus="hk", default_affinity="hk"))
    assert not [c for c in result.settings if c.target == "default_smp_affinity"]
    assert targets(result)[24] == "0"


# -- the one-CPU guard ----------------------------------------------------------------------


def one_cpu(**irq: Any) -> Profile:
    return profile({"zero": {"cpus": "0"}}, gpu_cpus="zero", others_cpus="zero", **irq)


def guard(result: PlanResult) -> list[str]:
    return [r.reason for r in result.refused if r.target == "all IRQs"]


@pytest.mark.parametrize(("online", "refused"), [("0-31", False), ("0-32", True)])
def test_one_cpu_for_every_irq_is_refused_above_32_cpus(
    tmp_path: Path, online: str, refused: bool
) -> None:
    """Up to 32 online CPUs, one CPU for every IRQ is the profile's choice; from 33 on, plan
    refuses it and apply writes nothing (one CPU cannot take a whole host's interrupts)."""
    root = copy("dual-socket-8gpu", tmp_path)
    put(root, "sys/devices/system/cpu/online", f"{online}\n")
    result = plan(root, one_cpu())
    n = len(parse_cpulist(online))
    if refused:
        (reason,) = guard(result)
        assert reason.startswith(f"every movable IRQ (64) would land on CPU 0 of {n} online CPUs")
        assert result.blocked
        with pytest.raises(errors.PlanError, match="every movable IRQ"):
            plan_profile(tree_kernel(root), one_cpu())  # and so apply, which plans first
    else:
        assert guard(result) == [] and not result.blocked
        assert set(targets(result).values()) == {"0"}


@pytest.mark.parametrize(("movable", "refused"), [(1, False), (2, True)])
def test_unmovable_irqs_do_not_count_for_the_one_cpu_guard(
    tmp_path: Path, movable: int, refused: bool
) -> None:
    """IRQs the kernel manages itself (EIO) stay spread whatever the profile says, so they
    neither hide a pile-up of the movable ones on one CPU nor make one: two movable IRQs on
    one CPU of a 64-CPU host are refused, a single one is not."""
    root = copy("four-gpu-one-socket", tmp_path)
    vectors = [*range(121, 129), *range(130, 138), *range(139, 147), *range(148, 156)]
    unmovable(root, vectors[movable:])
    result = plan(root, one_cpu())
    assert (
        len([r for r in result.refused if r.reason.startswith("unmovable (EIO)")]) == 32 - movable
    )
    if refused:
        (reason,) = guard(result)
        assert reason.startswith(f"every movable IRQ ({movable}) would land on CPU 0")
    else:
        assert guard(result) == []


def test_a_profile_that_moves_no_irq_is_not_blamed_for_the_hosts_own_layout(
    tmp_path: Path,
) -> None:
    """Where the host already has every IRQ on CPU 0 and the profile moves none (it only sets
    default_smp_affinity), the guard has nothing to refuse: the profile changes nothing there."""
    root = copy("four-gpu-one-socket", tmp_path)
    for d in (root / "proc/irq").iterdir():
        if d.is_dir():
            set_affinity(root, int(d.name), "0")
    result = plan(root, profile({"hk": {"cpus": "0-1"}}, default_affinity="hk"))
    assert guard(result) == [] and not result.blocked
    assert [c.target for c in result.changes] == ["default_smp_affinity"]


# -- irqbalance ------------------------------------------------------------------------------


def irqbalance_process(root: Path, start_time: int = 500) -> None:
    """irqbalance runs in the tree as PID 700 (started at ``start_time``)."""
    add_process(
        root,
        IRQ_PID,
        comm="irqbalance",
        cmdline=["/usr/sbin/irqbalance", "--foreground"],
        exe="/usr/sbin/irqbalance",
        start_time=start_time,
        cgroup="/system.slice/irqbalance.service",
    )


@pytest.fixture
def irqbalance(tmp_path: Path) -> Iterator[tuple[Path, FakeIrqbalance]]:
    root = copy("h200-captured", tmp_path)
    irqbalance_process(root)
    fake = FakeIrqbalance(root / f"run/irqbalance/irqbalance{IRQ_PID}.sock")
    yield root, fake
    fake.close()


def bans(result: PlanResult) -> dict[str, tuple[str, str, bool]]:
    return {
        c.key: (c.current, c.wanted, c.in_sync) for c in result.settings if c.kind == "irqbalance"
    }


HK = {"hk": {"cpus": "0"}, "gpu": {"cpus": "1-8"}}


@pytest.mark.parametrize(
    ("irq", "want"),
    [
        ({"others_cpus": "hk"}, {"irqbalance:cpus": ("-", "1-15", False)}),
        (
            {"gpu_cpus": "gpu"},
            {"irqbalance:irqs": ("-", "42 43 44 45 46 47 48 49", False)},
        ),
    ],
)
def test_coordinate_bans_only_what_the_profile_places(
    irqbalance: tuple[Path, FakeIrqbalance], irq: dict[str, str], want: dict[str, Any]
) -> None:
    """irqbalance is told to keep off the CPUs outside others_cpus only when the profile sets
    others_cpus, and to leave the GPU vectors alone only when it places them: what the profile
    keeps stays irqbalance's to balance."""
    root, _fake = irqbalance
    assert bans(plan(root, profile(HK, **irq))) == want


def test_coordinate_shows_what_irqbalance_already_bans(
    irqbalance: tuple[Path, FakeIrqbalance],
) -> None:
    """The plan shows the CPUs irqbalance bans now (its own IRQBALANCE_BANNED_CPUS), and a ban
    that already matches is in sync: nothing is sent."""
    root, fake = irqbalance
    fake.banned = frozenset({3})
    assert bans(plan(root, profile(HK, others_cpus="hk"))) == {
        "irqbalance:cpus": ("3", "1-15", False)
    }
    fake.banned = parse_cpulist("1-15")
    host = tree_kernel(root)
    _, report = apply_profile(host, profile(HK, others_cpus="hk"))
    assert bans(plan(root, profile(HK, others_cpus="hk")))["irqbalance:cpus"][2]
    assert report.failed == [] and not [m for m in fake.log if m.startswith("settings")]


@pytest.mark.parametrize("mode", ["ignore", "coordinate", "report"])
def test_each_irqbalance_mode_with_and_without_a_running_irqbalance(
    irqbalance: tuple[Path, FakeIrqbalance], mode: str
) -> None:
    """A running irqbalance would move the IRQs back: `coordinate` tells it what to leave
    alone, `report` says so and leaves it be, `ignore` says nothing and never touches its
    socket. With no irqbalance running no mode has anything to say."""
    root, fake = irqbalance
    prof = profile(HK, gpu_cpus="gpu", others_cpus="hk", irqbalance=mode)
    result = plan(root, prof)
    said = [r.reason for r in result.refused if r.target == "irqbalance"]
    if mode == "ignore":
        assert bans(result) == {} and said == [] and fake.log == []
    elif mode == "report":
        assert bans(result) == {} and fake.log == []
        assert said == [
            f"irqbalance runs (PID {IRQ_PID}) and will move IRQs back onto the CPUs gputuned "
            "cleared; stop it, or set irq.irqbalance = 'coordinate'"
        ]
    else:
        assert set(bans(result)) == {"irqbalance:cpus", "irqbalance:irqs"} and said == []
    remove_process(root, IRQ_PID)
    fake.log.clear()
    gone = plan(root, prof)
    assert bans(gone) == {} and not [r for r in gone.refused if r.target == "irqbalance"]
    assert fake.log == []


class RestartingIrqbalance(FakeIrqbalance):
    """Restarts under the same PID (as in a container's PID namespace) right after answering
    its ``restart_after``-th message."""

    def __init__(self, path: Path, root: Path, restart_after: int) -> None:
        self.root, self.restart_after = root, restart_after
        super().__init__(path)

    def answer(self, conn: socket.socket, text: str) -> None:
        if len(self.log) == self.restart_after:
            remove_process(self.root, IRQ_PID)
            irqbalance_process(self.root, start_time=900)
        if text == "setup":
            conn.sendall(b"SLEEP 10 BANNED 0")


def test_an_irqbalance_restarted_between_read_and_write_is_not_told(
    irqbalance: tuple[Path, FakeIrqbalance], tmp_path: Path
) -> None:
    """If irqbalance restarts under the same PID after gputuned read its settings, the new
    daemon (whose settings gputuned never journaled) is not sent the ban: apply fails and says
    the PID was reused."""
    root, fake = irqbalance
    prof = profile(HK, others_cpus="hk")
    apply_profile(tree_kernel(root), prof)  # to learn which message is the last read
    first_write = next(i for i, m in enumerate(fake.log) if m.startswith("settings"))
    fake.close()
    again = copy("h200-captured", tmp_path / "again")
    irqbalance_process(again)
    sock = again / f"run/irqbalance/irqbalance{IRQ_PID}.sock"
    restarting = RestartingIrqbalance(sock, again, restart_after=first_write)
    try:
        with pytest.raises(ApplyError, match=f"PID {IRQ_PID} was reused"):
            apply_profile(tree_kernel(again), prof)
        assert not [m for m in restarting.log if m.startswith("settings")]
    finally:
        restarting.close()


# -- journal entries of irqbalance ------------------------------------------------------------


@pytest.mark.parametrize(
    ("attr", "old"),
    [("cpus", "1-15; settings cpus NULL"), ("sleep", "1"), ("cpus", "1-15")],
)
def test_revert_restores_only_ban_lists_gputuned_writes(
    irqbalance: tuple[Path, FakeIrqbalance], attr: str, old: str
) -> None:
    """Revert sends irqbalance only what gputuned itself sends (a CPU list or IRQ numbers, for
    `cpus` or `irqs`): a journal entry naming anything else is refused and never reaches the
    socket, while a real one is put back."""
    root, fake = irqbalance
    path = root / JOURNAL.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = {
        "key": f"irqbalance:{attr}", "tuner": "irq", "target": f"irqbalance banned {attr}",
        "kind": "irqbalance", "path": "", "value": "0", "compare": "text",
        "data": {"pid": IRQ_PID, "start": 500, "attr": attr}, "old": old,
    }  # fmt: skip
    path.write_text(json.dumps({"v": 1, "op": "save", "entry": entry}) + "\n")
    path.chmod(0o600)
    report = revert_all(tree_kernel(root))
    if old == "1-15" and attr == "cpus":
        assert report.failed == [] and fake.log[-1] == "settings cpus 1-15"
    else:
        assert [f["target"] for f in report.failed] == [f"{JOURNAL} line 1"]
        assert "refused, not restored" in report.failed[0]["error"]
        assert fake.log == []


# -- the [irq] table ------------------------------------------------------------------------


def test_a_misspelt_irq_key_is_an_error_and_the_table_is_read_only() -> None:
    """A typo in [irq] (`other_cpus`) is an error naming it, not a setting silently dropped;
    and a loaded table cannot be changed in place (the daemon shares one profile across its
    threads)."""
    with pytest.raises(errors.GputunedError, match="other_cpus"):
        profile({"hk": {"cpus": "0"}}, other_cpus="hk")
    prof = profile({"hk": {"cpus": "0"}}, others_cpus="hk")
    assert prof.irq is not None and prof.irq.spread and not prof.irq.report_only
    with pytest.raises(ValueError, match="frozen"):
        prof.irq.others_cpus = "keep"  # type: ignore[misc]  # what the test checks


def test_a_gpu_vector_that_proc_interrupts_does_not_list_is_placed_too(tmp_path: Path) -> None:
    """/proc/interrupts leaves out a vector the driver allocated but has no handler on yet
    (kernel/irq/proc.c: no action and no count); its /proc/irq/N is there, and the kernel
    keeps an affinity set there when the handler comes. The user relies on every vector of
    the GPU being placed, not only those that fired."""
    root = copy("two-gpu-one-node", tmp_path)
    lines = (root / "proc/interrupts").read_text().splitlines(keepends=True)
    put(root, "proc/interrupts", "".join(x for x in lines if not x.lstrip().startswith("43:")))
    result = plan(root, profile({"irqs": {"cpus": "1-6"}}, gpu_cpus="irqs"))
    got = targets(result)
    assert got[43] == "6" and set(got) == set(range(40, 48)) | set(range(49, 57))
    assert affinity_settings(result)[43].current == "0-15"
