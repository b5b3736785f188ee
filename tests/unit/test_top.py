"""gputunectl top against trees with fake processes: counters, rates, which processes, output."""

from __future__ import annotations

import io
import json
import select
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.cli.main import main
from gputuned.cli.top import run_top
from gputuned.kernel.sampling import read_irq_counts, sample_process
from gputuned.profile.load import load_profile
from gputuned.service.control import ControlServer, PeerCred
from gputuned.watch.top import Target, compute_rows, find_targets, take_snapshot
from tests.conftest import TREES_DIR
from tests.fakeproc import add_process, add_user
from tests.faults import tree_kernel
from tests.unit.test_apply import SERVER_UID, SERVER_USER

REPO = Path(__file__).resolve().parents[2]
SERVER = 4242


def set_counters(
    root: Path, pid: int, tid: int, *, run: int, wait: int, vol: int = 0, invol: int = 0
) -> None:
    """What the kernel would show for a thread: schedstat and the ctxt_switches lines."""
    task = root / f"proc/{pid}/task/{tid}"
    (task / "schedstat").write_text(f"{run} {wait} 100\n")
    new = {"voluntary_ctxt_switches": vol, "nonvoluntary_ctxt_switches": invol}
    lines = []
    for line in (task / "status").read_text().splitlines():
        key = line.split(":", 1)[0]
        lines.append(f"{key}:\t{new[key]}" if key in new else line)
    (task / "status").write_text("\n".join(lines) + "\n")


def set_interrupts(root: Path, per_cpu: list[int], timer: int = 1000) -> None:
    """A /proc/interrupts with one device IRQ line per CPU count list, timers and ERR."""
    n = len(per_cpu)
    head = " " * 5 + "".join(f"CPU{i:<8}" for i in range(n))
    dev = " 24: " + "".join(f"{c:>10} " for c in per_cpu) + " PCI-MSIX-0000:00:05.0 0-edge nvidia"
    loc = "LOC: " + "".join(f"{timer:>10} " for _ in per_cpu) + "  Local timer interrupts"
    (root / "proc/interrupts").write_text("\n".join([head, dev, loc, "ERR:          0", ""]))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "h200-vm"
    shutil.copytree(TREES_DIR / "h200-vm", root, symlinks=True)
    add_user(root, SERVER_USER, SERVER_UID)
    add_process(
        root,
        SERVER,
        comm="python3",
        cmdline=["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"],
        exe="/usr/bin/python3.11",
        start_time=123456,
        threads=[SERVER + 1],
        cpus="1-4",
        uid=SERVER_UID,
    )
    for tid in (SERVER, SERVER + 1):
        set_counters(root, SERVER, tid, run=10**9, wait=10**6)
    set_interrupts(root, [0] * 16)
    return root


def test_sample_reads_every_thread(tree: Path) -> None:
    set_counters(tree, SERVER, SERVER + 1, run=5, wait=7, vol=3, invol=2)
    s = sample_process(tree_kernel(tree), SERVER)
    assert (s.pid, s.start_time, s.comm, s.nice) == (SERVER, 123456, "python3", 0)
    assert [(t.tid, t.run_ns, t.wait_ns, t.voluntary, t.involuntary) for t in s.threads] == [
        (SERVER, 10**9, 10**6, 0, 0),
        (SERVER + 1, 5, 7, 3, 2),
    ]
    assert s.cpus == frozenset(range(1, 5))
    assert s.cpu_ticks == 934 + 211  # utime + stime of the fake stat line


def test_interrupt_counts_by_cpu_number(tree: Path) -> None:
    # CPU2 offline: the columns are CPU0, CPU1, CPU3; ERR's single total is not a column.
    (tree / "proc/interrupts").write_text(
        "           CPU0       CPU1       CPU3\n"
        " 24:          5          6          7  PCI-MSI 1-edge  nvme0q0\n"
        " 25:          1          0          1  PCI-MSI 2-edge  nvidia\n"
        "LOC:        100        200        300  Local timer interrupts\n"
        "ERR:          9\n"
    )
    irqs = read_irq_counts(tree_kernel(tree))
    assert irqs.device == {0: 6, 1: 6, 3: 8}
    assert irqs.other == {0: 100, 1: 200, 3: 300}
    assert irqs.on(frozenset({1, 3})) == 14


