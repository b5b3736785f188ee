"""Prometheus metrics: the exposition text, the daemon's figures from a tree, the HTTP server."""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# An independent parser of the exposition format (a test dependency, not a runtime one).
# Imported here, not in the test: importing it reads /proc/stat, which unit tests may not.
from prometheus_client.parser import text_string_to_metric_families

from gputuned import errors
from gputuned.engine.verify import DRIFTED, NOT_POSSIBLE, PASSED, PENDING, Line, VerifyReport
from gputuned.service.httpmetrics import (
    CONTENT_TYPE,
    IDLE_TIMEOUT_S,
    MAX_CLIENTS,
    Allowed,
    MetricsServer,
)
from gputuned.service.loop import Loop
from gputuned.watch.exposition import Exposition, add_verify, daemon_metrics, escape_label
from tests.conftest import TREES_DIR
from tests.fakeproc import add_process
from tests.faults import tree_kernel
from tests.unit.test_top import set_counters, set_interrupts

SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (\S+)$'
)


def parse(text: str) -> dict[str, list[tuple[str, float]]]:
    """Check the exposition format (HELP and TYPE once, before the samples) and parse it."""
    assert text.endswith("\n")
    families: dict[str, list[tuple[str, float]]] = {}
    typed: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in families, f"{name} described twice"
            families[name] = []
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name in families and not families[name] and name not in typed
            typed[name] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name = m.group(1)
            assert name in typed, f"{name} has no TYPE before it"
            if typed[name] == "counter":
                assert name.endswith("_total")
            families[name].append((m.group(2) or "", float(m.group(5))))
    return families


def report() -> VerifyReport:
    lines = [Line(PASSED, "irq", "IRQ 1", "1", "1")] * 3 + [
        Line(DRIFTED, "process", "pid 1 nice", "0", "-10"),
        Line(NOT_POSSIBLE, "pcie_aspm", "policy", "-", "-", "firmware"),
        Line(PENDING, "bootargs", "nohz_full", "-", "nohz_full"),
    ]
    return VerifyReport('shared "host"', lines, at=1700000000.25)


def test_verify_families_are_exactly_the_textfile_ones() -> None:
    rep = report()
    exp = Exposition()
    add_verify(exp, rep.profile, rep.to_json()["counts"], at=rep.at)
    assert exp.text() == rep.prometheus()
    fams = parse(exp.text())
    assert ('{profile="shared \\"host\\"",status="passed"}', 3.0) in fams["gputuned_settings"]
    assert fams["gputuned_verify_exit_code"] == [('{profile="shared \\"host\\""}', 1.0)]


def test_label_escaping() -> None:
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "h200-vm"
    shutil.copytree(TREES_DIR / "h200-vm", root, symlinks=True)
    for pid, comm, cpus in ((4242, "python3", "1-4"), (4300, 'we"ird', "5")):
        add_process(
            root, pid, comm=comm, cmdline=[comm], exe="/usr/bin/x", start_time=1, threads=[pid + 1], cpus=cpus
        )  # fmt: skip
        set_counters(root, pid, pid, run=2 * 10**9, wait=3 * 10**6, vol=5, invol=7)
        set_counters(root, pid, pid + 1, run=10**9, wait=10**6, vol=1, invol=1)
    set_interrupts(root, [10 * i for i in range(16)])
    return root


def status(**over: Any) -> dict[str, Any]:
    st: dict[str, Any] = {
        "daemon": {"pid": 1, "version": "0.1.0", "repairs": 2, "replans": 0, "placements": 5, "reloads": 1},
        "active_profile": "shared-host",
        "journal_entries": 12,
        "placed": [4242, 31337],  # 31337 exited since the daemon looked
        "registered": {"4300": "server"},
        "verify": {"passed": 30, "drifted": 0, "pending reboot": 0, "not possible here": 3, "report only": 2},
    }  # fmt: skip
    st.update(over)
    return st


