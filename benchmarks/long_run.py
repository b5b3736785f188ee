"""Long run: the daemon on this machine's real kernel under process churn and forced drift.

    python3 benchmarks/long_run.py [--minutes 30] [--json FILE] [--shared-state]

Run as root on a machine you may tune (it moves IRQs and renices its own child processes):

- captures the host (``gputunectl capture --stable``), starts one long-lived matching process,
  then the daemon with a small profile: IRQs and the default affinity to CPU 0, matching
  processes to the last CPU with nice 5, drift repaired every 10 s;
- every second starts a matching process (two threads, lives 1-3 s; every other one is killed
  with SIGTERM, the rest exit by themselves);
- every ``--drift-every`` seconds (10) forces drift as another writer would: one IRQ the
  daemon moved is written back to every CPU, and the long-lived process is reniced to 0;
- every 10 s samples the daemon's RSS (VmRSS) and, from ``gputunectl status --json``, its
  ``repairs`` and ``placements`` counters;
- at the end stops the daemon with SIGTERM (it reverts), captures again and compares: the two
  captures and the long-lived process's nice and affinity must be what they were before.

By default the daemon's own state (/run/gputuned, /etc/gputuned) is private to it: it runs in
a mount namespace where both are bind mounts of a directory under /tmp, so that gputunectl and
live tests of other users of this host neither talk to this daemon through its socket nor wait
30 minutes on its lock. Kernel state (/proc, /sys) is the host's. ``--shared-state`` uses the
host's own directories instead. Whatever happens, the script kills what it started and, if the
daemon did not revert, runs ``gputunectl revert`` against its journal.

Prints one line per sample and a summary; exit status 0 only if memory stayed flat (last
sample within 10 MiB of the first after warm-up), every forced drift was seen repaired (the
daemon's ``repairs`` counter at least the number forced) and the final captures match.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHURN = (
    "import sys, threading, time\n"
    "threading.Thread(target=time.sleep, args=(float(sys.argv[1]),), daemon=True).start()\n"
    "time.sleep(float(sys.argv[1]))\n"
)
LONG_LIVED = "import time\nwhile True:\n    time.sleep(60)\n"


def profile_text(token: str, work_cpu: int, drift_s: float) -> str:
    return f"""name = "long-run"