def test_rates_between_two_snapshots(tree: Path) -> None:
    host = tree_kernel(tree)
    targets = [Target(SERVER, "--pid")]
    clock = iter([100.0, 102.0])
    a = take_snapshot(host, targets, nvml=False, clock=lambda: next(clock))
    # 2 s later: 30 ms more run-queue wait over both threads, 400 preemptions, IRQs on CPU 2
    # (the server's) and CPU 9 (not its).
    set_counters(tree, SERVER, SERVER, run=2 * 10**9, wait=21 * 10**6, vol=10, invol=300)
    set_counters(tree, SERVER, SERVER + 1, run=10**9, wait=11 * 10**6, vol=0, invol=100)
    set_interrupts(tree, [0, 0, 500, 0, 0, 0, 0, 0, 0, 7000, 0, 0, 0, 0, 0, 0])
    b = take_snapshot(host, targets, nvml=False, clock=lambda: next(clock))
    (row,) = compute_rows(a, b, targets)
    assert row.runq_ms_per_s == pytest.approx(15.0)
    assert row.cpu_percent == pytest.approx(50.0)
    assert row.invol_cs_per_s == pytest.approx(200.0)
    assert row.vol_cs_per_s == pytest.approx(5.0)
    assert row.irqs_per_s == pytest.approx(250.0)
    assert (row.cpus, row.threads, row.source) == ("1-4", 2, "--pid")


def test_new_thread_counts_from_zero_and_reused_pid_has_no_rate(tree: Path) -> None:
    host = tree_kernel(tree)
    targets = [Target(SERVER, "--pid")]
    clock = iter([0.0, 1.0, 2.0])
    a = take_snapshot(host, targets, nvml=False, clock=lambda: next(clock))
    task = tree / f"proc/{SERVER}/task"
    shutil.copytree(task / str(SERVER + 1), task / str(SERVER + 2))
    set_counters(tree, SERVER, SERVER + 2, run=0, wait=4 * 10**6, invol=9)
    b = take_snapshot(host, targets, nvml=False, clock=lambda: next(clock))
    (row,) = compute_rows(a, b, targets)
    assert row.runq_ms_per_s == pytest.approx(4.0)
    assert row.invol_cs_per_s == pytest.approx(9.0)
    # The PID now belongs to another process (another start time): no rate from old counters.
    stat = tree / f"proc/{SERVER}/stat"
    stat.write_text(stat.read_text().replace(" 123456 ", " 999999 "))
    c = take_snapshot(host, targets, nvml=False, clock=lambda: next(clock))
    assert compute_rows(b, c, targets) == []


def test_exited_process_and_missing_schedstat(tree: Path) -> None:
    host = tree_kernel(tree)
    for tid in (SERVER, SERVER + 1):
        (tree / f"proc/{SERVER}/task/{tid}/schedstat").unlink()  # no CONFIG_SCHED_INFO
    targets = [Target(SERVER, "--pid"), Target(777, "--pid")]  # 777 does not exist
    clock = iter([0.0, 1.0])
    a = take_snapshot(host, targets, nvml=False, clock=lambda: next(clock))
    b = take_snapshot(host, targets, nvml=False, clock=lambda: next(clock))
    (row,) = compute_rows(a, b, targets)
    assert row.runq_ms_per_s is None and row.cpu_percent is None
    assert row.invol_cs_per_s == 0


def test_gpu_utilisation_of_the_gpus_a_process_uses(tree: Path) -> None:
    host = tree_kernel(tree)
    host.recorded_nvml = [
        {"index": 0, "bdf": "0000:00:05.0", "name": "NVIDIA H200", "utilization_gpu": 87, "pids": [SERVER]},
        {"index": 1, "bdf": "0000:00:06.0", "name": "NVIDIA H200", "utilization_gpu": 3, "pids": []},
    ]  # fmt: skip
    targets = [Target(SERVER, "placed")]
    clock = iter([0.0, 1.0])
    a = take_snapshot(host, targets, clock=lambda: next(clock))
    b = take_snapshot(host, targets, clock=lambda: next(clock))
    (row,) = compute_rows(a, b, targets)
    assert row.gpus == [{"index": 0, "utilization": 87}]


def test_targets_named_by_pid(tree: Path) -> None:
    t = find_targets(tree_kernel(tree), [SERVER])
    assert ([x.pid for x in t.procs], t.mode, t.refresh_every) == ([SERVER], "pid", 0)


def test_a_pid_that_is_not_running_is_an_error(tree: Path) -> None:
    # It used to be watched as an empty table, exit 0 (issue 19).
    with pytest.raises(errors.GputunedError, match="there is no process 17;"):
        find_targets(tree_kernel(tree), [SERVER, 17])
    with pytest.raises(errors.UsageError, match="--pid -3 is not a process ID"):
        find_targets(tree_kernel(tree), [-3])


def test_no_daemon_no_profile_asks_for_pids(tree: Path) -> None:
    with pytest.raises(errors.GputunedError, match="--pid PID"):
        find_targets(tree_kernel(tree), [])


