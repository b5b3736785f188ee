"""Control-socket fuzzing: a control-group member's requests against a live daemon (root only).

    sudo python3 benchmarks/control_fuzz.py [--requests 100000] [--workers 4] [--seed N]
                                            [--json FILE]

A real ``gputuned`` runs against a copy of the h200-captured tree (the shipped shared-host
profile applied, with a server process to place), with ``[daemon] control_group`` naming the
group of a real unprivileged user (``gputuned-test2``, made when missing and removed again:
tests/localuser.py). That user's worker processes, standard library only, send generated
requests: valid read-only ones (status, verify, top), changing ones it may not send (apply,
revert, register, unregister, with random fields), malformed ones (random text, invalid UTF-8,
integers past 4300 digits, nesting 1,000-60,000 deep, wrong types, unknown commands with
control characters, 60 KiB strings, lines over the 64 KiB limit), pipelined in batches of
1-64 on one connection, on connections that stall mid-line, that send and leave without
reading, or that sit idle, and several connections at once from each worker. Meanwhile this
process, as root, asks for status every 10 ms on a connection of its own and times the answer.

It prints, and writes with --json: requests sent and answered by kind, connections refused at
accept (the per-user limit), root's status latency (p50, p99, max, failures), whether the daemon
is alive, whether the tree and journal are byte-identical to the state the start applied, and
the daemon's memory before and after. Goal (issue 14): at least 100,000 requests, the daemon
never dies, nothing it applied changes, root's status answered within 100 ms throughout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputuned.kernel import Kernel  # noqa: E402
from gputuned.root import open_kernel  # noqa: E402
from gputuned.service.control import daemon_running, request  # noqa: E402
from tests.localuser import LocalUser, local_user  # noqa: E402
from tests.unit.test_apply import digest, tree_copy  # noqa: E402

USER = "gputuned-test2"
GOAL_MS = 100.0

# Runs as the member, standard library only: argv = socket, seed, requests, worker number.
WORKER = r"""
import json, random, socket, sys, time
path, seed, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
st = {"sent": 0, "answered": 0, "ok": 0, "kinds": {}, "errors": {}, "conns": 0,
      "refused_at_accept": 0, "hung_up": 0, "slow": 0, "left_unread": 0, "idle": 0}
KINDS = ["status", "verify", "top", "changing", "garbage", "utf8", "bigint", "deep", "types",
         "unknown", "bigstring", "toolarge"]
WEIGHTS = [20, 4, 10, 14, 10, 6, 6, 4, 8, 8, 4, 1]

def val():
    return rng.choice([None, True, 0, -1, 2**70, 1.5, "x", "\u202e\x1b[2J", [], {}, [1, [2]],
                       {"a": {"b": None}}])

def request():
    k = rng.choices(KINDS, WEIGHTS)[0]
    if k in ("status", "verify", "top"):
        d = {"v": 1, "cmd": k}
        if k == "verify" and rng.random() < 0.5:
            d["strict"] = rng.random() < 0.5
        return k, json.dumps(d).encode()
    if k == "changing":
        cmd = rng.choice(["apply", "revert", "register", "unregister"])
        d = {"v": 1, "cmd": cmd}
        for key in rng.sample(["pid", "rule", "profile", "name", "source"], rng.randint(0, 3)):
            d[key] = rng.choice([val(), rng.randint(1, 4242), "shared-host", "/etc/shadow",
                                 {"name": "x", "irq": {"spread": 1}}])
        return k, json.dumps(d).encode()
    if k == "garbage":
        n = rng.randint(1, 2000)
        return k, bytes(rng.choice(b'{}[]":,0123456789abcdefv ') for _ in range(n))
    if k == "utf8":
        return k, b'{"v": 1, "cmd": "' + bytes(rng.randint(0x80, 0xFF) for _ in range(20)) + b'"}'
    if k == "bigint":
        return k, b'{"v": 1, "cmd": "status", "n": ' + b"7" * rng.randint(4301, 60000) + b"}"
    if k == "deep":
        return k, b"[" * rng.randint(1000, 60000)
    if k == "types":
        return k, json.dumps({"v": val(), "cmd": val(), **{str(i): val() for i in range(3)}}).encode()
    if k == "unknown":
        cmd = "".join(chr(rng.randint(1, 0x2FF)) for _ in range(rng.randint(1, 60)))
        return k, json.dumps({"v": 1, "cmd": cmd}).encode()
    if k == "bigstring":
        return k, json.dumps({"v": 1, "cmd": "status", "pad": "x" * 60000}).encode()
    return k, b"x" * 70000  # over the line limit: an error, and the connection is closed

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(path)
    st["conns"] += 1
    return s

