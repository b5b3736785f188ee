"""The daemon's placements between full applies (gputuned/daemon/placing.py): a process a rule
matches, or one registered, is placed when its event arrives, its new threads one by one, and
what the daemon keeps of them (the drift check's settings, the journal, status and metrics)
follows them until they exit.

The daemon runs in-process on the captured H200 tree with the shipped shared-host rules (its
inference set cut to CPUs 1-4); process events are fed to it directly (ProcEvent), so every
step is deterministic, and the drift timer is made due by hand.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gputuned.daemon import core, placing
from gputuned.daemon.core import Daemon
from gputuned.engine.journal import Journal
from gputuned.engine.plan import read_context
from gputuned.kernel.proc import read_process
from gputuned.service.control import PeerCred
from gputuned.service.procwatch import ProcEvent
from gputuned.watch.exposition import daemon_metrics
from tests.fakeproc import add_thread, remove_process, remove_thread
from tests.faults import FaultKernel, tree_kernel
from tests.unit import test_process_tree_spread as spread
from tests.unit.test_apply import SERVER_UID, tree_copy
from tests.unit.test_daemon import profile_file
from tests.unit.test_gpu_placement import MEMBER, MINOR, PER_GPU_TOML, gpu_host, opens, server
from tests.unit.test_process_tree import (
    ALL,
    API,
    HOME,
    PLACED,
    UNTUNED,
    api,
    child,
    feed,
    python,
    state,
)

ROOT = PeerCred(pid=1, uid=0, gid=0)
VLLM = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
OTHER = 6000  # a second server, or a process someone registers


@pytest.fixture(autouse=True)
def _quiet_notify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    """A started daemon with the shared-host rules, on a tree with no server yet."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    yield d, root
    if d.running:
        d.stop()


def stop(d: Daemon) -> None:
    d.running = False
    assert d.stop() == 0


def status(d: Daemon) -> dict[str, Any]:
    """What `gputunectl status` gets over the control socket."""
    return d.requests.handle({"cmd": "status"}, ROOT)


def drift_check(d: Daemon) -> None:
    """The drift timer's turn (not a tenth tick: only what the daemon keeps is read)."""
    d._next["drift"] = 0.0
    d._timers()


def renice(root: Path, tid: int, nice: int = 0) -> None:
    """Someone (renice -p) sets a thread's nice."""
    k = tree_kernel(root)
    k.set_nice(tid, nice)


def journaled(root: Path, pid: int) -> set[str]:
    """The journal's keys of process ``pid``'s originals, as revert reads them."""
    return {e.op.key for e in Journal(tree_kernel(root)).entries() if e.op.data.get("pid") == pid}


def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path the daemon reads from now on (files, directories, links)."""
    read: list[str] = []
    real_read, real_list, real_link = (
        FaultKernel.read_bytes,
        FaultKernel.listdir,
        FaultKernel.readlink,
    )

    def reading(self: FaultKernel, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        read.append(hpath)
        return real_read(self, hpath, offset, size)

    def listing(self: FaultKernel, hpath: str) -> list[str]:
        read.append(hpath)
        return real_list(self, hpath)

    def linking(self: FaultKernel, hpath: str) -> str:
        read.append(hpath)
        return real_link(self, hpath)

    monkeypatch.setattr(FaultKernel, "read_bytes", reading)
    monkeypatch.setattr(FaultKernel, "listdir", listing)
    monkeypatch.setattr(FaultKernel, "readlink", linking)
    return read


def second_server(root: Path, pid: int = OTHER, **kw: Any) -> None:
    python(root, pid, VLLM, start=600, uid=SERVER_UID, threads=[pid + 1], **kw)


# ---- a new process and its threads -----------------------------------------------------------


def test_a_matched_process_is_placed_journaled_first_and_put_back_on_stop(
    daemon: tuple[Daemon, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that starts while the daemon runs gets the rule's partition, nice and CPUs on
    every thread at its exec event; each original is in the journal before anything of the
    process is written, so stopping the daemon puts it back as it was."""
    d, root = daemon
    order: list[str] = []
    real_write = FaultKernel._wrote

    def wrote(self: FaultKernel, rec: Any) -> None:
        order.append(rec.path)
        real_write(self, rec)

    def journaled_now() -> None:
        order.append(f"journal {len(journaled(root, API))}")

    monkeypatch.setattr(FaultKernel, "_wrote", wrote)
    real_flush = Journal.flush

    def flush(self: Journal) -> None:
        real_flush(self)
        journaled_now()

    monkeypatch.setattr(Journal, "flush", flush)
    api(root)
    feed(d, ProcEvent("exec", API, API))
    assert state(root, API) == PLACED
    assert API in status(d)["placed"]
    first = next(i for i, p in enumerate(order) if f"/proc/{API}" in p or "gputuned.inference" in p)
    assert any(e.startswith("journal ") and e != "journal 0" for e in order[:first]), order
    assert journaled(root, API) >= {f"proc_cgroup:{API}:1000", f"thread:{API}:1000:{API}:nice"}
    stop(d)
    assert state(root, API) == UNTUNED


