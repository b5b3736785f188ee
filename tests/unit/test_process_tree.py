"""Servers are process trees: placed whole, reverted whole, and only the server's.

The tree is shaped like vLLM V1 (vllm/v1/engine/core_client.py, vllm/v1/executor/
multiproc_executor.py): the API server, whose command line names vllm, starts EngineCore with
multiprocessing's spawn context; EngineCore starts a GPU worker the same way; Python's resource
tracker is one more child. Spawned children's command lines name no server, and setproctitle
renames them (comm "VLLM::EngineCor", 15 characters kept).

Two orders, as on a real host: the tree exists before gputuned (one-shot apply or daemon start
walks it), or the daemon is up first and children appear with what fork copied from a placed
parent (nice, affinity, cgroup). Events are fed to the daemon directly (ProcEvent), so each step
is deterministic.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.daemon.core import Daemon
from gputuned.engine.apply import apply_profile, revert_all
from gputuned.engine.journal import Journal
from gputuned.engine.plan import plan_profile, read_context
from gputuned.kernel.oserrors import translate
from gputuned.kernel.proc import ancestor_in, read_process
from gputuned.profile.load import load_profile, parse_profile
from gputuned.service.control import PeerCred
from gputuned.service.procwatch import ProcEvent
from gputuned.store.state import JOURNAL
from gputuned.tuners.procplan import ProcessTuner
from tests.fakeproc import add_process, remove_process
from tests.faults import FaultKernel, tree_kernel
from tests.unit.test_apply import SERVER_UID, digest, tree_copy
from tests.unit.test_daemon import profile_file

API, CORE, WORKER, TRACKER = 5000, 5010, 5020, 5030
SPAWN = [
    "/usr/bin/python3",
    "-c",
    "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
    "--multiprocessing-fork",
]
TRACKER_CMD = [
    "/usr/bin/python3",
    "-c",
    "from multiprocessing.resource_tracker import main;main(6)",
]
HOME = "/user.slice/user-990.slice/session-3.scope"
PART = "/gputuned.inference"
INFERENCE = frozenset(range(1, 5))  # shared-host.toml with count = 4 on the 16-CPU H200 tree
ALL = frozenset(range(16))


@pytest.fixture(autouse=True)
def _quiet_notify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)


def api(
    root: Path,
    *,
    uid: int = SERVER_UID,
    cgroup: str = HOME,
    argv: list[str] | None = None,
    cpus: str = "0-15",
) -> None:
    """The API server. Started while the partition exists, it has only the CPUs the
    partition leaves (``cpus``), as the kernel gives a new process its cgroup's."""
    add_process(
        root,
        API,
        comm="python3",
        cmdline=argv or ["python3", "-W", "ignore", "-m", "vllm.entrypoints.openai.api_server"],
        exe="/usr/bin/python3.11",
        start_time=1000,
        threads=[API + 1, API + 2],
        cgroup=cgroup,
        uid=uid,
        cpus=cpus,
    )


def python(root: Path, pid: int, argv: list[str], *, start: int, **kw: Any) -> None:
    """A Python process of someone's (``kw``: add_process's uid, cgroup, ppid, ...)."""
    add_process(
        root, pid, comm="python3", cmdline=argv, exe="/usr/bin/python3.11", start_time=start, **kw
    )


def stranger(root: Path, pid: int = 7000) -> None:
    """A shell someone put into gputuned's partition by hand."""
    add_process(
        root, pid, comm="bash", cmdline=["bash"], exe="/bin/bash", start_time=7, cgroup=PART
    )


def child(
    root: Path,
    pid: int,
    ppid: int,
    *,
    inherited: bool,
    comm: str = "python3",
    cmdline: list[str] | None = None,
    cgroup: str = HOME,
    threads: int = 1,
) -> None:
    """A child as fork left it: with its parent's placement (``inherited``) or untouched."""
    add_process(
        root,
        pid,
        comm=comm,
        cmdline=cmdline or SPAWN,
        exe="/usr/bin/python3.11",
        start_time=1000 + pid,
        threads=[pid + 1 + i for i in range(threads)],
        cgroup=PART if inherited else cgroup,
        nice=-10 if inherited else 0,
        cpus="1-4" if inherited else "0-15",
        ppid=ppid,
        uid=SERVER_UID,
    )


