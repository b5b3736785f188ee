"""Engines that bind themselves (issue 17, item 3): the daemon backs off from a placed process
that sets its own CPUs back twice in a row, says so (status, verify, log, metrics), and the plan
warns about engines whose flags make them bind themselves.

The daemon runs on the captured H200 tree; its drift checks are driven by hand (the drift timer
made due, then ``_timers``), and "the process" sets its own CPUs through the tree's kernel, as
sched_setaffinity(2) from the process would: no gputuned write in between.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gputuned.daemon.core import Daemon
from gputuned.engine.plan import plan_profile
from gputuned.engine.verify import SELF_BOUND, VerifyReport
from gputuned.kernel.proc import read_process
from gputuned.profile.load import load_profile
from gputuned.service.control import PeerCred
from gputuned.tuners.selfbind import MAX_TOKENS, binds_itself
from gputuned.watch.exposition import daemon_metrics
from tests.faults import tree_kernel
from tests.unit.test_apply import tree_copy
from tests.unit.test_daemon import profile_file
from tests.unit.test_process_tree import ALL, API, HOME, INFERENCE, PART, api, state

ROOT_PEER = PeerCred(pid=1, uid=0, gid=0)
MINE = frozenset({2, 3})  # the CPUs "the process" binds itself to: inside the partition


@pytest.fixture(autouse=True)
def _quiet_notify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)


def started(tmp_path: Path, *, mode: str | None = None) -> tuple[Daemon, Path]:
    """A daemon with the shipped shared-host rules (``mode``: the rules' self_binding) and a
    vLLM API server it places at start."""
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root)
    prof = profile_file(tmp_path)
    if mode is not None:
        text = prof.read_text().replace(
            'policy = "other"\n', f'policy = "other"\nself_binding = "{mode}"\n'
        )
        assert text.count(f'self_binding = "{mode}"') == 2
        prof.write_text(text)
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    assert state(root, API) == (PART, {-10}, {INFERENCE})
    return d, root


def bind_itself(root: Path, cpus: frozenset[int] = MINE) -> None:
    """The server sets its own CPUs on every thread (sched_setaffinity from the process)."""
    k = tree_kernel(root)
    for t in read_process(k, API).threads:
        k.set_affinity(t.tid, cpus)


def drift_check(d: Daemon) -> None:
    d._next["drift"] = 0.0
    d._timers()


def cpus_of(root: Path) -> set[frozenset[int]]:
    return state(root, API)[2]


def test_two_resets_in_a_row_back_off_and_every_report_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d, root = started(tmp_path)
    with caplog.at_level(logging.INFO, logger="gputuned"):
        bind_itself(root)
        drift_check(d)
        assert cpus_of(root) == {INFERENCE}, "the first reset is repaired"
        assert d.requests.status()["self_binding"] == []
        bind_itself(root)
        drift_check(d)  # undone again right after gputuned's repair: it binds itself
        assert cpus_of(root) == {MINE}, "the second reset is left to the process"
        bind_itself(root, frozenset({1, 4}))
        drift_check(d)
        drift_check(d)
        assert cpus_of(root) == {frozenset({1, 4})}, "and so is every later one"
    found = [r for r in caplog.records if "set its own CPUs back twice" in r.getMessage()]
    assert len(found) == 1, "one log line per back-off, not one per drift check"
    assert 'self_binding = "respect"' in found[0].getMessage()
    status = d.requests.status()
    (sb,) = status["self_binding"]
    assert (sb["pid"], sb["rule"], sb["mode"], sb["cpus"], sb["wanted"]) == (
        API, "server", "respect", "2-3", "1-4",
    )  # fmt: skip
    assert status["daemon"]["self_binding"] == 1
    # verify: the process's CPUs are "left to the process", which fails nothing.
    rep = d.requests.handle({"cmd": "verify"}, ROOT_PEER)
    mine = [ln for ln in rep["settings"] if ln["status"] == SELF_BOUND]
    assert len(mine) == 1 and f"pid {API} CPUs" in mine[0]["target"], mine
    assert rep["counts"]["drifted"] == 0 and rep["exit_code"] == 0, rep["counts"]
    only = VerifyReport.from_json({**rep, "settings": mine}, strict=True)
    assert only.exit_code == 0, "--strict does not fail it either"
    # The daemon's own verify (status, metrics) agrees.
    assert d.last_verify[SELF_BOUND] == 1 and d.last_verify["drifted"] == 0
    text = daemon_metrics(d.kernel, d.requests.status(), nvml=False)
    assert 'gputuned_self_binding_processes{mode="respect"} 1' in text
    assert "gputuned_self_binding_total 1" in text
    assert 'gputuned_settings{profile="shared-host",status="left to the process"} 1' in text
    d.stop()


def test_nice_is_still_applied_and_stop_leaves_its_own_cpus(tmp_path: Path) -> None:
    d, root = started(tmp_path)
    for _ in range(2):
        bind_itself(root)
        drift_check(d)
    assert d.requests.status()["self_binding"], "backed off"
    k = tree_kernel(root)
    k.set_nice(API + 1, 0)  # someone renices a thread: that is still gputuned's to repair
    drift_check(d)
    assert state(root, API) == (PART, {-10}, {MINE})
    d.place([API], "new process")  # a rename or exec re-plans it: still not its CPUs
    assert cpus_of(root) == {MINE}
    assert d.requests.status()["placed"] == [API]
    assert d.stop() == 0
    # Revert: back in its cgroup at nice 0, with the CPUs it chose (its originals were dropped).
    assert state(root, API) == (HOME, {0}, {MINE})


def test_one_reset_only_is_repaired_and_the_count_starts_again(tmp_path: Path) -> None:
    d, root = started(tmp_path)
    bind_itself(root)
    drift_check(d)
    assert cpus_of(root) == {INFERENCE}
    drift_check(d)  # gputuned's CPUs held at this check
    bind_itself(root)  # a second reset, but not right after a repair: a person's taskset
    drift_check(d)
    assert cpus_of(root) == {INFERENCE}
    assert d.requests.status()["self_binding"] == []
    assert d.counters["self_binding"] == 0
    d.stop()
    assert state(root, API) == (HOME, {0}, {ALL})


def test_override_keeps_repairing_and_reports_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d, root = started(tmp_path, mode="override")
    with caplog.at_level(logging.INFO, logger="gputuned"):
        for _ in range(4):
            bind_itself(root)
            drift_check(d)
            assert cpus_of(root) == {INFERENCE}, "override: repaired every time"
    (sb,) = d.requests.status()["self_binding"]
    assert sb["mode"] == "override"
    found = [r for r in caplog.records if "set its own CPUs back twice" in r.getMessage()]
    assert len(found) == 1 and "repairing on" in found[0].getMessage()
    rep = d.requests.handle({"cmd": "verify"}, ROOT_PEER)
    assert rep["counts"][SELF_BOUND] == 0, "override: its CPUs are verified as any setting"
    text = daemon_metrics(d.kernel, d.requests.status(), nvml=False)
    assert 'gputuned_self_binding_processes{mode="override"} 1' in text
    d.stop()
    assert state(root, API) == (HOME, {0}, {ALL})


def test_a_reload_to_override_ends_the_back_off(tmp_path: Path) -> None:
    d, root = started(tmp_path)
    for _ in range(2):
        bind_itself(root)
        drift_check(d)
    assert cpus_of(root) == {MINE}
    assert d.profile_path is not None
    d.profile_path.write_text(
        d.profile_path.read_text().replace(
            'policy = "other"\n', 'policy = "other"\nself_binding = "override"\n'
        )
    )
    d._on_hup(1)
    assert d.requests.status()["self_binding"] == []
    assert cpus_of(root) == {INFERENCE}, "placed again by the rule"
    d.stop()


def test_status_renders_the_back_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gputuned.cli.render import render_status

    d, root = started(tmp_path)
    for _ in range(2):
        bind_itself(root)
        drift_check(d)
    render_status(d.requests.status())
    out = " ".join(capsys.readouterr().out.split())
    assert f"pid {API} (rule server) set its own CPUs back twice (now 2-3, gputuned's 1-4)" in out
    assert 'left to the process (self_binding = "respect")' in out
    d.stop()


# ---- which engines bind themselves ----------------------------------------------------------


@pytest.mark.parametrize(
    ("cmdline", "env", "nodes", "want"),
    [
        ("/usr/bin/python3 /usr/local/bin/vllm serve m --numa-bind", {}, 1, ("vLLM", "--numa-bind")),
        ("python3 -m vllm.entrypoints.openai.api_server --numa-bind --tp 8", {}, 2, ("vLLM", "--numa-bind")),
        ("vllm serve m --numa-bind --no-numa-bind", {}, 2, None),
        ("vllm serve m --numa-bind-nodes 0 1", {}, 2, None),  # nodes alone enable nothing
        ("vllm serve m", {}, 2, None),
        ("python3 -m sglang.launch_server --numa-node 0 0 1 1", {}, 1, ("SGLang", "--numa-node")),
        ("python3 -m sglang.launch_server --tp 8", {}, 2, ("SGLang", "automatic NUMA binding, SGLANG_AUTO_NUMA_BIND unset, 2 nodes")),
        ("sglang serve --model-path m", {"SGLANG_AUTO_NUMA_BIND": "0"}, 2, None),
        ("sglang serve --model-path m", {"SGLANG_AUTO_NUMA_BIND": "false"}, 2, None),
        ("python3 -m sglang.launch_server --tp 8", {}, 1, None),  # one node: nothing to bind to
        ("python3 -m sglang.launch_server", {"SGLANG_SET_CPU_AFFINITY": "1"}, 1, ("SGLang", "SGLANG_SET_CPU_AFFINITY=1")),
        ("trtllm-serve /m --tp_size 8", {}, 1, ("TensorRT-LLM", "TLLM_NUMA_AWARE_WORKER_AFFINITY unset: it clears CPUs set from outside")),
        ("/usr/local/bin/trtllm-serve /m", {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "1"}, 2, ("TensorRT-LLM", "TLLM_NUMA_AWARE_WORKER_AFFINITY=1")),
        ("trtllm-serve /m", {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "0"}, 2, None),
        ("python3 train.py --numa-bind --numa-node 0", {}, 2, None),  # no engine known
        ("python3 -m http.server vllm serve --numa-bind", {}, 2, None),  # engine only up front
        ("python3 -X dev /opt/venv/bin/vllm serve m --numa-bind", {}, 2, ("vLLM", "--numa-bind")),
        ("/bin/sh -c vllm serve --numa-bind", {}, 2, None),
    ],
)  # fmt: skip
def test_which_engine_flags_bind(
    cmdline: str, env: dict[str, str], nodes: int, want: tuple[str, str] | None
) -> None:
    assert binds_itself(cmdline, env, nodes) == want


def test_a_hostile_command_line_is_read_bounded() -> None:
    """Any user writes their own command line: the flags are looked for among the first
    MAX_TOKENS words only, compared as plain strings (no pattern to blow up)."""
    long = "vllm serve " + "x " * 1_000_000 + "--numa-bind"
    assert binds_itself(long, {}, 2) is None
    near = "vllm serve " + "x " * (MAX_TOKENS - 4) + "--numa-bind"
    assert binds_itself(near, {}, 2) == ("vLLM", "--numa-bind")
    found = binds_itself("sglang serve", {"SGLANG_AUTO_NUMA_BIND": "\x1b[2J" * 100}, 2)
    assert found is not None and "\x1b" not in found[1] and len(found[1]) < 120, found


@pytest.mark.parametrize(
    ("argv", "env", "engine", "fix"),
    [
        (["python3", "-m", "vllm.entrypoints.openai.api_server", "--numa-bind"], b"", "vLLM: --numa-bind", "start it without --numa-bind"),
        (["python3", "-m", "sglang.launch_server", "--numa-node", "0"], b"", "SGLang: --numa-node", "SGLANG_AUTO_NUMA_BIND=0"),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], None, None, None),
    ],
)  # fmt: skip
def test_plan_warns_for_a_matched_engine_that_binds_itself(
    tmp_path: Path, argv: list[str], env: bytes | None, engine: str | None, fix: str | None
) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root, argv=argv)
    if env is not None:
        (root / f"proc/{API}/environ").write_bytes(env)
    plan = plan_profile(tree_kernel(root), load_profile(profile_file(tmp_path)))
    notes = [n for n in plan.notes if "will bind its own CPUs" in n]
    if engine is None:
        assert notes == []
        return
    (note,) = notes
    assert note.startswith(
        f"process[server]: pid {API} (python3) will bind its own CPUs ({engine})"
    )
    assert 'self_binding = "respect"' in note and fix is not None and fix in note


def test_plan_warns_for_tensorrt_llm_by_its_environment(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root, argv=["/usr/bin/python3", "/usr/local/bin/trtllm-serve", "/models/x"])
    environ = root / f"proc/{API}/environ"
    environ.write_bytes(b"PATH=/usr/bin\0HOME=/home/inference\0")
    path = profile_file(tmp_path)  # the shipped rules name no TensorRT-LLM: add its server
    path.write_text(path.read_text().replace("|torchrun)", "|torchrun|trtllm-serve)"))
    prof = load_profile(path)
    notes = [n for n in plan_profile(tree_kernel(root), prof).notes if "bind its own" in n]
    assert len(notes) == 1 and "TLLM_NUMA_AWARE_WORKER_AFFINITY unset" in notes[0]
    assert "set TLLM_NUMA_AWARE_WORKER_AFFINITY=0 in its environment" in notes[0]
    environ.write_bytes(b"PATH=/usr/bin\0TLLM_NUMA_AWARE_WORKER_AFFINITY=0\0")
    assert not [n for n in plan_profile(tree_kernel(root), prof).notes if "bind its own" in n]


def test_status_repeats_the_plan_warning_for_a_placed_engine(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root, argv=["python3", "-m", "vllm.entrypoints.openai.api_server", "--numa-bind"])
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    (warning,) = d.requests.status()["binding_warnings"]
    assert warning.startswith(f"process[server]: pid {API} (python3) will bind its own CPUs")
    d.stop()


def test_cpus_set_back_at_the_write_itself_are_skipped_not_failed(tmp_path: Path) -> None:
    """An engine that binds its workers as it starts them may set a thread's CPUs back between
    gputuned's write and its read-back (seen in the QEMU lane: `apply` exit 3, "wrote '2-3',
    reads back '0-3'"). Back on its own CPUs at once, the thread was set back by its process:
    skipped with that reason, nothing journaled for it, the rest applied (the daemon's drift
    check finds it as it finds any reset: the QEMU lane's self-binding phase)."""
    from gputuned.engine.apply import apply_profile
    from gputuned.engine.journal import Journal
    from gputuned.kernel.tasks import where

    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root)
    k = tree_kernel(root)
    tids = [t.tid for t in read_process(k, API).threads]
    for tid in tids:
        k.inject(where(API, tid, "affinity"), "drop", 0)
    _, rep = apply_profile(k, load_profile(profile_file(tmp_path)))
    assert rep.failed == [], rep.failed
    set_back = [s for s in rep.skipped if "the process sets its own" in s["reason"]]
    assert len(set_back) == len(tids), rep.skipped
    assert all(f"pid {API}" in s["target"] and "affinity" in s["target"] for s in set_back)
    assert state(root, API) == (PART, {-10}, {ALL}), "nice and cgroup applied, CPUs its own"
    kinds = {e.op.kind for e in Journal(tree_kernel(root)).entries() if e.op.data.get("pid") == API}
    assert "nice" in kinds and "affinity" not in kinds, kinds


def test_a_write_that_reads_back_neither_value_still_fails(tmp_path: Path) -> None:
    """Only the old value read back counts as set back: a write that left some third value
    (nothing a thread's own sched_setaffinity and the kernel's narrowing explain together)
    is the write's failure, as before."""
    from gputuned.engine.apply import apply_profile

    root = tree_copy("h200-captured", tmp_path, server=False)
    api(root)
    k = tree_kernel(root)
    real = k.set_affinity

    def elsewhere(tid: int, cpus: frozenset[int]) -> None:
        real(tid, frozenset({3}) if cpus == INFERENCE else cpus)

    setattr(k, "set_affinity", elsewhere)  # noqa: B010
    _, rep = apply_profile(k, load_profile(profile_file(tmp_path)), keep_going=True)
    wrong = [f for f in rep.failed if "reads back '3'" in f["error"]]
    assert wrong and not [s for s in rep.skipped if "sets its own" in s["reason"]], rep
