"""A real process that binds itself, under a live daemon on this machine's kernel (issue 17,
item 3): it calls os.sched_setaffinity() on itself whenever its CPUs are not the ones it chose.
The daemon places it (CPU 1, nice -3), repairs its first reset, finds the second right after
its repair and leaves the process's CPUs to it (``self_binding = "respect"``): the process
resets exactly twice, its nice stays gputuned's, ``status`` lists it, verify says "left to the
process", the log has one line for it, and stopping the daemon leaves the process's own CPUs
and puts its nice back. Everything started here is killed by PID at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from gputuned.engine.journal import Journal
from gputuned.kernel.proc import read_process
from gputuned.service.controlclient import request
from tests.faults import live_kernel
from tests.integration.livedaemon import running_daemon
from tests.integration.test_proctree_live import profile, setup, wait_until

pytestmark = pytest.mark.usefixtures("as_root")
__all__ = ["setup"]  # the fixture: 2 CPUs or more, no profile applied, reverted after

#: One thread (os.sched_setaffinity(0) sets the calling thread): it keeps the CPUs named on its
#: command line (the daemon may place it before Python has started), checking every 50 ms;
#: "count" on stdin prints how often it put them back.
BINDER = textwrap.dedent(
    """
    import json, os, select, sys
    mine = set(json.loads(sys.argv[1]))
    resets = 0
    print(json.dumps({"pid": os.getpid(), "cpus": sorted(mine)}), flush=True)
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], 0.05)
        if ready:
            if sys.stdin.readline().strip() != "count":
                break
            print(json.dumps({"resets": resets}), flush=True)
        if os.sched_getaffinity(0) != mine:
            os.sched_setaffinity(0, mine)
            resets += 1
    """
)


class Binder:
    def __init__(self, script: Path, cpus: frozenset[int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script), json.dumps(sorted(cpus))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        first = self._line()
        self.pid, self.cpus = int(first["pid"]), frozenset(first["cpus"])

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the process exited ({self.proc.wait()})")
        out: dict[str, Any] = json.loads(line)
        return out

    def resets(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()
        return int(self._line()["resets"])

    def kill(self) -> None:
        with suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def nice_cpus(pid: int) -> tuple[int, frozenset[int]]:
    t = read_process(live_kernel(), pid).threads[0]
    return t.nice, t.affinity


def test_a_process_that_resets_its_own_cpus_twice_is_left_to_them(
    setup: dict[str, Any],
) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the nice the process inherits from this one
    tmp, token = setup["tmp"], setup["token"]
    script = tmp / f"{token}-binder.py"  # its path names the token the rule matches
    script.write_text(BINDER)
    prof = profile(tmp, token)  # CPU 1, nice -3; drift checks every half second here
    prof.write_text(prof.read_text().replace("drift_interval_s = 3600", "drift_interval_s = 0.5"))
    with running_daemon(prof, tmp) as d:
        b = Binder(script, frozenset(os.sched_getaffinity(0)))
        try:
            assert b.cpus != frozenset({1}), "this test must run on more than CPU 1"

            def backed_off() -> bool:
                st = request(live_kernel(), {"cmd": "status"})
                return any(s["pid"] == b.pid for s in st["self_binding"])

            wait_until("the daemon backs off", backed_off, timeout=60)
            assert b.resets() == 2, "placed, reset, repaired, reset: then left alone"
            time.sleep(2.0)  # four drift checks more
            assert b.resets() == 2, "the daemon no longer fights it"
            assert nice_cpus(b.pid) == (-3, b.cpus), "nice stays gputuned's, CPUs the process's"
            st = request(live_kernel(), {"cmd": "status"})
            (sb,) = [s for s in st["self_binding"] if s["pid"] == b.pid]
            assert (sb["rule"], sb["mode"], sb["wanted"]) == ("server", "respect", "1")
            rep = request(live_kernel(), {"cmd": "verify"})
            mine = [ln for ln in rep["settings"] if ln["status"] == "left to the process"]
            assert [ln["target"] for ln in mine] == [f"pid {b.pid} CPUs (rule server)"]
            assert rep["counts"]["drifted"] == 0
            d.send_signal(signal.SIGTERM)
            assert d.wait(timeout=30) == 0
            assert nice_cpus(b.pid) == (own, b.cpus), "revert: nice back, its own CPUs kept"
            assert b.resets() == 2
        finally:
            b.kill()
    assert len(Journal(live_kernel())) == 0