def read_answers(s, want):
    buf, got = b"", 0
    while got < want:
        try:
            chunk = s.recv(1 << 20)
        except (ConnectionResetError, TimeoutError):
            chunk = b""
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            got += 1
            resp = json.loads(line)
            if resp.get("ok"):
                st["ok"] += 1
            else:
                e = str(resp.get("error", "")).split("'")[0].split("(")[0][:48]
                st["errors"][e] = st["errors"].get(e, 0) + 1
                if e.startswith("too many clients"):
                    st["refused_at_accept"] += 1
    return got

extra, failures = [], 0
while st["sent"] < total:
    mode = rng.choices(["batch", "slow", "leave", "idle", "hold"], [90, 2, 4, 2, 2])[0]
    try:
        if mode == "hold" and len(extra) < 3:
            extra.append(connect())
            continue
        if mode == "idle":
            s = connect(); time.sleep(rng.uniform(0.1, 1.0)); s.close(); st["idle"] += 1
            continue
        s = connect()
        n = rng.randint(1, 64)
        lines, kinds = [], []
        for _ in range(n):
            k, line = request()
            kinds.append(k)
            lines.append(line)
            if k == "toolarge":
                break
        data = b"".join(l + b"\n" for l in lines)
        if mode == "slow":
            cut = rng.randint(1, len(data) - 1) if len(data) > 1 else 1
            s.sendall(data[:cut]); time.sleep(rng.uniform(0.2, 1.5)); s.sendall(data[cut:])
            st["slow"] += 1
        else:
            s.sendall(data)
        for k in kinds:
            st["kinds"][k] = st["kinds"].get(k, 0) + 1
        st["sent"] += len(lines)
        if mode == "leave":
            s.close(); st["left_unread"] += len(lines)
            continue
        got = read_answers(s, len(lines))
        st["answered"] += got
        if got < len(lines):
            st["hung_up"] += 1
        s.close()
        failures = 0
    except (BrokenPipeError, ConnectionResetError, TimeoutError) as exc:
        # Hung up on: a refusal (too many connections of this user) or a line over the limit.
        st["errors"][type(exc).__name__] = st["errors"].get(type(exc).__name__, 0) + 1
        time.sleep(0.005)
    except (ConnectionRefusedError, FileNotFoundError) as exc:
        st["errors"][type(exc).__name__] = st["errors"].get(type(exc).__name__, 0) + 1
        failures += 1
        if failures >= 200:  # nothing listens any more: the daemon is gone
            st["gave_up"] = True
            break
        time.sleep(0.005)
for s in extra:
    s.close()
print(json.dumps(st))
"""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Prober(threading.Thread):
    """Root's status every 10 ms on a fresh connection, timed end to end."""

    def __init__(self, host: Kernel) -> None:
        super().__init__(daemon=True)
        self.host = host
        self.ms: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            try:
                ok = request(self.host, {"cmd": "status"}, timeout=10)["ok"]
            except Exception as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}"[:200])
            else:
                self.ms.append((time.perf_counter() - t0) * 1000)
                if ok is not True:
                    self.failures.append("status not ok")
            self.stop.wait(0.01)