def vllm_tree(root: Path, *, inherited: bool = False, cgroup: str = HOME) -> None:
    """API server, EngineCore (renamed), its worker (renamed), the resource tracker."""
    api(root, cgroup=cgroup)
    child(root, CORE, API, inherited=inherited, comm="VLLM::EngineCore", threads=2, cgroup=cgroup)
    child(root, WORKER, CORE, inherited=inherited, comm="VLLM::Worker_TP0", cgroup=cgroup)
    child(root, TRACKER, API, inherited=inherited, cmdline=TRACKER_CMD, cgroup=cgroup)


def state(root: Path, pid: int) -> tuple[str, set[int], set[frozenset[int]]]:
    """(cgroup, nice of every thread, CPUs of every thread)."""
    p = read_process(tree_kernel(root), pid)
    return p.cgroup, {t.nice for t in p.threads}, {t.affinity for t in p.threads}


PLACED = (PART, {-10}, {INFERENCE})
UNTUNED = (HOME, {0}, {ALL})


def journaled_pids(root: Path) -> set[int]:
    return {
        int(e.op.data["pid"]) for e in Journal(tree_kernel(root)).entries() if "pid" in e.op.data
    }


@pytest.fixture
def daemon(tmp_path: Path) -> tuple[Daemon, Path]:
    """A daemon on a tree with no server yet (each test starts and stops it)."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    return Daemon(tree_kernel(root), profile_path=profile_file(tmp_path)), root


def feed(d: Daemon, *events: ProcEvent) -> None:
    assert d.watcher is not None
    d.watcher.read = lambda: list(events)  # type: ignore[method-assign]
    d._on_proc_events()
    while d.new_threads:  # new threads: a few hundred a turn of the loop
        d._place_threads()


# ---- item 1: trees, both orders ---------------------------------------------------------------


def test_tree_first_apply_places_every_descendant_and_revert_is_exact(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    vllm_tree(root)
    before = digest(root)
    prof = load_profile(profile_file(tmp_path))
    plan, report = apply_profile(tree_kernel(root), prof)
    assert report.failed == []
    for pid in (API, CORE, WORKER, TRACKER):
        assert state(root, pid) == PLACED, pid
    assert journaled_pids(root) == {API, CORE, WORKER, TRACKER}
    assert any("placed only while the daemon (gputuned) runs" in n for n in plan.notes)
    # Re-planning finds the tree again (a child's claim comes from its parent, not its name).
    again = plan_profile(tree_kernel(root), prof)
    writes = [c for c in again.changes if not c.report_only]  # [neighbours] is report only
    assert writes == [], [c.target for c in writes]
    rep = revert_all(tree_kernel(root))
    assert rep.failed == [] and rep.notes == []
    assert digest(root) == before


@pytest.mark.parametrize("other_users", [False, True])
def test_a_descendant_of_another_user_is_left_out_unless_the_rule_says(
    tmp_path: Path, other_users: bool
) -> None:
    """Issue 30, item 8: the server's ``sudo`` child (uid 0) and a helper it starts as another
    account are not given the server's nice level and partition, and plan says so; with
    ``other_users = true`` they follow as before."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    vllm_tree(root)
    add_process(
        root, 5040, comm="sudo", cmdline=["sudo", "nvidia-smi"], exe="/usr/bin/sudo",
        start_time=5040, ppid=API, uid=0,
    )  # fmt: skip
    add_process(
        root, 5041, comm="nvidia-smi", cmdline=["nvidia-smi"], exe="/usr/bin/nvidia-smi",
        start_time=5041, ppid=5040, uid=0,
    )  # fmt: skip
    add_process(
        root, 5050, comm="sh", cmdline=["sh", "-c", "x"], exe="/bin/sh",
        start_time=5050, ppid=CORE, uid=4321,
    )  # fmt: skip
    text = profile_file(tmp_path).read_text()
    if other_users:
        text = text.replace('name = "server"\n', 'name = "server"\nother_users = true\n', 1)
    prof = tmp_path / "prof.toml"
    prof.write_text(text)
    plan = plan_profile(tree_kernel(root), load_profile(prof))
    claims = ProcessTuner().plan_tree(read_context(tree_kernel(root), load_profile(prof)))[1]
    roles = {pid: claims[pid].role for pid in (API, CORE, 5040, 5041, 5050)}
    if other_users:
        assert set(roles.values()) <= {"match", "child"}, roles
    else:
        assert roles == {
            API: "match", CORE: "child", 5040: "excluded", 5041: "excluded", 5050: "excluded"
        }  # fmt: skip
        (note,) = [n for n in plan.notes if "another user" in n]
        assert "2 descendant(s)" in note and "PID 5040, 5050" in note, note


