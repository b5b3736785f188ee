"""The daemon on this machine's kernel: a process started after READY is placed within
milliseconds through the proc connector, threads it starts later too; SIGTERM reverts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from gputuned.kernel.proc import read_process
from tests.faults import live_kernel

# Placed within milliseconds: by the proc connector's events (polling is a second behind).
pytestmark = [pytest.mark.usefixtures("as_root"), pytest.mark.needs("proc_connector")]

WORKLOAD = textwrap.dedent(
    """
    import sys, threading, time
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("one", flush=True)
    sys.stdin.readline()             # the test says when to start the late thread
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("two", flush=True)
    time.sleep(60)
    """
)


def wait_until(pred, timeout: float = 5.0) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.005)
    raise AssertionError("timed out")


def test_daemon_places_new_processes_and_threads(tmp_path: Path) -> None:
    token = f"gputuned-dm-{uuid.uuid4().hex[:8]}"
    prof = tmp_path / "p.toml"
    prof.write_text(
        textwrap.dedent(
            f"""
            name = "daemon-it"
            [cpusets.inference]
            cpus = "1"
            [daemon]
            drift_interval_s = 3600
            [[process]]
            name = "w"
            match.cmdline = "{token}"
            match.uid = 0
            cpus = "inference"
            nice = 7
            """
        )
    )
    sock = tmp_path / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock))
    listener.settimeout(20)
    d = subprocess.Popen(
        [sys.executable, "-m", "gputuned.daemon", "--profile", str(prof)],
        env={**os.environ, "NOTIFY_SOCKET": str(sock)},
        stderr=subprocess.PIPE,
        text=True,
    )
    w = None
    try:
        while "READY=1" not in listener.recv(4096).decode().split("\n"):
            pass
        w = subprocess.Popen(
            [sys.executable, "-c", WORKLOAD, token],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert w.stdout is not None and w.stdin is not None
        assert w.stdout.readline().strip() == "one"

        def placed() -> bool:
            p = read_process(live_kernel(), w.pid)  # type: ignore[union-attr]
            return all(t.nice == 7 and t.affinity == {1} for t in p.threads)

        took = wait_until(placed)
        print(f"new process placed {took * 1000:.1f} ms after its first thread was up")
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().strip() == "two"
        wait_until(lambda: len(read_process(live_kernel(), w.pid).threads) == 3 and placed())  # type: ignore[union-attr]
        d.send_signal(signal.SIGTERM)
        assert d.wait(timeout=20) == 0
        p = read_process(live_kernel(), w.pid)
        assert all(t.nice == 0 and len(t.affinity) == os.cpu_count() for t in p.threads), p.threads
    finally:
        if d.poll() is None:
            d.kill()
        if w is not None:
            w.kill()
            w.wait()
        listener.close()
        err = d.communicate()[1]
        assert "Traceback" not in err, err
