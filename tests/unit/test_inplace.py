"""Partition in place (issue 17, items 1 and 2): a server under systemd or in a container keeps
its processes in its own cgroup, which becomes the partition (gputuned/tuners/inplace.py).

The tree is vLLM-shaped (tests/unit/test_process_tree.py): API server, EngineCore and worker
started with the spawn context, the resource tracker. A tree with /run/systemd/system has
systemd as PID 1 (modelled in gputuned/sim/units.py); one without it stands for the lent H200
host or a container host, where a runtime made a plain cgroup.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from gputuned.daemon.core import Daemon
from gputuned.engine.apply import apply_profile, read_state, revert_all
from gputuned.engine.plan import PlanResult, plan_profile, read_context
from gputuned.engine.verify import verify_plan
from gputuned.kernel.proc import read_process
from gputuned.profile.load import load_profile
from gputuned.service.procwatch import ProcEvent
from gputuned.tuners import inplace
from gputuned.tuners.proctree import claim_processes
from tests.fakeproc import add_process, remove_process
from tests.faults import tree_kernel
from tests.unit.test_apply import digest, tree_copy
from tests.unit.test_daemon import profile_file
from tests.unit.test_process_tree import API, CORE, TRACKER, WORKER, child, feed, vllm_tree

UNIT = "/system.slice/inference.service"
CG = "sys/fs/cgroup"
DROPIN = "run/systemd/system.control/inference.service.d/50-AllowedCPUs.conf"
TREE = (API, CORE, WORKER, TRACKER)


@pytest.fixture(autouse=True)
def _quiet_notify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)


def host(tmp_path: Path, *, systemd: bool = True, tree: str = "h200-captured") -> Path:
    root = tree_copy(tree, tmp_path, server=False)
    if systemd:
        (root / "run/systemd/system").mkdir(parents=True)
        # made by gputuned.service's ExecStartPre (a mount point in its sandbox: it stays)
        (root / "run/systemd/system.control").mkdir()
    return root


def read(root: Path, cg: str, name: str) -> str:
    return (root / CG / cg.strip("/") / name).read_text().strip()


def cgroups_of(root: Path, pids: tuple[int, ...] = TREE) -> set[str]:
    return {read_process(tree_kernel(root), p).cgroup for p in pids}


def notes(plan: PlanResult, start: str) -> list[str]:
    return [n for n in plan.notes if n.startswith(start)]


def moves(plan: PlanResult) -> list[str]:
    return [c.target for c in plan.settings if c.kind == "proc_cgroup"]


def test_a_units_tree_gets_its_partition_in_place_and_revert_is_exact(tmp_path: Path) -> None:
    root = host(tmp_path)
    vllm_tree(root, cgroup=UNIT)
    before = digest(root)
    prof = load_profile(profile_file(tmp_path))

    plan = plan_profile(tree_kernel(root), prof)
    (said,) = notes(plan, "cpuset: partition in place: ")
    assert f"{UNIT} (unit inference.service, told AllowedCPUs=1-4) becomes the partition" in said
    assert moves(plan) == []
    kinds = [c.kind for c in plan.changes if c.tuner == "cpuset" and c.kind != "mount"]
    # systemd first (it writes the unit's cpuset.cpus, which gputuned leaves to it), then
    # system.slice's claim, the unit's claim and its partition
    assert kinds == ["unit_property"] + ["borrowed_cpuset"] * 3, kinds
    assert not [c for c in plan.changes if c.target == f"{UNIT} cpuset.cpus"]

    _plan, rep = apply_profile(tree_kernel(root), prof)
    assert rep.failed == []
    assert cgroups_of(root) == {UNIT}, "every server process is still in the unit's cgroup"
    assert read(root, UNIT, "cpuset.cpus.partition") == "root"
    assert read(root, UNIT, "cpuset.cpus.exclusive.effective") == "1-4"
    assert read(root, "/system.slice", "cpuset.cpus.exclusive") == "1-4"
    assert read(root, "", "cpuset.cpus.effective") == "0,5-15"  # taken from everyone else
    assert not (root / CG / "gputuned.inference").exists()
    assert "AllowedCPUs=1-4" in (root / DROPIN).read_text()
    for pid in TREE:
        assert read_process(tree_kernel(root), pid).threads[0].affinity == frozenset(range(1, 5))

    rep = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    assert rep.count("drifted") == 0 and rep.exit_code == 0, [ln.target for ln in rep.lines]
    # systemd rewrites the unit's cpuset.cpus from AllowedCPUs= (a realize): nothing drifts.
    tree_kernel(root).set_unit_property("inference.service", "AllowedCPUs", "1-4")
    assert read(root, UNIT, "cpuset.cpus.partition") == "root"

    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before
    assert not (root / DROPIN).parent.exists(), "the drop-in gputuned caused is gone"


def test_a_runtimes_plain_cgroup_without_systemd(tmp_path: Path) -> None:
    """A container's cgroup made by a runtime on a host where systemd is not PID 1 (as on the
    lent H200 host): the same partition, no systemd call, the controller enabled by gputuned."""
    root = host(tmp_path, systemd=False)
    box = "/docker/3f2a9c"
    vllm_tree(root, cgroup=box)
    before = digest(root)
    prof = load_profile(profile_file(tmp_path))
    plan, rep = apply_profile(tree_kernel(root), prof)
    (said,) = notes(plan, "cpuset: partition in place: ")
    assert "(no systemd unit: the plain cgroup of a container or runtime)" in said
    assert not [c for c in plan.settings if c.kind == "unit_property"]
    assert rep.failed == [] and cgroups_of(root) == {box}
    assert read(root, box, "cpuset.cpus.partition") == "root"
    assert "cpuset" in read(root, "/docker", "cgroup.subtree_control").split()
    assert not (root / "run/systemd").exists()
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


PODMAN_SCOPE = "/machine.slice/libpod-4c1d9e.scope"


def test_a_podman_containers_cgroup_below_its_delegated_scope(tmp_path: Path) -> None:
    """podman under systemd: crun puts the container in ``container`` below the libpod
    scope, which podman made with Delegate=yes. Those cgroups are the runtime's: systemd is
    told nothing (no AllowedCPUs=, which the kernel would not let go of again), gputuned
    enables cpuset where it is missing, and the container's cgroup becomes the partition,
    its processes staying in it. Without Delegate=yes, the cgroup below a unit is systemd's
    and the processes are moved instead."""
    root = host(tmp_path)
    box = f"{PODMAN_SCOPE}/container"
    vllm_tree(root, cgroup=box)
    unit_file = root / "run/systemd/transient/libpod-4c1d9e.scope"
    unit_file.parent.mkdir(parents=True)
    unit_file.write_text("[Scope]\nDelegate=no\n")
    prof = load_profile(profile_file(tmp_path))
    plan = plan_profile(tree_kernel(root), prof)
    (said,) = notes(plan, "cpuset: not partitioned in place: ")
    assert "nor below a unit with Delegate=yes" in said and moves(plan)

    unit_file.write_text("[Scope]\nDelegate=yes\n")
    # systemd is asked once a plan (a `systemctl show` each on a live host).
    k = tree_kernel(root)
    asked: list[tuple[str, str]] = []
    real = k.unit_property

    def counted(unit: str, name: str) -> str | None:
        asked.append((unit, name))
        return real(unit, name)

    setattr(k, "unit_property", counted)  # noqa: B010
    plan_profile(k, prof)
    assert [a for a in asked if a[1] == "Delegate"] == [("libpod-4c1d9e.scope", "Delegate")]
    before = digest(root)
    plan, rep = apply_profile(tree_kernel(root), prof)
    (said,) = notes(plan, "cpuset: partition in place: ")
    assert f"{box} (unit libpod-4c1d9e.scope, which delegates its cgroups: Delegate=yes)" in said
    assert moves(plan) == []
    assert not [c for c in plan.changes if c.kind == "unit_property"]
    enabled = [c.target for c in plan.changes if c.kind == "controller" and not c.in_sync]
    assert enabled == [f"{a} cgroup.subtree_control" for a in ("/machine.slice", PODMAN_SCOPE)]
    assert rep.failed == [] and cgroups_of(root) == {box}
    assert read(root, box, "cpuset.cpus.partition") == "root"
    assert read(root, box, "cpuset.cpus.exclusive.effective") == "1-4"
    assert read(root, PODMAN_SCOPE, "cpuset.cpus.exclusive") == "1-4"
    assert read(root, box, "cpuset.cpus") == "" and read(root, PODMAN_SCOPE, "cpuset.cpus") == ""
    assert not (root / "run/systemd/transient/libpod-4c1d9e.scope.d").exists()
    rep2 = verify_plan(plan_profile(tree_kernel(root), prof), read_state(tree_kernel(root)))
    assert rep2.count("drifted") == 0, [ln.target for ln in rep2.lines]
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_a_transient_scopes_dropin_is_beside_its_unit(tmp_path: Path) -> None:
    """A transient scope without Delegate= that holds the server itself: told AllowedCPUs=,
    whose drop-in systemd keeps under /run/systemd/transient (and removes with the unit)."""
    root = host(tmp_path)
    scope = "/system.slice/run-r3f2.scope"
    vllm_tree(root, cgroup=scope)
    unit_file = root / "run/systemd/transient/run-r3f2.scope"
    unit_file.parent.mkdir(parents=True)
    unit_file.write_text("[Scope]\n")
    before = digest(root)
    prof = load_profile(profile_file(tmp_path))
    plan, rep = apply_profile(tree_kernel(root), prof)
    (said,) = notes(plan, "cpuset: partition in place: ")
    assert f"{scope} (unit run-r3f2.scope, told AllowedCPUs=1-4)" in said, said
    assert rep.failed == [] and cgroups_of(root) == {scope}
    dropin = root / "run/systemd/transient/run-r3f2.scope.d/50-AllowedCPUs.conf"
    assert "AllowedCPUs=1-4" in dropin.read_text()
    assert not (root / "run/systemd/system.control/run-r3f2.scope.d").exists()
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before


def test_a_session_scope_with_a_shell_falls_back_to_the_move(tmp_path: Path) -> None:
    root = host(tmp_path)
    scope = "/system.slice/session-4.scope"
    vllm_tree(root, cgroup=scope)
    add_process(
        root, 7100, comm="bash", cmdline=["-bash"], exe="/bin/bash", start_time=9, cgroup=scope
    )
    plan = plan_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    (said,) = notes(plan, "cpuset: not partitioned in place: ")
    assert f"{scope} also holds pid 7100 ('bash'), not the server's" in said
    assert f"moved out of {scope} into /gputuned.inference" in said
    assert len(moves(plan)) == len(TREE)


def test_a_users_session_is_never_partitioned_in_place(tmp_path: Path) -> None:
    root = host(tmp_path)
    home = "/user.slice/user-990.slice/session-3.scope"
    vllm_tree(root, cgroup=home)
    plan = plan_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    (said,) = notes(plan, "cpuset: not partitioned in place: ")
    assert f"{home} is a user's cgroup: its user may move any of their processes in" in said


def test_a_kernel_without_exclusive_cpus_falls_back(tmp_path: Path) -> None:
    """h200-vm was captured on a kernel without cpuset.cpus.exclusive (before 6.7)."""
    root = host(tmp_path, tree="h200-vm")
    vllm_tree(root, cgroup=UNIT)
    plan = plan_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    (said,) = notes(plan, "cpuset: not partitioned in place: ")
    assert "this kernel has no cpuset.cpus.exclusive (Linux 6.7+)" in said
    assert len(moves(plan)) == len(TREE)


def test_what_the_process_list_missed_is_no_stranger(tmp_path: Path) -> None:
    """A plan reads every process, then the unit's cgroup.procs. A child the server forked in
    between (a restarting vLLM spawns its engine) and a process that exited in between are
    not strangers; a shell whose parent's PID a server process once had (PIDs are reused)
    is. Before this, the QEMU lane's restart under load fell back to the move for good."""
    root = host(tmp_path)
    vllm_tree(root, cgroup=UNIT)
    prof = load_profile(profile_file(tmp_path))
    ctx = read_context(tree_kernel(root), prof)
    claims = claim_processes(ctx)
    assert inplace.decide(ctx, claims).place is not None
    # forked after the process list was read: the engine's second worker, its own child
    child(root, 5040, CORE, inherited=False, comm="VLLM::Worker_TP1", cgroup=UNIT)
    child(root, 5050, 5040, inherited=False, comm="python3", cgroup=UNIT)
    procs = root / CG / UNIT.strip("/") / "cgroup.procs"
    procs.write_text(procs.read_text() + "5060\n")  # gone from /proc already
    got = inplace.decide(ctx, claims)
    assert got.place is not None and got.why_not is None, got
    # a process whose parent has a claimed PID but not its start time: someone else's
    for pid, ppid, comm, start in ((5070, 5080, "bash", 9), (5080, 1, "sshd", 8)):
        exe = f"/usr/bin/{comm}"
        add_process(
            root, pid, comm=comm, cmdline=[comm], exe=exe, start_time=start, ppid=ppid, cgroup=UNIT
        )
    # the daemon's claims still hold an earlier 5080, one of the server's
    claims[5080] = dataclasses.replace(claims[API], start=1)
    got = inplace.decide(ctx, claims)
    assert got.place is None and got.why_not is not None, got
    assert "pid 5070 ('bash'), not the server's" in got.why_not
    del claims[5080]
    remove_process(root, 5080)  # its parent gone: the shell is still no child of the server
    got = inplace.decide(ctx, claims)
    assert got.why_not is not None and "pid 5070 ('bash')" in got.why_not, got