def test_daemon_first_children_get_their_parents_originals_back(
    daemon: tuple[Daemon, Path],
) -> None:
    d, root = daemon
    d.start()
    api(root, cpus="0,5-15")  # started while the partition holds 1-4
    feed(d, ProcEvent("exec", API, API))
    assert state(root, API) == PLACED
    # Spawned after the placement: fork copied nice, CPUs and cgroup; nothing is written, but
    # each is journaled with the API server's originals.
    child(root, CORE, API, inherited=True, threads=2)
    feed(d, ProcEvent("fork", CORE, CORE, API), ProcEvent("exec", CORE, CORE))
    (root / f"proc/{CORE}/comm").write_text("VLLM::EngineCor\n")  # setproctitle
    feed(d, ProcEvent("comm", CORE, CORE))
    child(root, WORKER, CORE, inherited=True)
    feed(d, ProcEvent("fork", WORKER, WORKER, CORE))
    assert set(d.placed) == {API, CORE, WORKER}
    assert d.claims[WORKER].role == "child" and d.claims[WORKER].parent == CORE
    journal = Journal(tree_kernel(root))
    for pid in (CORE, WORKER):
        olds = {e.op.kind: e.old for e in journal.entries() if e.op.data.get("pid") == pid}
        assert olds == {"nice": "0", "affinity": "cgroup-default", "proc_cgroup": HOME}, pid
    assert d.stop() == 0
    for pid in (API, CORE, WORKER):
        assert state(root, pid) == UNTUNED, pid
    assert not (root / "sys/fs/cgroup/gputuned.inference").exists()


def test_daemon_start_walks_a_running_tree(daemon: tuple[Daemon, Path]) -> None:
    d, root = daemon
    vllm_tree(root)
    d.start()
    assert set(d.placed) == {API, CORE, WORKER, TRACKER}
    for pid in (API, CORE, WORKER, TRACKER):
        assert state(root, pid) == PLACED, pid
    assert d.stop() == 0
    for pid in (API, CORE, WORKER, TRACKER):
        assert state(root, pid) == UNTUNED, pid


def test_excluded_helpers_and_ignored_children_get_the_originals_back(
    daemon: tuple[Daemon, Path],
) -> None:
    d, root = daemon
    assert d.profile_path is not None
    text = d.profile_path.read_text()
    # The first rule leaves the resource tracker out.
    d.profile_path.write_text(
        text.replace(
            'children = "follow"\n',
            "children = \"follow\"\nexclude.cmdline = 'multiprocessing\\.resource_tracker'\n",
            1,
        )
    )
    d.start()
    api(root)
    feed(d, ProcEvent("exec", API, API))
    # Forked before its exec, the tracker runs the API server's command line for a moment:
    # placed as a child; the exec shows what it is, and it gets its originals back.
    child(root, TRACKER, API, inherited=True, cmdline=TRACKER_CMD)
    feed(d, ProcEvent("fork", TRACKER, TRACKER, API), ProcEvent("exec", TRACKER, TRACKER))
    assert d.claims[TRACKER].role == "excluded" and TRACKER not in d.placed
    assert state(root, TRACKER) == UNTUNED
    child(root, CORE, API, inherited=True)
    feed(d, ProcEvent("fork", CORE, CORE, API))
    assert state(root, CORE) == PLACED
    assert d.stop() == 0
    for pid in (API, CORE, TRACKER):
        assert state(root, pid) == UNTUNED, pid


