"""Revert: what gputuned changed goes back, and only that (gputuned/engine/revert.py).

Revert is the promise the product rests on: after ``gputunectl revert`` (or a daemon's stop) the
host is as it was, what could not be put back is said and kept for the next try, and nothing
gputuned did not give is taken away. Each test sets a host tree up with a real apply (the shipped
shared-host profile, or a nice-only rule), changes the tree as a host changes meanwhile
(children started, PIDs reused, cgroups removed, a process moved by hand) and reverts.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import socket
import time
import tomllib
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cpulist import format_cpulist
from gputuned.engine.apply import apply_profile, restore_processes, revert_all
from gputuned.engine.applyreport import RevertReport
from gputuned.engine.grub import write_dropin
from gputuned.engine.journal import Journal
from gputuned.engine.revert import forget_process
from gputuned.kernel.proc import read_process
from gputuned.kernel.tasks import where
from gputuned.profile.load import load_profile, parse_profile
from gputuned.profile.model import Profile
from gputuned.sim.tree import SimKernel
from gputuned.store.state import ACTIVE, GRUB_DROPIN, JOURNAL, STATE, HostLock
from tests.fakeproc import add_process, add_thread, remove_process, remove_thread
from tests.faults import FaultKernel, tree_kernel
from tests.unit.test_apply import PROFILES, SERVER_UID, digest, tree_copy
from tests.unit.test_daemon import profile_file
from tests.unit.test_irqbalance import FakeIrqbalance
from tests.unit.test_process_tree import (
    API,
    CORE,
    HOME,
    PART,
    PLACED,
    TRACKER,
    TRACKER_CMD,
    UNTUNED,
    WORKER,
    api,
    child,
    state,
    stranger,
    vllm_tree,
)

CG = "/sys/fs/cgroup"
ROOT_PROCS = f"{CG}/cgroup.procs"
HOME_PROCS = f"{CG}{HOME}/cgroup.procs"
OTHER = 6000  # a second server, placed by the same rule
IRQBALANCE = 700


def partition(**rule: object) -> Profile:
    """shared-host as shipped (4 CPUs), less [irq]: the partition and the server's placement
    (``rule``: more keys for the server's rule)."""
    text = (PROFILES / "shared-host.toml").read_text().replace("count = 8", "count = 4")
    data = tomllib.loads(text)
    del data["irq"]
    data["process"][0].update(rule)
    return parse_profile(data, "partition")


def nice_only() -> Profile:
    """The server and its children at nice -10, nothing else: no cgroup is made."""
    rule = {"name": "server", "match": {"cmdline": "vllm", "user": "inference"}, "nice": -10}
    return parse_profile({"name": "nice-only", "process": [rule]}, "test")


def host(tmp_path: Path) -> Path:
    """The captured H200 tree with the API server running, nothing applied yet."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root)
    return root


def applied(root: Path, profile: Profile) -> None:
    _plan, report = apply_profile(tree_kernel(root), profile)
    assert report.failed == [], report.failed


def second_server(root: Path) -> None:
    add_process(
        root,
        OTHER,
        comm="python3",
        cmdline=["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8001"],
        exe="/usr/bin/python3.11",
        start_time=600,
        threads=[OTHER + 1],
        cgroup=HOME,
        uid=SERVER_UID,
    )


def process(root: Path, pid: int, ppid: int, start: int, **kw: object) -> None:
    """A Python process (``kw``: add_process's cgroup, nice, cpus, threads)."""
    add_process(
        root,
        pid,
        comm="python3",
        cmdline=["/usr/bin/python3", "-c", "pass"],
        exe="/usr/bin/python3.11",
        start_time=start,
        ppid=ppid,
        uid=SERVER_UID,
        **kw,  # type: ignore[arg-type]
    )


def journal_of(root: Path) -> list[tuple[str, str]]:
    """(target, original) of every journaled value, newest first."""
    return [(e.op.target, e.old) for e in Journal(tree_kernel(root)).newest_first()]


def pids_in_journal(root: Path) -> set[int]:
    return {e.op.data["pid"] for e in Journal(tree_kernel(root)).entries() if "pid" in e.op.data}


def exists(root: Path, hpath: str) -> bool:
    return (root / hpath.lstrip("/")).exists()


def nice_of(root: Path, pid: int) -> list[int]:
    return [t.nice for t in read_process(tree_kernel(root), pid).threads]


def said_of(report: RevertReport, pid: int) -> list[str]:
    """What the report says went back to process ``pid`` that gputuned never journaled (its
    cgroup, or a thread's attribute), by the names the report gives them."""
    said = re.compile(rf"pid {pid} \([^)]*\) (cgroup|thread \d+ \w+)")
    return sorted(r["target"] for r in report.restored if said.fullmatch(r["target"]))


def written(k: FaultKernel) -> list[str]:
    return [w.path for w in k.writes]


# ---- the whole revert ------------------------------------------------------------------------


def test_revert_puts_back_each_journaled_value_once_and_leaves_no_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user reads the report as the list of what went back: every journaled value, once, with
    its original; afterwards the host is byte for byte as before and gputuned keeps no state."""
    root = host(tmp_path)
    before = digest(root)
    applied(root, load_profile(profile_file(tmp_path)))  # shared-host as shipped: IRQs too
    journaled = journal_of(root)
    assert len(journaled) > 20 and exists(root, STATE) and exists(root, ACTIVE)
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="gputuned"):
        rep = revert_all(tree_kernel(root))
    took = time.monotonic() - t0
    assert rep.failed == [] and rep.notes == []
    assert sorted((r["target"], r["value"]) for r in rep.restored) == sorted(journaled)
    assert digest(root) == before
    assert not exists(root, JOURNAL), "an empty journal is removed, not left with drop lines"
    assert not exists(root, STATE) and not exists(root, ACTIVE)
    assert "to retry" not in caplog.text, "nothing was left for a second pass"
    assert 0 < rep.seconds <= took
    again = tree_kernel(root)  # nothing left: a second revert writes nothing
    rep2 = revert_all(again)
    assert rep2.restored == [] and rep2.failed == [] and again.writes == []


def test_the_report_gives_its_time_in_tenths_of_a_millisecond() -> None:
    """``gputunectl revert --json`` prints the report as to_json makes it."""
    rep = RevertReport(
        restored=[{"target": "t", "value": "v"}],
        failed=[{"target": "u", "error": "e"}],
        notes=["n"],
        seconds=0.123456,
    )
    assert rep.to_json() == {
        "restored": [{"target": "t", "value": "v"}],
        "failed": [{"target": "u", "error": "e"}],
        "notes": ["n"],
        "seconds": 0.1235,
        "deactivated": None,
    }


def test_a_value_that_does_not_read_back_fails_and_stays_for_the_next_revert(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write the kernel accepts but that does not hold is not "restored": the report says what
    reads back, the journal keeps that entry, the state stays, and the next revert finishes."""
    root = host(tmp_path)
    applied(root, nice_only())
    k = tree_kernel(root)
    k.inject(where(API, API + 1, "nice"), "drop", 0)  # the thread sets its own nice back at once
    with caplog.at_level(logging.INFO, logger="gputuned"):
        rep = revert_all(k)
    assert [f["error"] for f in rep.failed] == ["wrote '0', reads back '-10'"]
    assert f"thread {API + 1}" in rep.failed[0]["target"]
    assert [e.op.key for e in Journal(tree_kernel(root)).entries()] == [
        f"thread:{API}:1000:{API + 1}:nice"
    ]
    assert exists(root, STATE) and exists(root, ACTIVE), "kept: the revert is not done"
    assert "revert: pass 1 left 1 value(s) to retry" in caplog.text
    assert "revert: pass 2 left 1 value(s) to retry" in caplog.text
    rep2 = revert_all(tree_kernel(root))
    assert rep2.failed == [] and [r["value"] for r in rep2.restored] == ["0"]
    assert nice_of(root, API) == [0, 0, 0]
    assert not exists(root, STATE) and not exists(root, ACTIVE)


def test_a_daemon_that_stops_reverts_under_its_own_lock_and_keeps_the_profile(
    tmp_path: Path,
) -> None:
    """The daemon holds the host lock for its life and keeps one open journal: its revert runs
    under that lock, on that journal, and leaves active.json for the next start. Anyone else's
    revert waits for the lock instead of racing it."""
    root = host(tmp_path)
    applied(root, nice_only())
    k = tree_kernel(root)
    journal = Journal(k)
    with HostLock(k):
        with pytest.raises(errors.Busy, match="another gputuned apply or revert is running"):
            revert_all(tree_kernel(root))
        assert nice_of(root, API) == [-10, -10, -10]
        rep = revert_all(k, lock=False, journal=journal, forget_profile=False)
    assert rep.failed == [] and len(journal) == 0
    assert nice_of(root, API) == [0, 0, 0]
    assert not exists(root, STATE) and exists(root, ACTIVE)


def test_the_grub_dropin_goes_back_only_when_a_user_asks(tmp_path: Path) -> None:
    """The drop-in of ``bootargs --write-grub`` is for the next boot: a daemon's stop leaves it;
    ``gputunectl revert`` (boot_config) puts it back."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    k = tree_kernel(root)
    assert write_dropin(
        k, 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT nohz_full=2-15"\n'
    )
    rep = revert_all(k)
    assert rep.failed == [] and exists(root, GRUB_DROPIN)
    rep = revert_all(k, boot_config=True)
    assert rep.failed == [] and not exists(root, GRUB_DROPIN)
    assert [r["target"] for r in rep.restored] == [GRUB_DROPIN]


def test_a_journal_line_gputuned_refuses_fails_the_revert_and_is_kept(tmp_path: Path) -> None:
    """A save naming something gputuned never writes is not restored: the revert puts back the
    rest, reports the line for a person to check, and keeps it and the state."""
    root = host(tmp_path)
    applied(root, nice_only())
    bad = {"v": 1, "op": "save", "entry": {"key": "sysfs:/etc/shadow", "tuner": "irq",
           "target": "x", "kind": "sysfs", "path": "/etc/shadow", "value": "x", "old": ""}}  # fmt: skip
    with (root / JOURNAL.lstrip("/")).open("a") as f:
        f.write(json.dumps(bad) + "\n")
    rep = revert_all(tree_kernel(root))
    assert nice_of(root, API) == [0, 0, 0]
    assert [f["target"] for f in rep.failed] == [f"{JOURNAL} line 4"]
    assert "refused, not restored" in rep.failed[0]["error"]
    assert "/etc/shadow" in (root / JOURNAL.lstrip("/")).read_text()
    assert exists(root, STATE)


def test_a_value_that_holds_only_once_an_older_one_is_back_gets_a_second_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that chose its own CPUs (0,5-15) cannot get them back while it is still in the
    partition (1-4: the kernel refuses CPUs outside its cpuset); once it is back in its cgroup,
    the second pass puts them back, and the revert succeeds."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root, cpus="0,5-15")
    before = digest(root)
    applied(root, partition())
    assert state(root, API) == PLACED
    with caplog.at_level(logging.INFO, logger="gputuned"):
        rep = revert_all(tree_kernel(root))
    assert rep.failed == [], rep.failed
    assert "revert: pass 1 left 3 value(s) to retry" in caplog.text
    assert "pass 2 left" not in caplog.text
    assert digest(root) == before


# ---- what placements passed on: children (step 2) --------------------------------------------


def test_children_started_after_a_one_shot_apply_get_their_parents_originals(
    tmp_path: Path,
) -> None:
    """No daemon saw them start: the server's child and grandchild carry the placement fork
    copied (partition, nice, CPUs); revert finds them below the server and names each in the
    report with the placed process they came from."""
    root = host(tmp_path)
    applied(root, partition())
    child(root, CORE, API, inherited=True, threads=1)
    child(root, WORKER, CORE, inherited=True)
    rep = revert_all(tree_kernel(root))
    assert rep.failed == [] and rep.notes == []
    assert state(root, CORE) == UNTUNED and state(root, WORKER) == UNTUNED
    for pid in (CORE, WORKER):
        label = f"pid {pid} (python3, started by placed pid {API})"
        assert said_of(rep, pid) == sorted(
            [f"{label} cgroup"]
            + [f"{label} thread {t} {a}" for t in (pid, pid + 1) for a in ("nice", "affinity")]
        )
    assert not exists(root, f"{CG}{PART}")


def test_revert_gives_back_only_what_a_child_still_shows_from_gputuned(tmp_path: Path) -> None:
    """A child that changed its own cgroup, nice or CPUs after it inherited the placement keeps
    what it chose; only what still shows what gputuned gave goes back."""
    root = host(tmp_path)
    applied(root, partition())
    mine = f"{HOME}/mine"
    process(root, CORE, API, 1010, cgroup=mine, nice=-5, cpus="0,5-15")  # all its own
    process(root, TRACKER, API, 1030, cgroup=PART, nice=-5, cpus="1-4")  # its own nice only
    rep = revert_all(tree_kernel(root))
    assert rep.failed == [] and rep.notes == []
    assert state(root, CORE) == (mine, {-5}, {frozenset({0, *range(5, 16)})})
    assert said_of(rep, CORE) == []
    assert state(root, TRACKER) == (HOME, {-5}, {frozenset(range(16))})
    label = f"pid {TRACKER} (python3, started by placed pid {API})"
    assert said_of(rep, TRACKER) == [f"{label} cgroup", f"{label} thread {TRACKER} affinity"]


def test_children_of_a_server_reniced_without_a_partition_get_their_nice_back(
    tmp_path: Path,
) -> None:
    """A profile that only renices makes no cgroup: the children that inherited the nice level
    are still found and given theirs back."""
    root = host(tmp_path)
    applied(root, nice_only())
    process(root, CORE, API, 1010, nice=-10, threads=[CORE + 1])
    process(root, WORKER, CORE, 1020, nice=-10)
    rep = revert_all(tree_kernel(root))
    assert rep.failed == []
    assert nice_of(root, API) == [0, 0, 0]
    assert nice_of(root, CORE) == [0, 0] and nice_of(root, WORKER) == [0]


def test_a_child_gets_the_original_of_its_parents_main_thread(tmp_path: Path) -> None:
    """Which thread forked a child is not known: it gets the main thread's original, not that
    of a thread that had chosen another nice level before gputuned (here one whose TID, given
    after the PIDs wrapped around, is below the PID: journaled first)."""
    root = host(tmp_path)
    wrapped = API - 10
    add_thread(root, API, wrapped, cpus="0-15", nice=5)
    applied(root, nice_only())
    assert nice_of(root, API) == [-10, -10, -10, -10]
    process(root, CORE, API, 1010, nice=-10)
    assert revert_all(tree_kernel(root)).failed == []
    assert nice_of(root, API) == [5, 0, 0, 0]
    assert nice_of(root, CORE) == [0]


def test_children_of_a_server_whose_main_thread_ended_get_their_nice_back(
    tmp_path: Path,
) -> None:
    """A main thread may end before the others (pthread_exit): the children still get the
    original the server's remaining threads had."""
    root = host(tmp_path)
    remove_thread(root, API, API)
    applied(root, nice_only())
    process(root, CORE, API, 1010, nice=-10)
    assert revert_all(tree_kernel(root)).failed == []
    assert nice_of(root, CORE) == [0]


def test_a_helper_the_rule_leaves_out_and_what_it_started_are_left_as_they_are(
    tmp_path: Path,
) -> None:
    """The resource tracker, forked with the server's placement, was given its originals back
    when the rule turned out to exclude it (journaled as given, "all its cgroup allows" for its
    CPUs); a process it started later has nothing of gputuned's: revert leaves both as they are."""
    profile = partition(exclude={"cmdline": r"multiprocessing\.resource_tracker"})
    root = host(tmp_path)
    applied(root, profile)
    child(root, TRACKER, API, inherited=True, cmdline=TRACKER_CMD, threads=0)
    applied(root, profile)  # excluded: given back
    assert state(root, TRACKER) == UNTUNED
    late = 5040
    process(root, late, TRACKER, 1040, cgroup=HOME)
    rep = revert_all(tree_kernel(root))
    assert rep.failed == [] and said_of(rep, late) == []
    assert state(root, API) == UNTUNED and state(root, TRACKER) == UNTUNED
    assert state(root, late) == UNTUNED


def test_a_failure_below_the_server_is_reported_once_and_kept_for_the_next_try(
    tmp_path: Path,
) -> None:
    """Every process of the tree was placed; a later child of one of them cannot be reniced:
    the report names it once, and the state stays so that the next revert tries again."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    vllm_tree(root)
    applied(root, nice_only())
    assert pids_in_journal(root) == {API, CORE, WORKER, TRACKER}
    late = 5040
    process(root, late, CORE, 1040, nice=-10)
    k = tree_kernel(root)
    k.inject(where(late, late, "nice"), "write", errno.EPERM)
    rep = revert_all(k)
    assert [f["target"] for f in rep.failed] == [
        f"pid {late} (python3, started by placed pid {CORE}) thread {late} nice"
    ]
    assert exists(root, STATE)
    for pid in (API, CORE, WORKER, TRACKER):
        assert nice_of(root, pid) == [0] * len(nice_of(root, pid)), pid


# ---- reused PIDs and processes that exited -----------------------------------------------------


def test_a_pid_reused_by_another_process_is_left_alone_with_its_children(tmp_path: Path) -> None:
    """The server exited and its PID now belongs to another program, which chose nice -10 for
    itself and its child: revert touches neither, and still finishes."""
    root = host(tmp_path)
    applied(root, nice_only())
    remove_process(root, API)
    process(root, API, 1, 2000, nice=-10)  # same PID, later start time
    process(root, CORE, API, 2010, nice=-10)
    k = tree_kernel(root)
    rep = revert_all(k)
    assert rep.failed == [] and k.writes == []
    assert nice_of(root, API) == [-10] and nice_of(root, CORE) == [-10]
    assert not exists(root, JOURNAL) and not exists(root, STATE)


def test_a_placed_process_that_exited_leaves_nothing_to_put_back(tmp_path: Path) -> None:
    """Its settings went with it: revert writes nothing for it, fails nothing, and forgets it."""
    root = host(tmp_path)
    applied(root, nice_only())
    remove_process(root, API)
    k = tree_kernel(root)
    rep = revert_all(k)
    assert rep.failed == [] and k.writes == []
    assert not exists(root, JOURNAL) and not exists(root, STATE)


def test_a_child_that_reuses_the_pid_of_an_exited_placed_child_gets_its_parents_originals(
    tmp_path: Path,
) -> None:
    """EngineCore was placed and exited; a new child of the server got its PID (a later start
    time) and inherited the server's nice: it is the server's child, not the old EngineCore."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    vllm_tree(root)
    applied(root, nice_only())
    remove_process(root, WORKER)
    remove_process(root, CORE)
    process(root, CORE, API, 9000, nice=-10)
    rep = revert_all(tree_kernel(root))
    assert rep.failed == []
    assert nice_of(root, CORE) == [0]
    assert said_of(rep, CORE) == [
        f"pid {CORE} (python3, started by placed pid {API}) thread {CORE} nice"
    ]


def test_the_sweep_says_when_it_cannot_list_the_processes(tmp_path: Path) -> None:
    """If the process table cannot be read, children that inherited the placement may be left
    tuned: the revert fails and says so, rather than reporting success."""
    root = host(tmp_path)
    applied(root, nice_only())
    process(root, 7000, 1, 70)
    k = tree_kernel(root)
    k.inject("/proc/7000/stat", "read", errno.EIO)
    rep = revert_all(k)
    assert [f["target"] for f in rep.failed] == ["processes started by placed ones"]
    assert nice_of(root, API) == [0, 0, 0]
    assert exists(root, STATE)


def test_an_unrelated_process_whose_cgroup_cannot_be_read_does_not_fail_the_revert(
    tmp_path: Path,
) -> None:
    """Finding the server's children needs only each process's parent: another process's
    unreadable cgroup file (another namespace, a broken mount) is none of revert's business."""
    root = host(tmp_path)
    applied(root, nice_only())
    process(root, 7000, 1, 70)
    process(root, CORE, API, 1010, nice=-10)
    k = tree_kernel(root)
    k.inject("/proc/7000/cgroup", "read", errno.EIO)
    rep = revert_all(k)
    assert rep.failed == []
    assert nice_of(root, CORE) == [0]


# ---- gputuned's own cgroups (step 3) ----------------------------------------------------------


class ExitsOnceListed(FaultKernel):
    """A tree's kernel where process ``pid`` exits just after revert lists ``cgroup``'s
    processes: it is listed, and gone by the time revert looks at it."""

    def __init__(self, root: Path, cgroup: str, pid: int) -> None:
        super().__init__(SimKernel(root))
        self.tree, self.listing, self.exiting = root, f"{CG}{cgroup}/cgroup.procs", pid

    def read_bytes(self, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        data = super().read_bytes(hpath, offset, size)
        if hpath == self.listing and (self.tree / f"proc/{self.exiting}").exists():
            remove_process(self.tree, self.exiting)
        return data


def test_someone_elses_process_in_gputuneds_cgroup_is_moved_to_its_parent_before_it_goes(
    tmp_path: Path,
) -> None:
    """A shell put into the partition by hand keeps the cgroup busy: it is moved to the
    partition's parent before gputuned takes the partition apart, and the notes say so. One that
    exits while revert looks at it is no error."""
    root = host(tmp_path)
    before = digest(root)
    applied(root, partition())
    stranger(root, 6999)
    stranger(root, 7000)
    k = ExitsOnceListed(root, PART, 6999)
    rep = revert_all(k)
    assert rep.failed == []
    assert read_process(tree_kernel(root), 7000).cgroup == "/"
    assert rep.notes == [
        f"pid 7000 (bash) was still in {PART}, not placed by gputuned and started by no process "
        "it placed: moved to /, the parent of that cgroup"
    ]
    assert not exists(root, f"{CG}{PART}")
    log = written(k)
    moved = log.index(ROOT_PROCS)
    assert moved < min(i for i, p in enumerate(log) if p.startswith(f"{CG}{PART}"))
    remove_process(root, 7000)
    assert digest(root) == before


def test_a_reused_pid_in_gputuneds_cgroup_is_not_sent_where_the_old_process_came_from(
    tmp_path: Path,
) -> None:
    """The server exited and a shell with its PID sits in the partition: it is someone else's
    process, moved to the partition's parent, not to the server's original cgroup."""
    root = host(tmp_path)
    applied(root, partition())
    remove_process(root, API)
    add_process(
        root, API, comm="bash", cmdline=["bash"], exe="/bin/bash", start_time=8, cgroup=PART
    )
    rep = revert_all(tree_kernel(root))
    assert rep.failed == []
    assert read_process(tree_kernel(root), API).cgroup == "/"
    assert any(n.startswith(f"pid {API} (bash) was still in {PART}") for n in rep.notes)


def test_a_servers_child_in_a_cgroup_below_the_partition_is_named_as_the_servers(
    tmp_path: Path,
) -> None:
    """A child that made itself a cgroup inside the partition is found there, moved out and
    named in the report as the server's child, not as someone else's process; the cgroup it
    made is not gputuned's to remove, and the report says it holds the partition."""
    root = host(tmp_path)
    applied(root, partition())
    sub = f"{PART}/engine"
    process(root, CORE, API, 1010, cgroup=sub, nice=-10, cpus="1-4")
    rep = revert_all(tree_kernel(root))
    # gputuned removes only cgroups it made: the child's stays, and so does the partition.
    assert rep.failed == [
        {
            "target": "cgroup gputuned.inference",
            "error": f"rmdir {CG}{PART}: busy (EBUSY); the cgroup has child cgroups; remove "
            "them first; still inside: child cgroups",
        }
    ]
    assert read_process(tree_kernel(root), CORE).cgroup == "/"
    label = f"pid {CORE} (python3, started by placed pid {API})"
    assert f"{label} cgroup" in said_of(rep, CORE)
    assert not any("not placed by gputuned" in n for n in rep.notes)


def test_a_server_that_cannot_go_back_to_its_cgroup_stays_and_the_next_revert_retries(
    tmp_path: Path,
) -> None:
    """The server's own cgroup refuses it back: it is not dumped in some other cgroup; it stays
    in the partition, which stays with its journal entries and says what holds it, and the next
    revert, once the cgroup takes it, finishes the job."""
    root = host(tmp_path)
    applied(root, partition())
    k = tree_kernel(root)
    k.inject(HOME_PROCS, "write", errno.EIO)
    rep = revert_all(k)
    assert read_process(tree_kernel(root), API).cgroup == PART
    errs = {f["target"]: f["error"] for f in rep.failed}
    (partition_error,) = [e for t, e in errs.items() if t == "cgroup gputuned.inference"]
    assert partition_error.endswith(f"; still inside: pid {API} (python3)")
    assert any(t.endswith("cgroup") and str(API) in t for t in errs), errs
    assert exists(root, f"{CG}{PART}") and exists(root, STATE)
    assert f"proc_cgroup:{API}:1000" in {e.op.key for e in Journal(tree_kernel(root)).entries()}
    assert revert_all(tree_kernel(root)).failed == []
    assert state(root, API) == UNTUNED and not exists(root, f"{CG}{PART}")


def test_what_holds_gputuneds_cgroup_is_named_in_the_error_the_first_eight(
    tmp_path: Path,
) -> None:
    """Shells put into the partition by hand cannot be moved out (the kernel refuses): they
    stay, and the error names what is still inside by PID and name, the first eight, a PID
    that has exited by its number alone."""
    root = host(tmp_path)
    applied(root, partition())
    for pid in range(7000, 7010):
        stranger(root, pid)
    procs = root / f"{CG}{PART}/cgroup.procs".lstrip("/")
    procs.write_text("6999\n" + procs.read_text())  # listed, /proc/6999 gone
    k = tree_kernel(root)
    k.inject(ROOT_PROCS, "write", errno.EBUSY)
    rep = revert_all(k)
    assert state(root, API) == UNTUNED
    assert {read_process(tree_kernel(root), p).cgroup for p in range(7000, 7010)} == {PART}
    (inside,) = [f["error"] for f in rep.failed if f["target"] == "cgroup gputuned.inference"]
    names = ", ".join(["pid 6999"] + [f"pid {p} (bash)" for p in range(7000, 7007)])
    assert inside.endswith(f"; still inside: {names}"), inside
    assert exists(root, f"{CG}{PART}") and exists(root, STATE)


def test_an_original_cgroup_that_is_gone_sends_processes_to_its_nearest_ancestor(
    tmp_path: Path,
) -> None:
    """The login session the server came from ended: the server and its child go to the
    nearest cgroup that still exists, and the notes say where."""
    root = host(tmp_path)
    applied(root, partition())
    child(root, CORE, API, inherited=True, threads=0)
    tree_kernel(root).rmdir(f"{CG}{HOME}")
    moved = Journal(tree_kernel(root)).get(f"proc_cgroup:{API}:1000")
    assert moved is not None
    rep = revert_all(tree_kernel(root))
    assert rep.failed == []
    up = HOME.rsplit("/", 1)[0]
    assert read_process(tree_kernel(root), API).cgroup == up
    assert read_process(tree_kernel(root), CORE).cgroup == up
    assert rep.notes == [
        f"{moved.op.target}: its cgroup {HOME} no longer exists; moved to {up}, the nearest "
        "existing ancestor"
    ]


def test_without_a_visible_cgroup_mount_revert_still_puts_back_what_it_can(
    tmp_path: Path,
) -> None:
    """Run where /proc/mounts shows no cgroup v2 (another mount namespace), revert cannot look
    inside gputuned's cgroups; it still restores every other value, reports what it could not
    put back, and keeps it for a revert run where the mount is seen."""
    root = host(tmp_path)
    applied(root, partition())
    mounts = root / "proc/mounts"
    mounts.write_text(
        "".join(ln for ln in mounts.read_text().splitlines(True) if "cgroup2" not in ln)
    )
    rep = revert_all(tree_kernel(root))
    assert nice_of(root, API) == [0, 0, 0]
    assert "cgroup gputuned.inference" in [f["target"] for f in rep.failed]
    assert f"proc_cgroup:{API}:1000" in {e.op.key for e in Journal(tree_kernel(root)).entries()}
    assert exists(root, STATE)


# ---- one process at a time (unregister, exit) --------------------------------------------------


def test_restore_processes_puts_back_only_the_given_server_and_its_children(
    tmp_path: Path,
) -> None:
    """``gputunectl unregister`` of one server gives it and the children it started back their
    originals; the other server, the partition and their journal entries stay until the other
    server is unregistered too."""
    root = host(tmp_path)
    second_server(root)
    applied(root, partition())
    child(root, CORE, API, inherited=True, threads=0)
    k = tree_kernel(root)
    journal = Journal(k)
    others = {e.op.key for e in journal.entries() if e.op.data.get("pid") != API}
    rep = restore_processes(k, {API}, journal=journal)
    assert rep.failed == []
    assert state(root, API) == UNTUNED and state(root, CORE) == UNTUNED
    assert state(root, OTHER) == PLACED and exists(root, f"{CG}{PART}")
    assert {e.op.key for e in journal.entries()} == others
    assert {e.op.key for e in Journal(tree_kernel(root)).entries()} == others
    assert all(str(API) in r["target"] or str(CORE) in r["target"] for r in rep.restored)
    assert rep.to_json()["failed"] == []
    # Without a daemon's open journal, the journal file is read.
    assert restore_processes(tree_kernel(root), {OTHER}).failed == []
    assert state(root, OTHER) == UNTUNED and exists(root, f"{CG}{PART}")
    assert pids_in_journal(root) == set()


def test_forget_process_drops_only_that_process_and_writes_nothing(tmp_path: Path) -> None:
    """A placed process exited: its entries are forgotten (nothing to restore), the other
    server's stay and are reverted later."""
    root = host(tmp_path)
    second_server(root)
    applied(root, nice_only())
    remove_process(root, API)
    k = tree_kernel(root)
    journal = Journal(k)
    assert forget_process(k, API, journal=journal) == 3
    assert k.writes == []
    assert {e.op.data["pid"] for e in journal.entries()} == {OTHER}
    assert pids_in_journal(root) == {OTHER}
    assert forget_process(tree_kernel(root), API) == 0
    assert revert_all(tree_kernel(root)).failed == []
    assert nice_of(root, OTHER) == [0, 0]


# ---- settings that show later ---------------------------------------------------------------


class RescanningIrqbalance(FakeIrqbalance):
    """irqbalance as it is: ``settings`` take effect at its next rescan (every 10 s), so a
    ``setup`` right after them still shows the old ones."""

    def __init__(self, path: Path) -> None:
        self.pending: list[str] = []
        super().__init__(path)

    def answer(self, conn: socket.socket, text: str) -> None:
        if text.startswith("settings "):
            self.pending.append(text)  # shown at the next rescan, not now
        else:
            super().answer(conn, text)

    def rescan(self) -> None:
        for text in self.pending:
            self.take(text)
        self.pending = []


def test_irqbalance_settings_count_as_put_back_before_its_next_rescan(tmp_path: Path) -> None:
    """irqbalance shows new settings only at its next rescan: revert counts what it told
    irqbalance as done (not as a failed read-back), and irqbalance ends with its own again."""
    root = host(tmp_path)
    add_process(
        root,
        IRQBALANCE,
        comm="irqbalance",
        cmdline=["/usr/sbin/irqbalance", "--foreground"],
        exe="/usr/sbin/irqbalance",
        start_time=500,
        cgroup="/system.slice/irqbalance.service",
    )
    fake = RescanningIrqbalance(root / f"run/irqbalance/irqbalance{IRQBALANCE}.sock")
    try:
        applied(root, load_profile(profile_file(tmp_path)))
        fake.rescan()
        assert format_cpulist(fake.banned) == "1-15" and fake.irqs == tuple(range(42, 50))
        rep = revert_all(tree_kernel(root))
        assert rep.failed == []
        assert fake.pending == ["settings ban irqs NONE", "settings cpus NULL"]
        fake.rescan()
        assert fake.banned == frozenset() and fake.irqs == ()
        assert not exists(root, JOURNAL)
    finally:
        fake.close()
