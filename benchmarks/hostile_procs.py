"""Hostile processes against a live daemon: long command lines and thread storms (issue 14, 5-6).

    sudo flock /tmp/gputuned-live.lock python3 benchmarks/hostile_procs.py \
        [--scenario cmdline-long,cmdline-backtrack,threads,threads-paced] [--seconds 20] \
        [--threads 4000] [--thread-rate 300] [--json FILE]

Run as root on a host where no profile is applied and no daemon runs; everything is put back.
``gputuned --profile`` runs on this machine with the shipped ``[[process]]`` rules as
profiles/shared-host.toml has them (their text, their ``match.cmdline``), matching root's
processes instead of the ``inference`` account's, and the highest CPU as the server's set
(tests/integration/test_shipped_rules_live.py builds the same profile). Scenarios:

- ``cmdline-long``: the unprivileged user ``gputuned-test2`` (made when missing and removed
  again, tests/localuser.py) runs Python with a 1 MiB command line (``-X`` options with long
  values, as Python accepts them) and renames itself every 10 ms (each rename is an event the
  daemon answers by matching the rules again).
- ``cmdline-backtrack``: the same, its 1 MiB command line starting with 40 ``-X -X`` options.
- ``threads``: a process the rules match (root's ``python3 DIR/vllm-threads.py``) makes
  ``--threads`` threads as fast as it can and holds them, lets them end, then makes as many
  again in waves of 100 that live 0.2 s each (threads that come and go). ``threads-paced``:
  the same, the first threads made at ``--thread-rate`` a second, so that the daemon hears of
  them one at a time.

In each, a server (root's ``python3 DIR/vllm-server.py``) is started ``--server-after``
seconds into the load, and the time from its start to all its threads placed (nice -10, the
rule's CPU) is measured; root asks the daemon for status every 100 ms throughout (10 s
timeout). Printed and written with --json: root's status latency (p50, p99, max, unanswered),
the server's placement delay, the daemon's CPU seconds (utime + stime) over the load, and for
``threads`` how long the daemon was busy with them (until its CPU time stops growing) and the
journal's lines with every thread alive,
after the threads ended, after the churn and after the process exited. A daemon that no longer
answers is killed and the host reverted from its journal; the host is compared with before.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness.children import Children
from harness.daemon import Gputuned
from harness.figures import percentile
from harness.host import fingerprint, fingerprint_diff

from gputuned import errors
from gputuned.kernel.live import LiveKernel
from gputuned.kernel.proc import read_process
from gputuned.kernel.sampling import clock_ticks, sample_process
from gputuned.service.control import request
from gputuned.store.state import JOURNAL
from tests.integration.test_shipped_rules_live import shipped_rules_profile
from tests.localuser import LocalUser, NoUser, local_user

USER = "gputuned-test2"
HOST = LiveKernel()

#: Run as the user: argv = shape, seconds. Builds a 1 MiB command line and execs Python with it;
#: that Python renames itself every 10 ms (prctl PR_SET_NAME: a comm event each) until the end.
ATTACK = r"""
import os, sys
shape, secs = sys.argv[1], sys.argv[2]
body = (
    "import ctypes, sys, time\n"
    "libc = ctypes.CDLL(None)\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "print('ready', flush=True)\n"
    "i = 0\n"
    "while time.monotonic() < end:\n"
    "    libc.prctl(15, b'py%d' % (i % 2), 0, 0, 0)\n"
    "    i += 1\n"
    "    time.sleep(0.01)\n"
)
opts = ["-X", "-X"] * 20 if shape == "backtrack" else []
while sum(len(a) + 1 for a in opts) < (1 << 20):
    opts += ["-X", "a" * 100]
os.execv(sys.executable, ["python3", *opts, "-c", body, secs])
"""

#: The server: placed when every thread holds what the rule sets.
SERVER = """\
import threading, time
for _ in range(2):
    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