def test_children_ignore_places_only_the_matched_process(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    prof = profile_file(tmp_path)
    prof.write_text(prof.read_text().replace('children = "follow"', 'children = "ignore"'))
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    api(root)
    feed(d, ProcEvent("exec", API, API))
    child(root, CORE, API, inherited=True)
    feed(d, ProcEvent("fork", CORE, CORE, API))
    assert state(root, API) == PLACED and state(root, CORE) == UNTUNED
    assert d.stop() == 0
    assert state(root, API) == UNTUNED and state(root, CORE) == UNTUNED


def test_revert_puts_back_children_started_after_a_one_shot_apply(tmp_path: Path) -> None:
    """No daemon watched them start: revert finds them below the placed server."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root)
    apply_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    child(root, CORE, API, inherited=True, threads=2)
    child(root, WORKER, CORE, inherited=True)
    rep = revert_all(tree_kernel(root))
    assert rep.failed == [], rep.failed
    for pid in (API, CORE, WORKER):
        assert state(root, pid) == UNTUNED, pid
    gave = [r["target"] for r in rep.restored if "started by placed pid" in r["target"]]
    assert any(t.startswith(f"pid {WORKER} ") for t in gave), gave
    assert not (root / "sys/fs/cgroup/gputuned.inference").exists()


def test_revert_moves_out_what_it_did_not_place_then_removes_its_cgroup(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root)
    apply_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    # Someone put a process of their own into the partition by hand.
    stranger(root)
    rep = revert_all(tree_kernel(root))
    assert rep.failed == [], rep.failed
    assert read_process(tree_kernel(root), 7000).cgroup == "/"
    assert any("pid 7000 (bash) was still in /gputuned.inference" in n for n in rep.notes), (
        rep.notes
    )
    assert not (root / "sys/fs/cgroup/gputuned.inference").exists()


def test_the_nearest_ancestor_is_found_by_pid_and_start_time(tmp_path: Path) -> None:
    """kernel/proc.py ancestor_in(): what revert (a process left in gputuned's cgroup) and the
    partition in place (a process the plan's list missed) use to tell the server's own."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    vllm_tree(root)
    k = tree_kernel(root)
    api_start = read_process(k, API).start_time
    assert ancestor_in(k, WORKER, {API: api_start}) == API
    assert ancestor_in(k, WORKER, {API: api_start, CORE: 1000 + CORE}) == CORE  # the nearest
    assert ancestor_in(k, WORKER, {API: api_start + 1}) is None  # a reused PID is not it
    assert ancestor_in(k, API, {API: api_start}) is None  # not its own ancestor
    assert ancestor_in(k, 4242, {API: api_start}) is None  # gone
    remove_process(root, CORE)  # its parent gone: the walk ends there
    assert ancestor_in(k, WORKER, {API: api_start}) is None


def moving_profile(tmp_path: Path) -> Path:
    """shared-host with in_place = false: a unit's processes are moved into the partition."""
    p = profile_file(tmp_path)
    p.write_text(p.read_text().replace("[cpuset]\n", "[cpuset]\nin_place = false\n", 1))
    return p


def test_an_original_cgroup_that_is_gone_sends_the_process_to_its_nearest_ancestor(
    tmp_path: Path,
) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root, cgroup="/system.slice/inference.service")
    apply_profile(tree_kernel(root), load_profile(moving_profile(tmp_path)))
    tree_kernel(root).rmdir("/sys/fs/cgroup/system.slice/inference.service")  # the unit restarted
    rep = revert_all(tree_kernel(root))
    assert rep.failed == []
    assert read_process(tree_kernel(root), API).cgroup == "/system.slice"
    assert any(
        "its cgroup /system.slice/inference.service no longer exists; moved to /system.slice" in n
        for n in rep.notes
    ), rep.notes


def test_what_is_left_fails_the_revert_and_the_daemon_stop(
    daemon: tuple[Daemon, Path], caplog: pytest.LogCaptureFixture
) -> None:
    d, root = daemon
    d.start()
    api(root)
    feed(d, ProcEvent("exec", API, API))
    stranger(root)
    # The kernel refuses to move it out (a frozen cgroup's task, say).
    d.kernel.inject("/sys/fs/cgroup/cgroup.procs", "write", errno.EBUSY)
    with caplog.at_level(logging.INFO, logger="gputuned"):
        assert d.stop() == 3
    said = caplog.text
    assert "revert cgroup gputuned.inference failed" in said
    assert "still inside: pid 7000 (bash)" in said
    # The bash's cgroup and gputuned's cgroup. Its cpuset.cpus is emptied with the bash still
    # inside: a member may, on cgroup v2 (validate_change() refuses it on v1 only).
    assert "stopping with 2 value(s) not put back" in said, said
    assert Journal(tree_kernel(root)).entries(), "what failed stays in the journal"
    assert (root / "sys/fs/cgroup/gputuned.inference").is_dir()
    # Once the kernel lets it go, gputunectl revert finishes the job.
    rep = revert_all(tree_kernel(root))
    assert rep.failed == [] and not (root / "sys/fs/cgroup/gputuned.inference").exists()
    assert read_process(tree_kernel(root), 7000).cgroup == "/"


def test_enospc_on_a_cpuset_says_what_holds_it() -> None:
    exc = translate(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "write", "/sys/fs/cgroup/g/cpuset.cpus"
    )
    assert "still holds processes" in str(exc) and "filesystem" not in str(exc)
    disk = translate(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "write", "/run/gputuned/journal.jsonl"
    )
    assert "free space on that filesystem" in str(disk)


# ---- item 2: only the server ------------------------------------------------------------------


def test_the_shipped_rules_give_other_users_processes_nothing(tmp_path: Path) -> None:
    """vllm.py of another user, `exec -a "python3 vllm"`, a user unit named like the server's."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root, uid=1000, argv=["python3", "vllm.py"])
    python(root, 6000, ["python3 vllm", "serve"], start=6, uid=1000)
    unit = "/user.slice/user-1000.slice/user@1000.service/app.slice/inference.service"
    python(
        root,
        6100,
        ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        start=61,
        uid=1000,
        cgroup=unit,
    )
    plan = plan_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    procs = [c for c in plan.settings if c.tuner == "process"]
    assert procs == [], [c.target for c in procs]


def test_a_system_unit_is_matched_exactly_and_still_after_the_move(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root, uid=0, cgroup="/system.slice/inference.service")
    python(
        root,
        6000,
        ["python3", "-m", "vllm.x"],
        start=6,
        cgroup="/system.slice/not-inference.service",
    )
    prof = load_profile(moving_profile(tmp_path))
    plan, report = apply_profile(tree_kernel(root), prof)
    assert report.failed == []
    assert {c.data["pid"] for c in plan.settings if c.tuner == "process"} == {API}
    assert state(root, API)[0] == PART
    # In the partition it is in no unit, but the journal knows where it came from: still
    # matched, so a re-apply keeps it placed (it does not restore it as a leftover).
    plan2, report2 = apply_profile(tree_kernel(root), prof)
    assert report2.written == [] and report2.restored == []
    assert {c.data["pid"] for c in plan2.settings if c.tuner == "process"} == {API}
    assert revert_all(tree_kernel(root)).failed == []
    assert state(root, API)[0] == "/system.slice/inference.service"


def test_a_shipped_profile_on_a_host_without_its_account_is_a_note(tmp_path: Path) -> None:
    root = tree_copy("ci-vm", tmp_path, server=False)
    (root / "etc/passwd").unlink()
    plan = plan_profile(tree_kernel(root), load_profile(profile_file(tmp_path)), allow_blocked=True)
    assert any("no account 'inference'" in n for n in plan.notes), plan.notes


@pytest.mark.parametrize(
    ("match", "extra", "refused"),
    [
        ({"cmdline": "vllm"}, {"nice": -10}, True),
        ({"comm": "python3", "exe": "/usr/bin/python3"}, {"cpus": "inference"}, True),
        ({"uses_gpu": 0}, {"policy": "fifo", "priority": 10}, True),
        ({"cgroup": "/user.slice/user-1000.slice"}, {"nice": -5}, True),
        ({"cmdline": "vllm"}, {"nice": 5}, False),  # lowers priority: anyone may
        ({"cmdline": "vllm"}, {"nice": -10, "any_user": True}, False),
        ({"cmdline": "vllm"}, {"nice": -10, "report_only": True}, False),
        ({"cmdline": "vllm", "user": "inference"}, {"nice": -10}, False),
        ({"cmdline": "vllm", "uid": 0}, {"nice": -10}, False),
        ({"unit": "vllm.service"}, {"nice": -10}, False),
        ({"cgroup": "/system.slice"}, {"nice": -10}, False),
        # The kubelet makes a pod's cgroup for any tenant's pod (issue 30): systemd driver,
        # cgroupfs driver, and a kubelet with a cgroup root of its own (kind).
        ({"cgroup": "/kubepods.slice/kubepods-burstable.slice/"}, {"nice": -10}, True),
        ({"cgroup": "/kubepods/burstable"}, {"cpus": "inference"}, True),
        ({"cgroup": "/kubepods.slice"}, {"nice": -10}, True),
        ({"cgroup": "/kubelet.slice/kubelet-kubepods.slice/"}, {"nice": -10}, True),
        ({"cgroup": "/kubepods.slice/", "uid": 60000}, {"nice": -10}, False),
    ],
)
def test_who_may_have_it(match: dict[str, Any], extra: dict[str, Any], refused: bool) -> None:
    data = {
        "name": "t",
        "cpusets": {"inference": {"cpus": "1-2"}},
        "process": [{"name": "s", "match": match, **extra}],
    }
    if refused:
        with pytest.raises(errors.ProfileError, match=r"process\[0\]\.match: any local user"):
            parse_profile(data, "t")
    else:
        parse_profile(data, "t")


@pytest.mark.parametrize(
    ("match", "error"),
    [
        ({"unit": "user@1000.service"}, "a user's service manager"),
        ({"unit": "vllm"}, "is not a systemd unit name"),
        ({"unit": "a/b.service"}, "is not a systemd unit name"),
        ({"user": "-rf"}, "is not an account name"),
        ({"user": "inference", "uid": 990}, "give user or uid, not both"),
        ({"uid": -1}, "at least 0"),
    ],
)
def test_match_key_values(match: dict[str, Any], error: str) -> None:
    data = {"name": "t", "process": [{"name": "s", "match": match, "any_user": True}]}
    with pytest.raises(errors.ProfileError, match=error):
        parse_profile(data, "t")


# ---- item 3: register by identity ---------------------------------------------------------------


def test_register_takes_pid_and_start_and_refuses_the_rest(daemon: tuple[Daemon, Path]) -> None:
    d, root = daemon
    d.start()
    peer = PeerCred(1, 0, 0)
    python(root, 6000, ["python3", "serve.py"], start=600, uid=SERVER_UID)
    add_process(root, 6100, comm="kworker/0:1", cmdline=[], exe=None, start_time=1, ppid=2)
    stat = root / "proc/6100/stat"
    stat.write_text(stat.read_text().replace(" 4194560 ", f" {0x00200000} ", 1))  # PF_KTHREAD
    add_process(root, 1, comm="systemd", cmdline=["/sbin/init"], exe="/sbin/init", start_time=1)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"pid": "6000", "start": 600}, "pid must be a positive integer"),
        ({"pid": True, "start": 600}, "pid must be a positive integer"),
        ({"pid": 0, "start": 600}, "pid must be a positive integer"),
        ({"pid": -4, "start": 600}, "pid must be a positive integer"),
        ({"pid": 6000.0, "start": 600}, "pid must be a positive integer"),
        ({"pid": 6000, "start": "600"}, "start must be"),
        ({"pid": 6000}, "has no start time"),
        ({"pid": 6000, "start": 599}, "now belongs to another process"),
        ({"pid": 99999, "start": 1}, "there is no process 99999"),
        ({"pid": 1, "start": 1}, "PID 1 is the system's init"),
        ({"pid": 6100, "start": 1}, "is a kernel thread"),
        ({"pid": 6000, "start": 600, "rule": ["server"]}, "rule must be the name"),
    ]
    for req, msg in bad:
        with pytest.raises(errors.GputunedError, match=msg):
            d.requests.handle({"cmd": "register", **req}, peer)
    assert d.registered == {} and journaled_pids(root) == set()
    # gputuned itself
    from gputuned.daemon import control as daemon_mod

    real = daemon_mod._pid
    daemon_mod._pid = lambda: 6000  # type: ignore[assignment]
    try:
        with pytest.raises(errors.GputunedError, match="gputuned itself"):
            d.requests.handle({"cmd": "register", "pid": 6000, "start": 600}, peer)
    finally:
        daemon_mod._pid = real  # type: ignore[assignment]
    resp = d.requests.handle({"cmd": "register", "pid": 6000, "start": 600, "rule": "server"}, peer)
    assert resp["placed"] and d.registered == {6000: (600, "server")}
    # Its children follow it.
    child(root, 6010, 6000, inherited=True)
    feed(d, ProcEvent("fork", 6010, 6010, 6000))
    assert 6010 in d.placed
    # The registration dies with the process; its PID reused is not placed.
    remove_process(root, 6000)
    feed(d, ProcEvent("exit", 6000, 6000))
    assert d.registered == {}
    python(root, 6000, ["python3", "other.py"], start=777)
    feed(d, ProcEvent("exec", 6000, 6000))
    assert 6000 not in d.placed
    assert d.stop() == 0


def test_unregister_puts_the_whole_tree_back(daemon: tuple[Daemon, Path]) -> None:
    d, root = daemon
    d.start()
    peer = PeerCred(1, 0, 0)
    python(root, 6000, ["python3", "serve.py"], start=600, cgroup=HOME)
    d.requests.handle({"cmd": "register", "pid": 6000, "start": 600}, peer)
    child(root, 6010, 6000, inherited=True)
    feed(d, ProcEvent("fork", 6010, 6010, 6000))
    rep = d.requests.handle({"cmd": "unregister", "pid": 6000, "start": 600}, peer)
    assert rep["failed"] == []
    assert state(root, 6000) == UNTUNED and state(root, 6010) == UNTUNED
    assert journaled_pids(root) == set()
    assert d.stop() == 0


def test_the_journal_keeps_each_descendant_apart(tmp_path: Path) -> None:
    """Each process's originals are its own entries (keyed by its PID and start time)."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    vllm_tree(root)
    apply_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    lines = [json.loads(x) for x in (root / JOURNAL.lstrip("/")).read_text().splitlines()]
    keys = {e["entry"]["key"] for e in lines if e["op"] == "save"}
    for pid in (API, CORE, WORKER, TRACKER):
        assert f"proc_cgroup:{pid}:{read_process(tree_kernel(root), pid).start_time}" in keys
    assert revert_all(tree_kernel(root)).failed == []


def test_only_candidates_are_read_past_stat_and_cmdline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full plan reads exe only of processes whose comm, owner and cmdline a rule matches:
    the other processes of a host cost two reads each, and those whose comm matches their
    owner too (user IDs for the rule by user, the cgroup for the rule by unit), read before
    the command line its owner wrote is searched (issue 30)."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    for n in range(30):
        python(root, 8000 + n, ["python3", "-m", "http.server"], start=80 + n)
    api(root)
    read: list[str] = []
    real_read, real_link = FaultKernel.read_bytes, FaultKernel.readlink

    def reading(self: FaultKernel, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        read.append(hpath)
        return real_read(self, hpath, offset, size)

    def linking(self: FaultKernel, hpath: str) -> str:
        read.append(hpath)
        return real_link(self, hpath)

    monkeypatch.setattr(FaultKernel, "read_bytes", reading)
    monkeypatch.setattr(FaultKernel, "readlink", linking)
    plan = plan_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    assert {c.data["pid"] for c in plan.settings if c.tuner == "process"} == {API}
    others = [p for p in read if p.startswith("/proc/80") and not p.endswith(("/stat", "/cmdline"))]
    assert {p.rsplit("/", 1)[1] for p in others} == {"cgroup", "status"}, others[:5]
    assert f"/proc/{API}/status" in read and f"/proc/{API}/cgroup" in read