def test_two_server_units_for_one_partition_fall_back(tmp_path: Path) -> None:
    root = host(tmp_path)
    vllm_tree(root, cgroup=UNIT)
    add_process(
        root,
        6000,
        comm="python3",
        cmdline=["python3", "-m", "vllm.entrypoints.openai.api_server"],
        exe="/usr/bin/python3.11",
        start_time=60,
        cgroup="/system.slice/inference-b.service",
        uid=990,
    )
    plan = plan_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    (said,) = notes(plan, "cpuset: not partitioned in place: ")
    assert "the server's processes are in 2 cgroups" in said
    assert len(moves(plan)) == len(TREE) + 1


def test_daemon_first_then_the_unit_starts_stops_and_restarts(tmp_path: Path) -> None:
    """The placeholder holds the CPUs until the unit's processes appear; they get the
    partition in place; the unit stops (its cgroup removed by systemd): the placeholder takes
    the CPUs back; the restarted unit's processes are placed in place again; the daemon's
    stop leaves the host as it was."""
    root = host(tmp_path)
    tree_kernel(root).mkdir(f"/{CG}/system.slice")  # systemd's, there before any unit
    before = digest(root)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    assert read(root, "/gputuned.inference", "cpuset.cpus.partition") == "root"

    def start_unit() -> None:
        vllm_tree(root, cgroup=UNIT)
        feed(d, *(ProcEvent("exec", p, p) for p in TREE))

    start_unit()
    assert cgroups_of(root) == {UNIT}
    assert read(root, UNIT, "cpuset.cpus.partition") == "root"
    assert read(root, "/gputuned.inference", "cpuset.cpus.partition") == "member"
    assert read(root, "/gputuned.inference", "cpuset.cpus") == ""
    assert (root / DROPIN).is_file()

    # systemctl stop: every process ends, then systemd removes the unit's cgroup.
    for pid in TREE:
        remove_process(root, pid)
    tree_kernel(root).rmdir(f"/{CG}{UNIT}")
    feed(d, *(ProcEvent("exit", p, p) for p in TREE))
    assert read(root, "/gputuned.inference", "cpuset.cpus.partition") == "root"
    assert read(root, "/gputuned.inference", "cpuset.cpus.exclusive.effective") == "1-4"
    assert read(root, "/system.slice", "cpuset.cpus.exclusive") == ""
    assert not (root / DROPIN).exists()
    assert d.claims == {}

    start_unit()  # systemctl start (or the second half of a restart)
    assert cgroups_of(root) == {UNIT}
    assert read(root, UNIT, "cpuset.cpus.partition") == "root"
    assert read(root, UNIT, "cpuset.cpus.exclusive.effective") == "1-4"
    assert d.stop() == 0
    for pid in TREE:  # the unit outlives the daemon, as it was before it
        remove_process(root, pid)
    tree_kernel(root).rmdir(f"/{CG}{UNIT}")
    assert digest(root) == before