[cpusets.housekeeping]
cpus = "0"
[cpusets.work]
cpus = "{work_cpu}"
[irq]
others_cpus = "housekeeping"
default_affinity = "housekeeping"
[[process]]
name = "churn"
match.cmdline = "{token}"
match.uid = 0
cpus = "work"
nice = 5
[daemon]
drift_interval_s = {drift_s}
"""


def cli(*args: str, ns_pid: int | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gputuned.cli", *args]
    if ns_pid is not None:
        cmd = ["nsenter", f"--target={ns_pid}", "--mount", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd=REPO)


def tree_digest(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + str(p.readlink())
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def thread_state(pid: int) -> tuple[int, list[int]]:
    return os.getpriority(os.PRIO_PROCESS, pid), sorted(os.sched_getaffinity(pid))


def movable_irqs() -> list[int]:
    """IRQs whose affinity file exists; which of them the kernel lets move is found by trying."""
    return sorted(int(p.name) for p in Path("/proc/irq").iterdir() if p.name.isdigit())


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.token = f"gputuned-longrun-{uuid.uuid4().hex[:8]}"
        self.work = Path(tempfile.mkdtemp(prefix="gputuned-longrun-"))
        self.state = self.work / "state"
        self.children: list[tuple[subprocess.Popen[bytes], float, bool]] = []
        self.pending: list[tuple[tuple[str, int], float]] = []  # forced drifts not yet repaired
        self.latencies: list[float] = []  # seconds from a forced drift to its repair
        self.daemon: subprocess.Popen[bytes] | None = None
        self.long_lived: subprocess.Popen[bytes] | None = None
        self.figures: dict[str, object] = {"token": self.token}
        self.samples: list[dict[str, object]] = []
        self.forced_irq = 0
        self.forced_nice = 0
        self.started = 0
        self.killed = 0
        self.rng = random.Random(args.seed)  # lifetimes of the churn processes (not security)  # noqa: S311

    # -- daemon ------------------------------------------------------------------------

    def start_daemon(self, profile: Path, log: Path) -> None:
        argv = [sys.executable, "-m", "gputuned.daemon", "--profile", str(profile)]
        if not self.args.shared_state:
            for d in ("run", "etc"):
                (self.state / d).mkdir(parents=True, mode=0o700)
            mounts = (
                f"mount --bind {self.state / 'run'} /run/gputuned && "
                f"mount --bind {self.state / 'etc'} /etc/gputuned && "
            )
            script = "mkdir -p /run/gputuned /etc/gputuned && " + mounts + 'exec "$@"'
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
            argv += [sys.executable, "-m", "gputuned.daemon", "--profile", str(profile)]
        with log.open("wb") as f:
            self.daemon = subprocess.Popen(argv, stderr=f, cwd=REPO)

    def ns(self) -> int | None:
        assert self.daemon is not None
        return None if self.args.shared_state else self.daemon.pid

    def status(self) -> dict[str, object]:
        done = cli("status", "--json", ns_pid=self.ns())
        if done.returncode != 0:
            raise RuntimeError(f"gputunectl status failed: {done.stderr}")
        data = json.loads(done.stdout)
        assert isinstance(data, dict)
        return data

    def wait_ready(self, timeout: float = 60) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.daemon is not None
            if self.daemon.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.daemon.returncode} at start")
            with contextlib.suppress(RuntimeError, json.JSONDecodeError):
                st = self.status()
                daemon = st.get("daemon")
                if isinstance(daemon, dict) and str(daemon.get("status", "")).startswith(
                    ("applied", "degraded")
                ):
                    return st
            time.sleep(0.2)
        raise RuntimeError("daemon not ready within 60 s")

    # -- processes ---------------------------------------------------------------------

    def spawn(self, seconds: float) -> None:
        p = subprocess.Popen([sys.executable, "-c", CHURN, str(seconds), self.token])
        # Every other one is killed half a second before it would exit by itself.
        self.children.append((p, time.monotonic() + seconds - 0.5, self.started % 2 == 1))
        self.started += 1

    def reap(self) -> None:
        now = time.monotonic()
        left = []
        for p, until, kill in self.children:
            if p.poll() is not None:
                continue
            if kill and now >= until:
                p.terminate()
                p.wait()
                self.killed += 1
                continue
            left.append((p, until, kill))
        self.children = left

    # -- drift ---------------------------------------------------------------------------

    def force_drift(self, irqs: list[int], online: str) -> None:
        """Undo one IRQ placement and the long-lived process's nice, as another writer would.

        Only what is in place right now is drifted, so each forced drift needs its own repair.
        """
        now = time.monotonic()
        start = self.forced_irq % len(irqs)
        for irq in irqs[start:] + irqs[:start]:
            path = Path(f"/proc/irq/{irq}/smp_affinity_list")
            if path.read_text().strip() != "0" or any(k == ("irq", irq) for k, _ in self.pending):
                continue  # not placed by the daemon right now, or still drifted
            try:
                path.write_text(online + "\n")
            except OSError:
                continue  # unmovable here: try the next
            self.forced_irq += 1
            self.pending.append((("irq", irq), now))
            break
        assert self.long_lived is not None
        pid = self.long_lived.pid
        if os.getpriority(os.PRIO_PROCESS, pid) == 5 and not any(
            k[0] == "nice" for k, _ in self.pending
        ):
            os.setpriority(os.PRIO_PROCESS, pid, 0)
            self.forced_nice += 1
            self.pending.append((("nice", pid), now))

    def check_repairs(self) -> None:
        now = time.monotonic()
        left = []
        for (kind, target), t in self.pending:
            if kind == "irq":
                done = Path(f"/proc/irq/{target}/smp_affinity_list").read_text().strip() == "0"
            else:
                done = os.getpriority(os.PRIO_PROCESS, target) == 5
            if done:
                self.latencies.append(now - t)
            else:
                left.append(((kind, target), t))
        self.pending = left

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        online = Path("/sys/devices/system/cpu/online").read_text().strip()
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            raise SystemExit("needs at least 2 CPUs")
        profile = self.work / "long-run.toml"
        profile.write_text(profile_text(self.token, cpus[-1], args.drift_interval))
        before = self.work / "before"
        after = self.work / "after"
        if cli("capture", "--stable", str(before)).returncode != 0:
            raise SystemExit("capture failed")
        self.long_lived = subprocess.Popen([sys.executable, "-c", LONG_LIVED, self.token])
        time.sleep(0.3)
        ll_before = thread_state(self.long_lived.pid)
        log = Path(args.log_dir) / f"{self.token}.daemon.log"
        self.start_daemon(profile, log)
        assert self.daemon is not None
        st = self.wait_ready()
        print(f"daemon pid {self.daemon.pid} ready: {st['daemon']}", flush=True)
        irqs = movable_irqs()
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_spawn = t0
        next_drift = t0 + args.drift_every / 2  # out of phase with the daemon's drift timer
        next_sample = t0
        while time.monotonic() < end:
            now = time.monotonic()
            if self.daemon.poll() is not None:
                raise RuntimeError(f"daemon died with {self.daemon.returncode}; see {log}")
            if now >= next_spawn:
                self.spawn(self.rng.uniform(1.0, 3.0))
                next_spawn += 1.0
            self.reap()
            self.check_repairs()
            if now >= next_drift:
                self.force_drift(irqs, online)
                next_drift += args.drift_every
            if now >= next_sample:
                self.sample(now - t0)
                next_sample += args.sample_every
            time.sleep(0.05)
        # Let the last forced drift be repaired before stopping: one more drift interval.
        for _ in range(int((args.drift_interval + 2) / 0.1)):
            self.check_repairs()
            if not self.pending:
                break
            time.sleep(0.1)
        self.sample(time.monotonic() - t0)
        self.stop_daemon()
        ll_after = thread_state(self.long_lived.pid)
        if cli("capture", "--stable", str(after)).returncode != 0:
            raise SystemExit("capture failed")
        return self.summary(before, after, ll_before, ll_after, log)

    def sample(self, t: float) -> None:
        assert self.daemon is not None
        st = self.status()
        d = st["daemon"]
        assert isinstance(d, dict)
        s = {
            "t_s": round(t),
            "rss_kib": rss_kib(self.daemon.pid),
            "repairs": d["repairs"],
            "placements": d["placements"],
            "journal_entries": st["journal_entries"],
            "forced": self.forced_irq + self.forced_nice,
            "started": self.started,
        }
        self.samples.append(s)
        print(json.dumps(s), flush=True)

    def stop_daemon(self) -> None:
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.figures["daemon_exit"] = self.daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.figures["daemon_exit"] = self.daemon.wait()

    def summary(
        self,
        before: Path,
        after: Path,
        ll_before: tuple[int, list[int]],
        ll_after: tuple[int, list[int]],
        log: Path,
    ) -> int:
        rss = [int(str(s["rss_kib"])) for s in self.samples]
        warm = rss[1:] or rss
        a, b = tree_digest(before), tree_digest(after)
        diff = sorted(
            k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and "tree.json" not in k
        )
        last = self.samples[-1]
        forced = self.forced_irq + self.forced_nice
        self.figures |= {
            "minutes": self.args.minutes,
            "rss_kib_first": rss[0],
            "rss_kib_after_warmup": warm[0],
            "rss_kib_last": rss[-1],
            "rss_kib_max": max(rss),
            "forced_drifts": forced,
            "forced_irq": self.forced_irq,
            "forced_nice": self.forced_nice,
            "repaired_seen": len(self.latencies),
            "unrepaired": len(self.pending),
            "repair_latency_s_median": round(statistics.median(self.latencies), 2)
            if self.latencies
            else None,
            "repair_latency_s_max": round(max(self.latencies), 2) if self.latencies else None,
            "repairs_counted_by_daemon": last["repairs"],
            "placements": last["placements"],
            "processes_started": self.started,
            "processes_killed": self.killed,
            "capture_diff": diff,
            "long_lived_before": ll_before,
            "long_lived_after": ll_after,
            "daemon_log": str(log),
        }
        ok = (
            rss[-1] - warm[0] <= 10 * 1024
            and not self.pending
            and int(str(last["repairs"])) >= forced
            and not diff
            and ll_before == ll_after
            and self.figures.get("daemon_exit") == 0
        )
        self.figures["ok"] = ok
        print(json.dumps(self.figures, indent=1))
        if self.args.json:
            Path(self.args.json).write_text(
                json.dumps({"figures": self.figures, "samples": self.samples}, indent=1) + "\n"
            )
        return 0 if ok else 1

    def cleanup(self) -> None:
        for p, _, _ in self.children:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.daemon is not None and self.daemon.poll() is None:
            self.stop_daemon()
        journal = self.state / "run" if not self.args.shared_state else Path("/run/gputuned")
        if (journal / "journal.jsonl").exists():
            print("daemon left a journal: reverting it", file=sys.stderr)
            with self.private_state() as ns:
                done = cli("revert", ns_pid=ns)
                print(done.stdout + done.stderr, file=sys.stderr)
        if self.long_lived is not None:
            self.long_lived.kill()
            self.long_lived.wait()
        shutil.rmtree(self.work, ignore_errors=True)

    @contextlib.contextmanager
    def private_state(self) -> Iterator[int | None]:
        """A process in a namespace with this run's state mounted, for a last-resort revert."""
        if self.args.shared_state:
            yield None
            return
        script = (
            f"mount --bind {self.state / 'run'} /run/gputuned && "
            f"mount --bind {self.state / 'etc'} /etc/gputuned && exec sleep 600"
        )
        p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
        time.sleep(0.5)
        try:
            yield p.pid
        finally:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--drift-every", type=float, default=10, help="seconds between forced drifts")
    ap.add_argument("--drift-interval", type=float, default=10, help="[daemon] drift_interval_s")
    ap.add_argument("--sample-every", type=float, default=10, help="seconds between samples")
    ap.add_argument("--log-dir", default=tempfile.gettempdir(), help="daemon log directory")
    ap.add_argument("--seed", type=int, default=1, help="seed of the churn lifetimes")
    ap.add_argument("--json", help="write figures and samples here")
    ap.add_argument("--shared-state", action="store_true", help="use the host's /run/gputuned")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the daemon tunes this machine's kernel")
    run = Run(args)
    try:
        return run.run()
    finally:
        run.cleanup()


if __name__ == "__main__":
    sys.exit(main())