def test_daemon_metrics_from_a_tree(tree: Path) -> None:
    host = tree_kernel(tree)
    host.recorded_nvml = [
        {"index": 0, "bdf": "0000:00:05.0", "name": "NVIDIA H200", "utilization_gpu": 87, "pids": [4242]}
    ]  # fmt: skip
    fams = parse(daemon_metrics(host, status()))
    assert fams["gputuned_info"] == [('{version="0.1.0",profile="shared-host"}', 1.0)]
    assert ('{profile="shared-host",status="not possible here"}', 3.0) in fams["gputuned_settings"]
    assert fams["gputuned_verify_exit_code"] == [('{profile="shared-host"}', 0.0)]
    assert "gputuned_verify_timestamp_seconds" not in fams  # the daemon gave no time
    assert fams["gputuned_placements_total"] == [("", 5.0)]
    assert fams["gputuned_journal_entries"] == [("", 12.0)]
    assert fams["gputuned_watched_processes"] == [("", 3.0)]
    srv = '{pid="4242",comm="python3",why="placed"}'
    odd = '{pid="4300",comm="we\\"ird",why="registered"}'
    assert dict(fams["gputuned_process_runqueue_wait_seconds_total"]) == {srv: 0.004, odd: 0.004}
    assert dict(fams["gputuned_process_cpu_seconds_total"])[srv] == pytest.approx(1145 / 100)
    cs = dict(fams["gputuned_process_context_switches_total"])
    assert cs[srv[:-1] + ',kind="involuntary"}'] == 8 and cs[srv[:-1] + ',kind="voluntary"}'] == 6
    assert dict(fams["gputuned_process_threads"])[srv] == 2
    assert dict(fams["gputuned_process_allowed_cpus"])[srv] == 4
    assert dict(fams["gputuned_process_cpu_irqs_total"]) == {srv: 100.0, odd: 50.0}
    assert len(fams["gputuned_cpu_device_irqs_total"]) == 16
    assert fams["gputuned_gpu_utilization_ratio"] == [
        ('{gpu="0",bdf="0000:00:05.0",name="NVIDIA H200"}', 0.87)
    ]


def test_daemon_metrics_idle_and_with_a_verify_time(tree: Path) -> None:
    fams = parse(
        daemon_metrics(tree_kernel(tree), status(placed=[], registered={}, verified_at=12.5))
    )
    assert fams["gputuned_verify_timestamp_seconds"] == [('{profile="shared-host"}', 12.5)]
    assert "gputuned_process_threads" not in fams  # no samples, no family
    fams = parse(
        daemon_metrics(tree_kernel(tree), {"daemon": {"version": "0.1.0"}, "active_profile": None})
    )
    assert fams["gputuned_info"] == [('{version="0.1.0",profile=""}', 1.0)]
    assert "gputuned_settings" not in fams


def test_prometheus_client_parses_it(tree: Path) -> None:
    text = daemon_metrics(tree_kernel(tree), status())
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "gputuned_process_runqueue_wait_seconds" in names  # the parser drops _total


# ---- the HTTP server ----------------------------------------------------------------------


@pytest.fixture
def served() -> Iterator[Callable[..., MetricsServer]]:
    """Start a server on a free port, driven by the daemon's Loop in a thread."""
    made: list[tuple[MetricsServer, Loop, threading.Event, threading.Thread]] = []

    def make(render: Callable[[], str] = lambda: "up 1\n", **kw: Any) -> MetricsServer:
        server = MetricsServer(render, port=0, **kw)
        loop = Loop()
        server.attach(loop)
        stop = threading.Event()

        def run() -> None:
            while not stop.is_set():
                loop.run_once(0.01)
                server.expire(time.monotonic())

        th = threading.Thread(target=run, daemon=True)
        th.start()
        made.append((server, loop, stop, th))
        return server

    yield make
    for server, loop, stop, th in made:
        stop.set()
        th.join(5)
        server.close()
        loop.close()


def http(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_get_metrics(served: Callable[..., MetricsServer]) -> None:
    server = served(lambda: "gputuned_up 1\n")
    assert server.address == "127.0.0.1"
    resp = http(
        server.port, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n"
    )
    head, _, body = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert f"Content-Type: {CONTENT_TYPE}".encode() in head
    assert b"Content-Length: 14" in head and b"Connection: close" in head
    assert body == b"gputuned_up 1\n"
    resp = http(server.port, b"HEAD /metrics HTTP/1.0\n\n")  # bare newlines are accepted too
    assert resp.startswith(b"HTTP/1.1 200 OK") and resp.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", b"200"),
        (b"GET /other HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"hello\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", b"431"),
    ],
)
def test_other_requests(
    served: Callable[..., MetricsServer], request_: bytes, status: bytes
) -> None:
    resp = http(served().port, request_)
    assert resp.split()[1] == status