def test_a_restart_seen_in_one_batch_of_events_is_placed_in_place_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """systemctl restart: the old processes' exits and the new ones' execs arrive together,
    and the new cgroup has the old one's name; it is no partition until the daemon makes it
    one again. The journal says where the server's partition is, once while it stays."""
    caplog.set_level(logging.INFO, logger="gputuned")
    root = host(tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    vllm_tree(root, cgroup=UNIT)
    feed(d, *(ProcEvent("exec", p, p) for p in TREE))
    assert read(root, UNIT, "cpuset.cpus.partition") == "root"
    for pid in TREE:
        remove_process(root, pid)
    tree_kernel(root).rmdir(f"/{CG}{UNIT}")
    vllm_tree(root, cgroup=UNIT)
    assert read(root, UNIT, "cpuset.cpus.partition") == "member"
    feed(d, *(ProcEvent("exit", p, p) for p in TREE), *(ProcEvent("exec", p, p) for p in TREE))
    assert read(root, UNIT, "cpuset.cpus.partition") == "root"
    assert read(root, UNIT, "cpuset.cpus.exclusive.effective") == "1-4"
    assert cgroups_of(root) == {UNIT}
    said = [r.getMessage() for r in caplog.records if "partition" in r.getMessage()]
    assert [m for m in said if m.startswith("daemon: cpuset: ")] == [
        f"daemon: cpuset: partition in place: {UNIT} (unit inference.service, told "
        "AllowedCPUs=1-4) becomes the partition on 1-4; the server's processes stay in it, so "
        "stopping the unit stops them all, its status lists them and its MemoryMax=/TasksMax= "
        "still apply"
    ], said
    assert d.stop() == 0


def test_the_unit_ends_while_systemd_has_cpuset_at_the_root_only_for_it(tmp_path: Path) -> None:
    """The QEMU lane's guest: the root enabled cpuset only for the unit (systemd did, for its
    AllowedCPUs=). Its processes end before systemd removes its cgroup; giving AllowedCPUs=
    back makes systemd take cpuset from the root, and with it the placeholder's cpuset files.
    The apply enables cpuset at the root again after that hand-back, so the placeholder is made
    a partition at once (it failed on ENOENT and waited for a drift repair); the daemon's stop
    then ends clean."""
    root = host(tmp_path)
    (root / CG / "cpuset.cpus.isolated").write_text("\n")  # Linux 6.7+ (not captured)
    tree_kernel(root).write_text(f"/{CG}/cgroup.subtree_control", "-cpuset")
    tree_kernel(root).mkdir(f"/{CG}/system.slice")  # systemd's, there before any unit
    before = digest(root)
    vllm_tree(root, cgroup=UNIT)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    assert read(root, UNIT, "cpuset.cpus.partition") == "root"
    assert not (root / CG / "gputuned.inference").exists()

    for pid in TREE:  # the processes end; the unit's cgroup is still there
        remove_process(root, pid)
    feed(d, *(ProcEvent("exit", p, p) for p in TREE))
    assert "cpuset" in read(root, "", "cgroup.subtree_control").split()
    assert read(root, "/gputuned.inference", "cpuset.cpus.partition") == "root"
    assert read(root, "/gputuned.inference", "cpuset.cpus.exclusive.effective") == "1-4"
    assert "partition" not in d.status, d.status

    tree_kernel(root).rmdir(f"/{CG}{UNIT}")  # systemd, once the unit is stopped
    assert d.stop() == 0
    assert not (root / "run/gputuned/journal.jsonl").exists()
    assert digest(root) == before