def write_active(root: Path) -> None:
    profile = load_profile(REPO / "profiles" / "shared-host.toml")
    active = {
        "source": "shared-host.toml",
        "profile": profile.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    (root / "etc/gputuned").mkdir(parents=True, exist_ok=True)
    (root / "etc/gputuned/active.json").write_text(json.dumps(active))


def test_without_daemon_the_applied_profiles_rules_pick(tree: Path) -> None:
    write_active(tree)
    add_process(
        tree, 5000, comm="bash", cmdline=["bash"], exe="/usr/bin/bash", start_time=5, cpus="0-15"
    )
    t = find_targets(tree_kernel(tree), [])
    assert [(x.pid, x.source) for x in t.procs] == [(SERVER, "rule server")]
    assert t.mode == "rules" and "shared-host" in t.where


@pytest.fixture
def daemon_socket(tree: Path) -> Iterator[list[dict[str, Any]]]:
    """A control socket in the tree answering status as the daemon does."""
    seen: list[dict[str, Any]] = []

    def handler(req: dict[str, Any], _cred: PeerCred) -> dict[str, Any]:
        seen.append(req)
        return {
            "active_profile": "shared-host",
            "placed": [SERVER, 99],
            "registered": {"99": "server"},
        }

    server = ControlServer(tree_kernel(tree), handler)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            fds = [server.fileno(), *server.client_fds()]
            readable, writable, _ = select.select(fds, server.writing_fds(), [], 0.01)
            for fd in writable:
                server.on_writable(fd)
            for fd in readable:
                server.on_readable(fd)
            server.serve()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        yield seen
    finally:
        stop.set()
        th.join(5)
        server.close()


def test_with_daemon_its_placed_and_registered_processes(
    tree: Path, daemon_socket: list[dict[str, Any]]
) -> None:
    t = find_targets(tree_kernel(tree), [])
    assert [(x.pid, x.source) for x in t.procs] == [
        (99, "registered (rule server)"),
        (SERVER, "placed"),
    ]
    assert t.mode == "daemon" and daemon_socket[0]["cmd"] == "top"


def test_run_once_json(tree: Path) -> None:
    host = tree_kernel(tree)
    now = [50.0]

    def sleep(s: float) -> None:  # the second passes: the server waited 5 ms for a CPU
        now[0] += s
        set_counters(tree, SERVER, SERVER, run=10**9, wait=6 * 10**6, invol=40)

    out = io.StringIO()
    rc = run_top(
        host, pids=[SERVER], once=True, as_json=True, sleep=sleep, clock=lambda: now[0], out=out
    )
    doc = json.loads(out.getvalue())
    assert rc == 0 and doc["source"] == "processes named with --pid"
    (p,) = doc["processes"]
    assert p["pid"] == SERVER and p["runq_ms_per_s"] == pytest.approx(5.0)
    assert p["invol_cs_per_s"] == pytest.approx(40.0) and p["irqs_per_s"] == 0


def test_refreshes_until_interrupted_and_picks_up_new_servers(tree: Path) -> None:
    write_active(tree)
    host = tree_kernel(tree)
    now = [0.0]
    docs: list[dict[str, Any]] = []

    class Stream(io.StringIO):
        def flush(self) -> None:
            docs.extend(json.loads(x) for x in self.getvalue().splitlines()[len(docs) :])

    def sleep(s: float) -> None:
        now[0] += s
        if now[0] == 2.0:  # a second server starts
            add_process(
                tree,
                6000,
                comm="python3",
                cmdline=["python3", "-m", "sglang.launch_server"],
                exe="/usr/bin/python3",
                start_time=9,
                cpus="0-15",
                uid=SERVER_UID,
            )
        if now[0] > 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_top(
            host, pids=[], once=False, as_json=True, sleep=sleep, clock=lambda: now[0], out=Stream()
        )
    seen = [sorted(p["pid"] for p in d["processes"]) for d in docs]
    # Rule matching rescans every 5 refreshes; the newcomer has a rate from the one after.
    assert seen[:5] == [[SERVER]] * 5 and seen[5:] == [[SERVER, 6000]] * 2


def test_cli_once_table(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["top", "--root", str(tree), "--pid", str(SERVER), "--once", "--interval", "0.01"])
        == 0
    )
    out = capsys.readouterr().out
    assert "run-queue ms/s" in out and str(SERVER) in out and "python3" in out


def test_cli_bad_interval(tree: Path) -> None:
    # A bad argument is a usage error (64), not an error of the host (3): issue 19.
    for bad in ("0", "nan", "-1", "inf", "1e400", "3601"):
        assert main(["top", "--root", str(tree), "--pid", "1", "--interval", bad]) == 64


def test_compute_rows_needs_time_to_pass(tree: Path) -> None:
    host = tree_kernel(tree)
    a = take_snapshot(host, [], nvml=False, clock=lambda: 1.0)
    with pytest.raises(ValueError, match="in order"):
        compute_rows(a, a, [])


def test_live_view_until_interrupted(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
        if now[0] > 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_top(
            tree_kernel(tree),
            pids=[SERVER],
            once=False,
            as_json=False,
            sleep=sleep,
            clock=lambda: now[0],
        )
    assert "IRQs/s on its CPUs" in capsys.readouterr().out