time.sleep(120)
"""

#: A process the rules match that makes argv[1] threads on "go", holds them until "end", then
#: makes as many again in waves of 100 that live 0.2 s each ("churn"); each step acknowledged
#: on stdout.
THREADER = r"""
import sys, threading, time
n, pause = int(sys.argv[1]), float(sys.argv[2])
threading.stack_size(64 * 1024)
print("ready", flush=True)
stop = threading.Event()
for word in sys.stdin:
    word = word.strip()
    if word == "go":
        t0 = time.monotonic()
        for _ in range(n):
            threading.Thread(target=stop.wait, daemon=True).start()
            if pause:
                time.sleep(pause)
        print("made", time.monotonic() - t0, flush=True)
    elif word == "end":
        stop.set()
        while threading.active_count() > 1:
            time.sleep(0.01)
        print("ended", flush=True)
    elif word == "churn":
        t0 = time.monotonic()
        for _ in range(n // 100):
            wave = threading.Event()
            batch = [threading.Thread(target=wave.wait) for _ in range(100)]
            for t in batch:
                t.start()
            time.sleep(0.2)
            wave.set()
            for t in batch:
                t.join()
        print("churned", time.monotonic() - t0, flush=True)
"""

#: What the rules set (shipped_rules_profile: nice -10, the CPU set "1").
NICE, PROFILE_CPU = -10, 1


def cpu_s(pid: int) -> float:
    s = sample_process(HOST, pid)
    return s.cpu_ticks / clock_ticks()


def journal_lines() -> int:
    try:
        return HOST.path(JOURNAL).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def placed(pid: int) -> bool:
    p = read_process(HOST, pid)
    return bool(p.threads) and all(
        t.nice == NICE and t.affinity == frozenset({PROFILE_CPU}) for t in p.threads
    )


class StatusPinger(threading.Thread):
    """Root asks for status every ``interval`` s; keeps each latency (None: no answer)."""

    def __init__(self, interval: float = 0.1, timeout: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.interval, self.timeout = interval, timeout
        self.ms: list[float | None] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            t0 = time.monotonic()
            try:
                request(HOST, {"cmd": "status"}, timeout=self.timeout)
            except errors.GputunedError:
                self.ms.append(None)
            else:
                self.ms.append((time.monotonic() - t0) * 1e3)
            self.halt.wait(self.interval)

    def figures(self) -> dict[str, Any]:
        got = [m for m in self.ms if m is not None]
        return {
            "asked": len(self.ms),
            "unanswered_in_10s": len(self.ms) - len(got),
            "p50_ms": round(percentile(got, 50), 2) if got else None,
            "p99_ms": round(percentile(got, 99), 2) if got else None,
            "max_ms": round(max(got), 2) if got else None,
        }


def start_server(children: Children, work: Path, timeout: float) -> dict[str, Any]:
    """Start the server and wait until it is placed (or ``timeout``); it keeps running."""
    script = work / "vllm-server.py"
    script.write_text(SERVER)
    t0 = time.monotonic()
    proc = children.start([sys.executable, str(script)], stdin=subprocess.DEVNULL)
    while time.monotonic() - t0 < timeout:
        try:
            if placed(proc.pid):
                return {"pid": proc.pid, "placed_after_ms": round((time.monotonic() - t0) * 1e3, 1)}
        except errors.GputunedError:
            pass
        time.sleep(0.002)
    return {"pid": proc.pid, "placed_after_ms": None, "not_placed_within_s": timeout}


def stop_daemon(daemon: Gputuned, answered: bool) -> dict[str, Any]:
    """SIGTERM; a daemon that stopped answering is killed first (its journal is reverted)."""
    assert daemon.proc is not None
    if not answered and daemon.proc.poll() is None:
        os.kill(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait()
    return daemon.stop()


def finish(out: dict[str, Any], pinger: StatusPinger, dpid: int) -> None:
    pinger.halt.set()
    pinger.join()
    out["root_status"] = pinger.figures()
    out["daemon_answers_at_end"] = alive(dpid)


def alive(pid: int) -> bool:
    try:
        request(HOST, {"cmd": "status"}, timeout=10)
    except errors.GputunedError:
        return False
    return Path(f"/proc/{pid}").exists()


def cmdline_attack(
    args: argparse.Namespace, shape: str, user: LocalUser, work: Path, log: Any
) -> dict[str, Any]:
    children = Children()
    daemon = Gputuned(children, log)
    out: dict[str, Any] = {"scenario": f"cmdline-{shape}"}
    try:
        daemon.start(shipped_rules_profile(work / "rules.toml", user="root"))
        assert daemon.proc is not None
        dpid = daemon.proc.pid
        pinger = StatusPinger()
        pinger.start()
        time.sleep(1.0)
        cpu0 = cpu_s(dpid)
        attacker = children.start(
            user.argv(user.python, "-c", ATTACK, shape, str(args.seconds)),
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert attacker.stdout is not None
        assert attacker.stdout.readline().strip() == b"ready"
        out["attacker_cmdline_bytes"] = len(Path(f"/proc/{attacker.pid}/cmdline").read_bytes())
        t_load = time.monotonic()
        time.sleep(args.server_after)
        out["server"] = start_server(children, work, args.seconds)
        time.sleep(max(0.0, args.seconds - (time.monotonic() - t_load)))
        out["load_seconds"] = round(time.monotonic() - t_load, 1)
        out["daemon_cpu_s"] = round(cpu_s(dpid) - cpu0, 2)
        finish(out, pinger, dpid)
    finally:
        if daemon.proc is not None:
            out["stop"] = stop_daemon(daemon, out.get("daemon_answers_at_end", False))
        children.stop_all()
    return out


class Maker:
    """The thread maker (THREADER): one word in, its acknowledgement out."""

    def __init__(self, children: Children, work: Path, threads: int, rate: float) -> None:
        script = work / "vllm-threads.py"
        script.write_text(THREADER)
        pause = 1.0 / rate if rate else 0.0
        self.proc = children.start(
            [sys.executable, str(script), str(threads), str(pause)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 30
        while not placed(self.proc.pid):
            assert time.monotonic() < deadline, "the thread maker was not placed"
            time.sleep(0.05)

    def say(self, word: str) -> list[bytes]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(word.encode() + b"\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().split()


def thread_storm(args: argparse.Namespace, rate: float, work: Path, log: Any) -> dict[str, Any]:
    children = Children()
    daemon = Gputuned(children, log)
    name = "threads-paced" if rate else "threads"
    out: dict[str, Any] = {"scenario": name, "threads": args.threads, "per_second": rate or None}
    try:
        daemon.start(shipped_rules_profile(work / "rules.toml", user="root"))
        assert daemon.proc is not None
        dpid = daemon.proc.pid
        maker = Maker(children, work, args.threads, rate)
        out["journal_lines_before"] = journal_lines()
        pinger = StatusPinger()
        pinger.start()
        cpu0 = cpu_s(dpid)
        timer = threading.Timer(args.server_after, lambda: out.update(
            server=start_server(children, work, 60.0)))  # fmt: skip
        timer.start()
        out["made_s"] = round(float(maker.say("go")[1]), 2)
        out["daemon_busy_s"] = wait_idle(dpid, cpu0, out)
        timer.join()
        out["journal_lines_all_threads"] = journal_lines()
        maker.say("end")
        time.sleep(2.0)
        out["journal_lines_after_end"] = journal_lines()
        cpu1 = cpu_s(dpid)
        out["churn_s"] = round(float(maker.say("churn")[1]), 2)
        time.sleep(2.0)
        out["daemon_cpu_churn_s"] = round(cpu_s(dpid) - cpu1, 2)
        out["journal_lines_after_churn"] = journal_lines()
        children.stop(maker.proc, sig=signal.SIGKILL)
        time.sleep(2.0)
        out["journal_lines_after_exit"] = journal_lines()
        finish(out, pinger, dpid)
    finally:
        if daemon.proc is not None:
            out["stop"] = stop_daemon(daemon, out.get("daemon_answers_at_end", False))
        children.stop_all()
    return out


def wait_idle(dpid: int, cpu0: float, out: dict[str, Any]) -> float | None:
    """Seconds from "go" until the daemon is done with the threads: its CPU time grew by less
    than 20 ms over one second (None: not within 300 s). Its CPU seconds until then go to
    ``out``. (The threads themselves show the placement at once: they inherit it at clone.)"""
    t0 = time.monotonic()
    last = cpu_s(dpid)
    while time.monotonic() - t0 < 300:
        time.sleep(1.0)
        now = cpu_s(dpid)
        if now - last < 0.02:
            out["daemon_cpu_s"] = round(now - cpu0, 2)
            return round(time.monotonic() - t0 - 1.0, 1)
        last = now
    return None


def report(r: dict[str, Any]) -> None:
    st, sv = r.get("root_status", {}), r.get("server", {})
    placed_ms = sv.get("placed_after_ms")
    head = f"{r['scenario']}:"
    if "attacker_cmdline_bytes" in r:
        head += (
            f" the user's command line {r['attacker_cmdline_bytes']} bytes, renamed every 10 ms;"
        )
    else:
        head += (
            f" {r['threads']} threads made in {r.get('made_s')} s, the daemon busy with them "
            f"for {r.get('daemon_busy_s')} s;"
        )
    print(head)
    print(
        f"  daemon CPU {r.get('daemon_cpu_s')} s over the load; server placed after "
        + (
            f"{placed_ms} ms"
            if placed_ms is not None
            else f"NOT within {sv.get('not_placed_within_s')} s"
        )
    )
    print(
        f"  root's status: {st.get('asked')} asked, p50 {st.get('p50_ms')} ms, p99 "
        f"{st.get('p99_ms')} ms, max {st.get('max_ms')} ms, unanswered in 10 s: "
        f"{st.get('unanswered_in_10s')}; daemon answers at the end: {r.get('daemon_answers_at_end')}"
    )
    if "journal_lines_all_threads" in r:
        print(
            f"  journal lines: {r['journal_lines_before']} before, "
            f"{r['journal_lines_all_threads']} with every thread, {r['journal_lines_after_end']} "
            f"after they ended, {r['journal_lines_after_churn']} after {r['threads']} more came "
            f"and went (daemon CPU {r['daemon_cpu_churn_s']} s), "
            f"{r['journal_lines_after_exit']} after the process exited"
        )
    stop = r.get("stop", {})
    print(
        f"  stop: exit {stop.get('exit_status')}, journal entries left {stop.get('journal_entries_left')}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="cmdline-long,cmdline-backtrack,threads,threads-paced")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of a command-line load")
    ap.add_argument("--server-after", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=4000)
    ap.add_argument(
        "--thread-rate", type=float, default=300.0, help="threads a second in threads-paced"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: it starts gputuned on this machine and plays a local user")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="hostile-procs-"))
    work.chmod(0o755)
    before = fingerprint(os.getpid())
    results: list[dict[str, Any]] = []
    with (work / "daemon.log").open("wb") as log:
        for name in args.scenario.split(","):
            if name.startswith("threads"):
                rate = args.thread_rate if name == "threads-paced" else 0.0
                results.append(thread_storm(args, rate, work, log))
            else:
                try:
                    with local_user(USER) as user:
                        results.append(cmdline_attack(args, name.split("-", 1)[1], user, work, log))
                except NoUser as exc:
                    sys.exit(f"{name}: {exc}")
            report(results[-1])
    diff = fingerprint_diff(before, fingerprint(os.getpid()))
    print(f"host as before: {diff or 'yes'}; daemon log: {work / 'daemon.log'}")
    if args.json:
        doc = {"benchmark": "hostile_procs", "results": results, "host_differences": diff}
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if not diff else 1


if __name__ == "__main__":
    sys.exit(main())