def fuzz(user: LocalUser, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    root = tree_copy("h200-captured", work)
    before = digest(root)
    prof = work / "prof.toml"
    prof.write_text(
        (REPO / "profiles/shared-host.toml").read_text() + f'\n[daemon]\ncontrol_group = "{USER}"\n'
    )
    log = work / "daemon.log"
    env = {k: v for k, v in os.environ.items() if k != "GPUTUNED_FAILPOINT"}
    with log.open("w") as err:
        d = subprocess.Popen(
            ["nice", "-n", "-10", sys.executable, "-m", "gputuned.daemon", "--root", str(root),
             "--profile", str(prof)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    host = open_kernel(root)
    try:
        deadline = time.monotonic() + 60
        while not daemon_running(host):
            if d.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"daemon did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        request(host, {"cmd": "status"}, timeout=60)
        tuned, journal = digest(root), (root / "run/gputuned/journal.jsonl").read_bytes()
        rss0 = rss_kib(d.pid)
        sock = str(root / "run/gputuned/control.sock")
        prober = Prober(host)
        prober.start()
        t0 = time.monotonic()
        per = -(-args.requests // args.workers)
        workers = [
            subprocess.Popen(
                user.argv(user.python, "-c", WORKER, sock, str(args.seed + i), str(per)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
            )
            for i in range(args.workers)
        ]
        results = []
        for w in workers:
            out, errout = w.communicate(timeout=3600)
            if w.returncode != 0:
                raise SystemExit(f"a worker failed: {errout[-2000:]}")
            results.append(json.loads(out))
        seconds = time.monotonic() - t0
        time.sleep(0.5)
        prober.stop.set()
        prober.join()
        alive = d.poll() is None
        rss1 = rss_kib(d.pid) if alive else 0
        still = (
            digest(root) == tuned and (root / "run/gputuned/journal.jsonl").read_bytes() == journal
        )
        if alive:
            d.send_signal(signal.SIGTERM)
            exit_code = d.wait(timeout=60)
        else:
            exit_code = d.returncode
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()
    text = log.read_text()
    return summarise(results, prober, seconds, {
        "daemon_alive": alive, "applied_unchanged": still, "daemon_exit": exit_code,
        "reverted_to_before": digest(root) == before, "rss_kib": [rss0, rss1],
        "tracebacks_in_log": text.count("Traceback"), "log_lines": text.count("\n"),
    })  # fmt: skip


def summarise(
    results: list[dict[str, Any]], prober: Prober, seconds: float, daemon: dict[str, Any]
) -> dict[str, Any]:
    total: dict[str, Any] = {"kinds": {}, "errors": {}}
    for r in results:
        for k, v in r.items():
            if isinstance(v, dict):
                for kk, vv in v.items():
                    total[k][kk] = total[k].get(kk, 0) + vv
            else:
                total[k] = total.get(k, 0) + v
    ms = sorted(prober.ms) or [0.0]
    p = {
        "n": len(prober.ms),
        "p50": round(statistics.median(ms), 2),
        "p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        "max": round(ms[-1], 2),
        "over_goal": sum(1 for x in ms if x > GOAL_MS),
        "failures": prober.failures[:10],
    }
    ok = (
        total.get("sent", 0) >= 100000 and daemon["daemon_alive"] and daemon["applied_unchanged"]
        and p["max"] <= GOAL_MS and not prober.failures and daemon["daemon_exit"] == 0
    )  # fmt: skip
    return {"seconds": round(seconds, 1), "requests": total, "root_status_ms": p,
            "daemon": daemon, "goal_met": ok}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 30)
    work = Path(tempfile.mkdtemp(prefix="gputuned-ctlfuzz-"))
    work.chmod(0o755)  # the member must reach the socket in the tree
    try:
        with local_user(USER) as user:
            doc = {"seed": args.seed, "workers": args.workers, **fuzz(user, args, work)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    r, p, d = doc["requests"], doc["root_status_ms"], doc["daemon"]
    print(
        f"control_fuzz seed {args.seed}: {r.get('sent', 0)} requests from a control-group member "
        f"({args.workers} workers, {r.get('conns', 0)} connections) in {doc['seconds']} s"
    )
    print(
        f"  answered {r.get('answered', 0)} ({r.get('ok', 0)} ok), {r.get('left_unread', 0)} "
        f"left unread, {r.get('refused_at_accept', 0)} refused at accept, "
        f"{r.get('hung_up', 0)} batches hung up on (a line over 64 KiB)"
    )
    print(f"  by kind: {dict(sorted(r['kinds'].items()))}")
    print(
        f"  root's status: {p['n']} asked, p50 {p['p50']} ms, p99 {p['p99']} ms, max {p['max']} "
        f"ms, {p['over_goal']} over {GOAL_MS:g} ms, {len(p['failures'])} failed"
    )
    print(
        f"  daemon alive: {d['daemon_alive']}; applied state unchanged: {d['applied_unchanged']}"
        f"; exit {d['daemon_exit']}; host as before after stop: {d['reverted_to_before']}; "
        f"RSS {d['rss_kib'][0]} -> {d['rss_kib'][1]} KiB; tracebacks in its log: "
        f"{d['tracebacks_in_log']}"
    )
    print(
        f"  goal (>= 100,000 requests, never dies, nothing changes, status <= {GOAL_MS:g} ms): "
        + ("met" if doc["goal_met"] else "NOT met")
    )
    return 0 if doc["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