def test_each_placement_that_writes_is_counted_once_and_logged(
    daemon: tuple[Daemon, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """status and the metrics count the placements that wrote something, one each, and the
    log says which processes, why and how many writes; a child that inherited its parent's
    placement (nothing to write) is placed without counting."""
    d, root = daemon
    with caplog.at_level(logging.INFO, logger="gputuned"):
        api(root)
        feed(d, ProcEvent("exec", API, API))
        child(root, API + 10, API, inherited=True)
        feed(d, ProcEvent("fork", API + 10, API + 10, API))
    assert API + 10 in status(d)["placed"]
    assert status(d)["daemon"]["placements"] == 1
    assert "gputuned_placements_total 1" in daemon_metrics(d.kernel, status(d), nvml=False)
    said = [r.getMessage() for r in caplog.records if "daemon: placed" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(f"daemon: placed [{API}] (new process): ")
    assert " write(s) in " in said[0] and said[0].endswith(" ms")
    second_server(root)
    feed(d, ProcEvent("exec", OTHER, OTHER))
    assert status(d)["daemon"]["placements"] == 2
    stop(d)


def test_a_new_thread_is_placed_and_every_thread_stays_under_the_drift_check(
    daemon: tuple[Daemon, Path],
) -> None:
    """A thread the server starts with other values than the rule's gets the rule's; the
    drift check then repairs that thread, and the process's older threads still, and
    stopping the daemon gives the new threads their own originals back."""
    d, root = daemon
    api(root, cpus="0,5-15")
    feed(d, ProcEvent("exec", API, API))
    # Each repair is a full re-plan, which reads every thread again: so each case gets a
    # thread placed just before, and only what that placement kept can tell.
    for new, reniced in ((API + 50, API + 50), (API + 51, API + 1)):
        add_thread(root, API, new, cpus="0-15", nice=0)
        feed(d, ProcEvent("thread", API, new, 1))
        assert state(root, API) == PLACED, new
        assert f"thread:{API}:1000:{new}:nice" in journaled(root, API)
        renice(root, reniced)  # someone renices the new thread, then an old one
        drift_check(d)
        assert state(root, API) == PLACED, reniced
    assert status(d)["daemon"]["repairs"] == 2
    stop(d)
    assert state(root, API) == UNTUNED


def test_a_placement_leaves_the_full_applys_settings_under_the_drift_check(
    daemon: tuple[Daemon, Path],
) -> None:
    """Placing a process adds its settings to what the drift check reads, replacing none of
    the others: an IRQ moved back after a placement is still repaired at the next check."""
    d, root = daemon
    irq = root / "proc/irq/42/smp_affinity_list"
    assert irq.read_text() == "1\n"
    api(root)
    feed(d, ProcEvent("exec", API, API))
    irq.write_text("0-15\n")
    drift_check(d)
    assert irq.read_text() == "1\n"
    stop(d)


def test_a_process_gone_before_it_is_read_is_skipped_quietly(
    daemon: tuple[Daemon, Path],
) -> None:
    """A server that exits between its event and its placement costs nothing: no error, no
    journal entry, not listed, not counted."""
    d, root = daemon
    api(root)
    remove_process(root, API)
    feed(d, ProcEvent("exec", API, API), ProcEvent("exit", API, API))
    assert API not in status(d)["placed"] and journaled(root, API) == set()
    assert status(d)["daemon"]["placements"] == 0
    stop(d)


def test_a_refused_write_leaves_the_rest_of_the_placement_applied(
    daemon: tuple[Daemon, Path],
) -> None:
    """The kernel refuses to move the server into the partition: its nice is still applied,
    and the daemon goes on (the drift check retries the move)."""
    d, root = daemon
    assert isinstance(d.kernel, FaultKernel)
    d.kernel.inject("/sys/fs/cgroup/gputuned.inference/cgroup.procs", "write", errno.EIO)
    api(root)
    feed(d, ProcEvent("exec", API, API))
    assert state(root, API)[:2] == (HOME, {-10})
    stop(d)
    assert state(root, API) == UNTUNED


# ---- re-placement -----------------------------------------------------------------------------


def test_a_placed_process_reniced_is_put_back_by_the_next_drift_check(
    daemon: tuple[Daemon, Path],
) -> None:
    """Placed between full applies, a server's settings are held like the full apply's:
    the drift check sees its nice undone and puts it back."""
    d, root = daemon
    api(root)
    feed(d, ProcEvent("exec", API, API))
    renice(root, API)
    drift_check(d)
    assert state(root, API) == PLACED
    assert status(d)["daemon"]["repairs"] >= 1
    stop(d)


# ---- a setting the kernel refuses: not possible here, not drift ---------------------------------


def test_the_daemon_agrees_with_plan_on_a_read_only_proc_irq(tmp_path: Path) -> None:
    """Issue 31, item 7: the daemon's verify and status count the IRQs of a read-only /proc/irq
    as plan counts them, not possible here, and no write is tried."""
    from gputuned.engine.plan import plan_profile
    from gputuned.profile.load import load_profile
    from tests.unit.test_cli_engine import RO_PROC_IRQ

    root = tree_copy("h200-captured", tmp_path, server=False)
    with (root / "proc/self/mountinfo").open("a") as f:
        f.write(RO_PROC_IRQ)
    prof = profile_file(tmp_path)
    plan = plan_profile(tree_kernel(root), load_profile(prof))
    impossible = {c.key for c in plan.settings if c.not_possible}
    assert len(impossible) >= 10
    host = tree_kernel(root)
    d = Daemon(host, profile_path=prof)
    d.start()
    try:
        st = status(d)
        assert st["verify"]["drifted"] == 0
        assert st["verify"]["not possible here"] >= len(impossible)
        assert impossible <= set(st["not_possible"])
        assert d.requests.handle({"cmd": "verify"}, ROOT)["exit_code"] == 0
        assert not any(w.path.startswith("/proc/irq") for w in host.writes)
    finally:
        stop(d)


@pytest.fixture
def realtime(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    """shared-host's rules with SCHED_FIFO 10: the partition's cgroup has no RT budget, so
    the kernel refuses the policy there (kernel/sched/syscalls.c, CONFIG_RT_GROUP_SCHED)."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    prof = profile_file(tmp_path)
    prof.write_text(prof.read_text().replace('policy = "other"', 'policy = "fifo"\npriority = 10'))
    api(root)
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    assert status(d)["verify"]["not possible here"] > 0
    yield d, root
    if d.running:
        d.stop()


def policies(root: Path, pid: int) -> dict[int, str]:
    return {t.tid: t.policy for t in read_process(tree_kernel(root), pid).threads}


def test_a_refused_real_time_policy_is_not_taken_for_drift(
    realtime: tuple[Daemon, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A policy the kernel refuses is "not possible here", for a process or thread placed
    between full applies as at the full apply: the drift check neither logs it as drift nor
    re-plans the whole host for it after each placement."""
    d, root = realtime
    add_thread(root, API, API + 50, cpus="1-4", nice=-10)
    second_server(root)
    feed(d, ProcEvent("thread", API, API + 50, 1), ProcEvent("exec", OTHER, OTHER))
    assert state(root, OTHER) == PLACED
    with caplog.at_level(logging.INFO, logger="gputuned"):
        drift_check(d)
    assert "drift" not in caplog.text
    stop(d)


def test_a_thread_placed_once_the_partition_allows_real_time_is_held_to_it(
    realtime: tuple[Daemon, Path],
) -> None:
    """Once the partition's cgroup has an RT budget, a new thread gets SCHED_FIFO, and the
    drift check puts it back when someone resets it."""
    d, root = realtime
    (root / "sys/fs/cgroup/gputuned.inference/cpu.rt_runtime_us").write_text("950000\n")
    tid = API + 50
    add_thread(root, API, tid, cpus="1-4", nice=-10)
    feed(d, ProcEvent("thread", API, tid, 1))
    assert policies(root, API)[tid] == "fifo"
    tree_kernel(root).set_scheduler(tid, "other", 0)
    drift_check(d)
    assert policies(root, API)[tid] == "fifo"
    stop(d)
    assert set(policies(root, API).values()) == {"other"}


# ---- the end of a process or thread ------------------------------------------------------------


def test_a_placed_process_that_exits_leaves_nothing_behind(
    daemon: tuple[Daemon, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Its journal entries go (the journal holds the living), status no longer lists it, the
    daemon keeps nothing of it, and the other servers are still held by the drift check."""
    d, root = daemon
    api(root)
    second_server(root)
    feed(d, ProcEvent("exec", API, API), ProcEvent("exec", OTHER, OTHER))
    assert {API, OTHER} <= set(status(d)["placed"])
    assert journaled(root, OTHER)
    with caplog.at_level(logging.INFO, logger="gputuned"):
        remove_process(root, OTHER)
        feed(d, ProcEvent("exit", OTHER, OTHER))
    assert journaled(root, OTHER) == set()
    assert OTHER not in status(d)["placed"]
    assert f"daemon: pid {OTHER} exited; forgot " in caplog.text
    # Nor does the daemon keep anything of it: one that places short-lived processes for
    # months must not grow with each.
    assert OTHER not in d.claims and OTHER not in d.held
    assert not [c for c in d.settings if c.data.get("pid") == OTHER]
    renice(root, API + 2)
    drift_check(d)
    assert state(root, API) == PLACED, "the other server is still held"
    stop(d)


def test_the_exit_of_a_process_never_placed_costs_nothing(
    daemon: tuple[Daemon, Path], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every process on the host exits some time: one the daemon never placed is neither
    logged nor looked for in the journal."""
    d, root = daemon
    api(root)
    feed(d, ProcEvent("exec", API, API))
    read = reads(monkeypatch)
    with caplog.at_level(logging.INFO, logger="gputuned"):
        feed(d, ProcEvent("exit", 4242, 4242))
    assert "exited" not in caplog.text
    assert read == []
    stop(d)


def test_unregistering_stops_the_drift_check_holding_the_process(
    daemon: tuple[Daemon, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """`gputunectl unregister` puts the process back, and from then on the drift check does
    not see it as drifted (nor re-plans the host because of it)."""
    d, root = daemon
    python(root, OTHER, ["python3", "serve.py"], start=600, cgroup=HOME)
    d.requests.handle({"cmd": "register", "pid": OTHER, "start": 600}, ROOT)
    assert state(root, OTHER) == PLACED
    d.requests.handle({"cmd": "unregister", "pid": OTHER, "start": 600}, ROOT)
    assert state(root, OTHER) == UNTUNED
    with caplog.at_level(logging.INFO, logger="gputuned"):
        drift_check(d)
    assert "drift" not in caplog.text
    assert state(root, OTHER) == UNTUNED
    assert status(d)["registered"] == {} and OTHER not in status(d)["placed"]
    stop(d)


def test_a_thread_that_ends_leaves_the_journal_and_the_drift_check(
    daemon: tuple[Daemon, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread's journal entries go with it, and the drift check reads only the threads
    alive: a server's threads that come and go cost nothing once gone."""
    d, root = daemon
    api(root)
    feed(d, ProcEvent("exec", API, API))
    base = journaled(root, API)
    tid = API + 70
    add_thread(root, API, tid, cpus="0-15")
    feed(d, ProcEvent("thread", API, tid, 1))
    assert journaled(root, API) > base
    remove_thread(root, API, tid)
    feed(d, ProcEvent("exit", API, tid))
    assert journaled(root, API) == base
    read = reads(monkeypatch)
    drift_check(d)
    assert not [p for p in read if f"/task/{tid}/" in p]
    assert state(root, API) == PLACED
    stop(d)
    assert state(root, API) == UNTUNED


def test_a_thread_that_ends_before_its_turn_is_not_looked_for(
    daemon: tuple[Daemon, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """New threads wait for their turn of the loop; one that ends meanwhile is dropped from
    the queue, not read."""
    d, root = daemon
    api(root)
    feed(d, ProcEvent("exec", API, API))
    tid = API + 70
    assert d.watcher is not None
    d.watcher.read = lambda: [ProcEvent("thread", API, tid, 1), ProcEvent("exit", API, tid)]  # type: ignore[method-assign]
    read = reads(monkeypatch)
    d._on_proc_events()
    while d.new_threads:
        d._place_threads()
    assert not [p for p in read if f"/task/{tid}" in p]
    stop(d)


def test_threads_of_a_process_that_exited_do_not_hold_up_anothers(
    daemon: tuple[Daemon, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that exits with hundreds of new threads still waiting takes them with it:
    the next turn of the loop places the threads of the processes still running."""
    d, root = daemon
    monkeypatch.setattr(core, "THREADS_A_TURN", 8)  # a turn's share, kept small here
    api(root)
    second_server(root)
    feed(d, ProcEvent("exec", API, API), ProcEvent("exec", OTHER, OTHER))
    storm = [API + 100 + i for i in range(core.THREADS_A_TURN + 2)]
    for tid in storm:
        add_thread(root, API, tid, cpus="1-4", nice=-10)
    late = OTHER + 50
    add_thread(root, OTHER, late, cpus="0-15", nice=0)
    assert d.watcher is not None
    events = [ProcEvent("thread", API, t, 1) for t in storm]
    events += [ProcEvent("thread", OTHER, late, 1), ProcEvent("exit", API, API)]
    d.watcher.read = lambda: events  # type: ignore[method-assign]
    remove_process(root, API)
    d._on_proc_events()
    d._place_threads()  # one turn of the loop
    assert state(root, OTHER) == PLACED
    stop(d)


def test_a_nice_only_rule_places_and_forgets_threads(tmp_path: Path) -> None:
    """A rule that sets only nice (no CPUs, no partition): new threads get it, and a thread
    that ends is forgotten quietly."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    prof = tmp_path / "nice.toml"
    prof.write_text(
        'name = "nice-only"\n[[process]]\nname = "server"\nmatch.user = "inference"\n'
        'match.cmdline = "vllm"\nnice = -5\n'
    )
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    api(root)
    feed(d, ProcEvent("exec", API, API))
    tid = API + 70
    add_thread(root, API, tid, cpus="0-15")
    feed(d, ProcEvent("thread", API, tid, 1))
    assert state(root, API) == (HOME, {-5}, {ALL})
    remove_thread(root, API, tid)
    feed(d, ProcEvent("exit", API, tid))
    assert all(f":{tid}:" not in k for k in journaled(root, API))
    stop(d)
    assert state(root, API) == UNTUNED


# ---- registrations ----------------------------------------------------------------------------


def test_a_registration_lasts_through_full_applies_and_ends_with_its_process(
    daemon: tuple[Daemon, Path],
) -> None:
    """A registered process stays placed through a full re-plan (events lost: a rescan);
    once it is gone, even unseen, the next full plan drops its registration, and the
    process that reuses its PID is not placed with its settings."""
    d, root = daemon
    python(root, OTHER, ["python3", "serve.py"], start=600, cgroup=HOME)
    d.requests.handle({"cmd": "register", "pid": OTHER, "start": 600, "rule": "server"}, ROOT)
    feed(d, ProcEvent("overflow", 0, 0))
    assert status(d)["registered"] == {str(OTHER): "server"}
    assert OTHER in status(d)["placed"] and state(root, OTHER) == PLACED
    remove_process(root, OTHER)  # its exit event lost too
    python(root, OTHER, ["python3", "other.py"], start=777, cgroup=HOME)
    feed(d, ProcEvent("overflow", 0, 0))
    assert status(d)["registered"] == {}
    assert OTHER not in status(d)["placed"]
    assert state(root, OTHER) == UNTUNED
    stop(d)


# ---- what status says of a process that binds itself --------------------------------------------


def test_a_binding_warning_lasts_as_long_as_the_process_would_bind_itself(
    daemon: tuple[Daemon, Path],
) -> None:
    """status repeats the plan's warning for a placed server started with --numa-bind; a
    re-exec without it takes the warning away, and so does its exit."""
    d, root = daemon
    api(root, argv=[*VLLM, "--numa-bind"])
    feed(d, ProcEvent("exec", API, API))
    (warning,) = status(d)["binding_warnings"]
    assert warning.startswith(f"process[server]: pid {API} (python3) will bind its own CPUs")
    cmdline = root / f"proc/{API}/cmdline"
    cmdline.write_bytes(b"\0".join(a.encode() for a in VLLM) + b"\0")
    feed(d, ProcEvent("exec", API, API))
    assert status(d)["binding_warnings"] == []
    cmdline.write_bytes(b"\0".join(a.encode() for a in [*VLLM, "--numa-bind"]) + b"\0")
    feed(d, ProcEvent("exec", API, API))
    assert len(status(d)["binding_warnings"]) == 1
    remove_process(root, API)
    feed(d, ProcEvent("exit", API, API))
    assert status(d)["binding_warnings"] == []
    stop(d)


def test_a_process_found_binding_itself_is_no_longer_listed_once_it_exits(
    daemon: tuple[Daemon, Path],
) -> None:
    """status lists a placed process that keeps setting its own CPUs back, and stops listing
    it when it exits."""
    d, root = daemon
    api(root)
    feed(d, ProcEvent("exec", API, API))
    k = tree_kernel(root)
    for _ in range(2):  # set back twice in a row, right after gputuned set them
        for t in read_process(k, API).threads:
            k.set_affinity(t.tid, frozenset({2, 3}))
        drift_check(d)
    assert [sb["pid"] for sb in status(d)["self_binding"]] == [API]
    remove_process(root, API)
    feed(d, ProcEvent("exit", API, API))
    assert status(d)["self_binding"] == []
    stop(d)


# ---- an idle daemon, a profile without process rules ---------------------------------------------


def test_an_idle_daemon_takes_process_events_quietly(tmp_path: Path) -> None:
    """No profile applied yet: process events place nothing and raise nothing."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    d = Daemon(tree_kernel(root))
    d.start()
    assert d.profile is None
    api(root)
    feed(d, ProcEvent("exec", API, API))
    assert status(d)["placed"] == [] and state(root, API) == UNTUNED
    stop(d)


def test_a_profile_without_process_rules_reads_no_new_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile with no [[process]] rule costs nothing per process started on the host:
    the daemon does not read it."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    prof = profile_file(tmp_path)
    prof.write_text(prof.read_text().split("# --- The inference server")[0])
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    assert d.profile is not None and not d.profile.process
    api(root)
    read = reads(monkeypatch)
    feed(d, ProcEvent("exec", API, API))
    assert not [p for p in read if p.startswith(f"/proc/{API}/")]
    stop(d)


# ---- a tree spread one CPU a thread (spread_threads) -----------------------------------------


@pytest.fixture
def spreading(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    """A started daemon with the dedicated-inference rules over CPUs 2-9, threads spread."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    d = Daemon(tree_kernel(root), profile_path=spread.dedicated(tmp_path))
    d.start()
    yield d, root
    if d.running:
        d.stop()


def test_a_new_threads_cpu_counts_for_the_next_process_of_the_tree(
    spreading: tuple[Daemon, Path],
) -> None:
    """The API server starts a thread after it was placed; EngineCore, spawned next, still
    gets a main CPU of its own, with no thread of the API server on it."""
    d, root = spreading
    spread.proc(root, API, 1)
    feed(d, ProcEvent("exec", API, API))
    main = spread.mains(root, (API,))[API]
    add_thread(root, API, API + 9, cpus=str(main), nice=-10)  # started by its main thread
    feed(d, ProcEvent("thread", API, API + 9, 1))
    spread.assert_spread(root, (API,))
    spread.proc(root, spread.CORE, API, inherited=str(main))
    feed(d, ProcEvent("fork", spread.CORE, spread.CORE, API))
    spread.assert_spread(root, (API, spread.CORE))
    assert spread.mains(root, (API,))[API] == main, "the API server's main thread stays"
    stop(d)


def test_threads_that_ended_leave_their_cpus_to_the_next_main_thread(
    spreading: tuple[Daemon, Path],
) -> None:
    """Once the API server's other threads have ended, EngineCore's main thread takes the
    lowest CPU that holds no thread now (the policy: fewest threads first)."""
    d, root = spreading
    spread.proc(root, API, 1)
    feed(d, ProcEvent("exec", API, API))
    main = spread.mains(root, (API,))[API]
    for tid in (API + 1, API + 2, API + 3):
        remove_thread(root, API, tid)
        feed(d, ProcEvent("exit", API, tid))
    spread.proc(root, spread.CORE, API, inherited=str(main))
    feed(d, ProcEvent("fork", spread.CORE, spread.CORE, API))
    assert spread.mains(root, (spread.CORE,))[spread.CORE] == min(spread.SET - {main})
    stop(d)


# ---- by_gpu: a process placed on the GPU it uses ---------------------------------------------


@pytest.fixture
def per_gpu(tmp_path: Path) -> tuple[Path, Path]:
    """The 8-GPU tree and a profile with a partition per GPU and a by_gpu rule."""
    prof = tmp_path / "per-gpu.toml"
    prof.write_text(PER_GPU_TOML)
    return gpu_host(tmp_path), prof


def cgroup_of(root: Path, pid: int) -> str:
    return (root / f"proc/{pid}/cgroup").read_text().removeprefix("0::").strip()


def test_a_gpu_opened_while_the_daemon_applies_places_the_tree_on_it(
    per_gpu: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker opens its GPU after the start apply planned it and before the daemon read the
    host for its own use: the daemon places its tree on that GPU at once (no later GPU scan
    would: the worker has its GPU by then)."""
    root, prof = per_gpu
    pids = server(root, range(6, 7), open_now=False)
    worker = pids["worker6"]

    def opened_meanwhile(*a: Any, **kw: Any) -> Any:
        if not (root / f"proc/{worker}/fd").exists():
            opens(root, worker, "/dev/nvidiactl", f"/dev/nvidia{MINOR[6]}")
        return read_context(*a, **kw)

    monkeypatch.setattr("gputuned.daemon.keeper.read_context", opened_meanwhile)
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    assert cgroup_of(root, worker) == "/gputuned.inference.gpu6"
    assert f"Cpus_allowed_list:\t{MEMBER[6]}" in (root / f"proc/{worker}/status").read_text()
    assert cgroup_of(root, pids["api"]) == "/gputuned.inference.gpu6"
    stop(d)


def test_a_gpu_scan_moves_only_the_tree_whose_worker_opened_a_gpu_and_says_so(
    per_gpu: tuple[Path, Path], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan that finds no new GPU says nothing and places nothing; once a worker opens its
    GPU, the scan logs it and moves that worker's tree; later scans read none of the
    descriptors of a worker that has its GPU."""
    root, prof = per_gpu
    pids = server(root, range(6, 7), open_now=False)
    worker = pids["worker6"]
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    home = cgroup_of(root, worker)
    assert worker in d.placed and home != "/gputuned.inference.gpu6"
    with caplog.at_level(logging.INFO, logger="gputuned"):
        placing.gpu_scan(d)
        assert "now uses" not in caplog.text and "daemon: placed" not in caplog.text
        opens(root, worker, "/dev/nvidiactl", f"/dev/nvidia{MINOR[6]}")
        placing.gpu_scan(d)
    said = [r.getMessage() for r in caplog.records if "now uses" in r.getMessage()]
    assert said == [f"daemon: pid {worker} now uses GPU(s) [6] (was none)"]
    assert cgroup_of(root, worker) == cgroup_of(root, pids["api"]) == "/gputuned.inference.gpu6"
    read = reads(monkeypatch)
    placing.gpu_scan(d)
    assert not [p for p in read if p.startswith(f"/proc/{worker}/fd")]
    stop(d)