def test_failing_collection_is_a_500(served: Callable[..., MetricsServer]) -> None:
    def broken() -> str:
        raise ValueError("boom")

    assert http(served(broken).port, b"GET /metrics HTTP/1.1\r\n\r\n").split()[1] == b"500"


def test_silent_client_is_dropped_and_others_still_served() -> None:
    now = [0.0]
    server = MetricsServer(lambda: "x 1\n", port=0, clock=lambda: now[0])
    try:
        silent = socket.create_connection(("127.0.0.1", server.port))
        time.sleep(0.05)
        server.on_readable(server.fileno())
        assert len(server.client_fds()) == 1
        now[0] = IDLE_TIMEOUT_S + 1
        server.expire(now[0])
        assert server.client_fds() == []
        silent.settimeout(5)
        assert silent.recv(10) == b""  # closed on it
        silent.close()
    finally:
        server.close()


def test_too_many_clients_get_503(served: Callable[..., MetricsServer]) -> None:
    server = served()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(MAX_CLIENTS)]
    try:
        deadline = time.monotonic() + 5
        while len(server.client_fds()) < MAX_CLIENTS and time.monotonic() < deadline:
            time.sleep(0.01)
        # Answered at accept, before any request is read: send nothing, or the request may
        # meet a closed socket and the answer a reset.
        assert http(server.port, b"").split()[1] == b"503"
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 5  # the closed ones are read as EOF and dropped
    while server.client_fds() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert http(server.port, b"GET /metrics HTTP/1.1\r\n\r\n").split()[1] == b"200"


def test_port_in_use_says_what_to_do() -> None:
    with MetricsServer(lambda: "", port=0) as first:
        with pytest.raises(errors.Busy, match="metrics_port") as exc:
            MetricsServer(lambda: "", port=first.port)
        assert exc.value.errno == errno.EADDRINUSE
    assert first.fileno() == -1


# ---- who may scrape, and what a flood of scrapes costs (issue 14, finding 10) ---------------


def test_a_scrape_flood_collects_the_figures_once_per_interval(
    served: Callable[..., MetricsServer],
) -> None:
    """Each scrape collected every figure again (a /proc walk per placed process) in the
    daemon's thread: a flood of them delayed placements. Now once per min_interval_s."""
    calls: list[int] = []

    def render() -> str:
        calls.append(1)
        return "x 1\n"

    server = served(render)
    server.min_interval_s = 3600.0  # the whole flood falls in one interval, however slow
    for _ in range(20):
        assert http(server.port, b"GET /metrics HTTP/1.1\r\n\r\n").endswith(b"x 1\n")
    assert len(calls) == 1 and server.renders == 1


def test_a_local_user_not_allowed_gets_403_and_nothing_is_collected(
    served: Callable[..., MetricsServer],
) -> None:
    calls: list[int] = []
    seen: list[tuple[tuple[str, int], tuple[str, int]]] = []

    def owner(client: tuple[str, int], server: tuple[str, int]) -> int:
        seen.append((client, server))
        return 65534

    server = served(lambda: calls.append(1) or "x 1\n", allowed=Allowed(owner_of=owner))
    resp = http(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert resp.split()[1] == b"403" and b"local user 65534" in resp
    assert calls == [] and seen[0][1] == ("127.0.0.1", server.port)
    allowed = served(lambda: "x 1\n", allowed=Allowed(uids=[65534], owner_of=owner))
    assert http(allowed.port, b"GET /metrics HTTP/1.1\r\n\r\n").split()[1] == b"200"


def test_remote_clients_by_network() -> None:
    import ipaddress

    allowed = Allowed(networks=[ipaddress.ip_network("10.0.0.0/8")], owner_of=lambda c, s: None)
    assert allowed.check(("10.1.2.3", 5000), ("10.0.0.1", 9466)) is None
    assert "not in a network" in str(allowed.check(("192.168.1.2", 5000), ("10.0.0.1", 9466)))


def test_sock_diag_names_the_owner_of_a_local_connection() -> None:
    from gputuned.service.sockdiag import tcp_owner

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            conn, addr = listener.accept()
            with conn:
                assert addr == client.getsockname()
                assert tcp_owner(addr, listener.getsockname()) == os.geteuid()
        assert tcp_owner(("127.0.0.1", 1), listener.getsockname()) is None
