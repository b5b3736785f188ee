"""Run ``gputuned`` with a timer on every step of a placement, for benchmarks/reaction.py.

    python3 benchmarks/daemon_trace.py [--trace TRACE.jsonl] [--tree DIR] [gputuned arguments]

The daemon runs as usual (its own ``main``); this only wraps, from outside, the functions a
placement goes through and appends one JSON line per handled batch of process events to
TRACE.jsonl, so that the product carries no timing code. ``--tree DIR`` runs the gputuned
package found in DIR (a copy of an earlier version) instead of this checkout's, so that
benchmarks/reaction.py --daemon-tree can compare two versions on one host. Each line says:

- ``events``: the batch's process events as the kernel stamped them (``ts``: the proc
  connector's ``timestamp_ns``, CLOCK_MONOTONIC at fork/exec/exit, kernel/connector/cn_proc.c)
  and when the daemon received them (``recv``: its read of the socket), in ns;
- ``start``/``end``: the handler's own span (CLOCK_MONOTONIC ns, the clock the benchmark
  reads too);
- ``woke_wait_ns``: run-queue wait of the daemon's thread since the previous handler ended
  (/proc/thread-self/schedstat, second field): the time it was runnable but not running while
  it idled, so how long the wakeup for this batch waited for a CPU;
- ``phases``: per step, its own time (a step inside another is not counted twice), and what
  the thread did in it: ``cpu`` (on a CPU), ``rq`` (runnable, waiting for one) and the rest,
  ``blocked`` (asleep in the kernel: I/O, a lock, an RCU grace period). Steps: ``plan``
  (reading /proc for the new process), ``journal: read old`` (reading the values to save),
  ``check: held already``, ``journal: append+fsync`` (the one append before a placement's
  writes, and its fsync where there is one), ``write: KIND`` (the identity check and the system call; KIND: proc_cgroup =
  cgroup.procs, affinity, nice, policy) and ``read-back: KIND``, ``forget exited`` and
  ``journal: compact``; ``handler: other`` is the rest of the handler (reading the socket);
- ``pids`` placed (empty for a batch that placed nothing) and ``writes``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

F = TypeVar("F", bound=Callable[..., Any])
_SCHEDSTAT = "/proc/thread-self/schedstat"


def schedstat() -> tuple[int, int]:
    """(ns on a CPU, ns runnable and waiting) of the calling thread."""
    with open(_SCHEDSTAT, "rb") as f:  # noqa: PTH123  (a hot path: no pathlib)
        cpu, wait, _ = f.read().split()
    return int(cpu), int(wait)


class Tracer:
    """Exclusive time per step, kept on a stack; one record per handled batch of events."""

    def __init__(self, out: Path) -> None:
        self.out = out.open("a", buffering=1)
        self.stack: list[list[Any]] = []  # [label, t0, cpu0, wait0, child_ns, child_cpu, child_rq]
        self.rec: dict[str, Any] | None = None
        self.events: list[dict[str, int]] = []
        self.idle_wait0 = schedstat()[1]

    # -- steps ---------------------------------------------------------------------------------

    def push(self, label: str) -> None:
        cpu, wait = schedstat()
        self.stack.append([label, time.monotonic_ns(), cpu, wait, 0, 0, 0])

    def pop(self) -> None:
        label, t0, cpu0, wait0, c_ns, c_cpu, c_rq = self.stack.pop()
        cpu, wait = schedstat()
        ns, dcpu, drq = time.monotonic_ns() - t0, cpu - cpu0, wait - wait0
        if self.stack:  # the parent does not count this step's time as its own
            parent = self.stack[-1]
            parent[4] += ns
            parent[5] += dcpu
            parent[6] += drq
        if self.rec is None:
            return
        own = self.rec["phases"].setdefault(label, {"ns": 0, "cpu": 0, "rq": 0})
        own["ns"] += ns - c_ns
        own["cpu"] += dcpu - c_cpu
        own["rq"] += drq - c_rq

    def wrap(self, label: str | Callable[..., str], fn: F) -> F:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.rec is None:
                return fn(*args, **kwargs)
            self.push(label(*args) if callable(label) else label)
            try:
                return fn(*args, **kwargs)
            finally:
                self.pop()

        return wrapper  # type: ignore[return-value]

    # -- one handler call ----------------------------------------------------------------------

    def begin(self) -> None:
        cpu, wait = schedstat()
        self.rec = {
            "start": time.monotonic_ns(),
            "woke_wait_ns": wait - self.idle_wait0,
            "phases": {},
            "pids": [],
            "writes": 0,
        }
        self.events = []
        self.stack = [["handler: other", self.rec["start"], cpu, wait, 0, 0, 0]]

    def end(self) -> None:
        assert self.rec is not None
        self.pop()
        rec, self.rec = self.rec, None
        rec["end"] = time.monotonic_ns()
        rec["events"] = self.events
        for p in rec["phases"].values():
            p["blocked"] = max(0, p["ns"] - p["cpu"] - p["rq"])
        self.idle_wait0 = schedstat()[1]
        if rec["events"] or rec["pids"]:
            self.out.write(json.dumps(rec, separators=(",", ":")) + "\n")


def install(tracer: Tracer) -> None:
    """Wrap the daemon's placement path (module attributes, looked up at call time)."""
    import applysteps

    import gputuned.daemon.core as daemon_mod
    import gputuned.daemon.placing as placing_mod
    import gputuned.service.procwatch as pw
    from gputuned.engine.journal import Journal

    parse = pw.parse_datagram

    def parse_datagram(data: Any) -> Any:
        recv = time.monotonic_ns()
        out = parse(data)
        if tracer.rec is not None:
            tracer.events += [
                {"what": e.what, "pid": e.tgid, "tid": e.tid, "ts": e.timestamp_ns, "recv": recv}
                for e in out
                if e.what in (pw.PROC_EVENT_FORK, pw.PROC_EVENT_EXEC, pw.PROC_EVENT_EXIT)
            ]
        return out

    pw.parse_datagram = parse_datagram

    daemon_cls = daemon_mod.Daemon
    on_events = daemon_cls._on_proc_events
    place = daemon_cls._place

    def _on_proc_events(self: Any) -> None:
        tracer.begin()
        try:
            on_events(self)
        finally:
            tracer.end()

    def _place(self: Any, pids: list[int], why: str, **kw: Any) -> None:
        n = self.counters["placements"]
        place(self, pids, why, **kw)  # kw: threads=, for a process's new threads
        if tracer.rec is not None and self.counters["placements"] > n:
            tracer.rec["pids"] += pids

    daemon_cls._on_proc_events = _on_proc_events  # type: ignore[method-assign]
    daemon_cls._place = _place  # type: ignore[method-assign]
    for mod, name, label in (
        (placing_mod, "plan_processes", "plan"),
        (daemon_mod, "forget_process", "forget exited"),
    ):
        setattr(mod, name, tracer.wrap(label, getattr(mod, name)))
    # One op's steps, wherever this version keeps them (benchmarks/applysteps.py).
    mods = applysteps.modules()
    for names, label in (
        (("write",), lambda _h, op, _v: f"write: {op.kind}"),
        (("prepare", "_prepare"), "journal: read old"),
        (("already_held", "_holds"), "check: held already"),
        # commit is the write and its read-back; the write itself is timed inside it.
        (("commit", "_commit"), lambda _h, _j, op, *_: f"read-back: {op.kind}"),
    ):
        applysteps.wrap(mods, names, lambda fn, label=label: tracer.wrap(label, fn))
    Journal.flush = tracer.wrap("journal: append+fsync", Journal.flush)  # type: ignore[method-assign]
    Journal.compact = tracer.wrap("journal: compact", Journal.compact)  # type: ignore[method-assign]
    writer = applysteps.find(mods, ("Writer", "_Writer"))
    written = writer.written

    def count(self: Any, *a: Any) -> None:
        written(self, *a)
        if tracer.rec is not None:
            tracer.rec["writes"] += 1

    writer.written = count


# ---- reading a trace back: where each start's time went --------------------------------------

_EXEC = 2  # PROC_EVENT_EXEC (include/uapi/linux/cn_proc.h)
FORK_EXEC = "fork+exec (to the exec event)"
PROBE_RUNS = "the process runs (to its next event)"
WAKE_RQ = "daemon: wakeup waits for a CPU"
BUSY = "daemon: event waits (busy, or wakeup)"


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def per_start(run: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One start's time from just before its Popen to the daemon's last write for it, cut into
    the parts of its critical path: the parts sum to ``done_ms``."""
    pid, t0, stop = run["pid"], run["t0_ns"], run["stopped_ns"]
    window = [r for r in records if t0 <= r["start"] <= stop]
    mine = [r for r in window if pid in r["pids"]]
    execs = [e["ts"] for r in window for e in r["events"] if e["pid"] == pid and e["what"] == _EXEC]
    if not mine or not execs:
        return None
    parts: dict[str, float] = {FORK_EXEC: min(execs) - t0}
    phases: dict[str, dict[str, float]] = {}
    prev = min(execs)
    for r in mine:
        own = [e["ts"] for e in r["events"] if e["pid"] == pid]
        due = max(prev, min(own)) if own else prev
        parts[PROBE_RUNS] = parts.get(PROBE_RUNS, 0) + max(0, due - prev)
        wait = max(0, r["start"] - due)
        rq = min(wait, r["woke_wait_ns"])
        parts[WAKE_RQ] = parts.get(WAKE_RQ, 0) + rq
        parts[BUSY] = parts.get(BUSY, 0) + wait - rq
        for label, p in r["phases"].items():
            parts[label] = parts.get(label, 0) + p["ns"]
            d = phases.setdefault(label, {"cpu": 0, "rq": 0, "blocked": 0})
            for k in d:
                d[k] += p[k]
        prev = max(due, r["end"])
    return {
        "done_ms": (prev - t0) / 1e6,
        "exec_to_done_ms": (prev - min(execs)) / 1e6,
        "placements": len(mine),
        "parts_ms": {k: v / 1e6 for k, v in parts.items()},
        "phases_ms": {k: {kk: vv / 1e6 for kk, vv in d.items()} for k, d in phases.items()},
    }


def breakdown(runs: list[dict[str, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per part: p50/p90/p99 over all starts, and the mean over the slowest tenth (by the
    time from the exec event to the daemon's last write); per daemon step also how its time split (on CPU, waiting for one,
    blocked) in the slowest tenth."""
    from noisy_neighbor import percentile

    got = []
    for r in runs:
        b = per_start(r, records)
        # Each start keeps its own two figures, so that runs can be pooled afterwards.
        r["traced_done_ms"] = None if b is None else round(b["done_ms"], 3)
        r["traced_exec_to_done_ms"] = None if b is None else round(b["exec_to_done_ms"], 3)
        if b is not None:
            got.append(b)
    if not got:
        return {"starts_traced": 0}
    got.sort(key=lambda b: b["exec_to_done_ms"])  # the daemon's part decides who is slow
    slow = got[-max(1, len(got) // 10) :]
    labels = sorted({k for b in got for k in b["parts_ms"]})
    parts = {}
    for k in labels:
        xs = [b["parts_ms"].get(k, 0.0) for b in got]
        parts[k] = {
            "p50": round(percentile(xs, 50), 3),
            "p90": round(percentile(xs, 90), 3),
            "p99": round(percentile(xs, 99), 3),
            "slowest_tenth_mean": round(
                sum(b["parts_ms"].get(k, 0.0) for b in slow) / len(slow), 3
            ),
        }
    split: dict[str, dict[str, float]] = {}
    for b in slow:
        for k, d in b["phases_ms"].items():
            acc = split.setdefault(k, {"cpu": 0.0, "rq": 0.0, "blocked": 0.0})
            for kk in acc:
                acc[kk] += d[kk] / len(slow)

    def qs(key: str) -> dict[str, float]:
        xs = [b[key] for b in got]
        return {q: round(percentile(xs, n), 3) for q, n in (("p50", 50), ("p90", 90), ("p99", 99))}

    return {
        "starts_traced": len(got),
        "done_ms": qs("done_ms"),
        # From the kernel's exec event: the daemon's part, without the starter's fork and exec.
        "exec_to_done_ms": qs("exec_to_done_ms"),
        "slowest_tenth": len(slow),
        "parts_ms": dict(sorted(parts.items(), key=lambda kv: -kv[1]["slowest_tenth_mean"])),
        "slowest_tenth_step_split_ms": {
            k: {kk: round(vv, 3) for kk, vv in d.items()} for k, d in split.items()
        },
    }


def show(bd: dict[str, Any], indent: str = "  ") -> list[str]:
    """The breakdown as lines for the benchmark's report."""
    if not bd.get("starts_traced"):
        return [f"{indent}no placement traced"]
    d, e = bd["done_ms"], bd["exec_to_done_ms"]
    out = [
        f"{indent}the daemon's last write for a start ({bd['starts_traced']} traced), from "
        f"just before Popen: p50 {d['p50']} ms, p90 {d['p90']}, p99 {d['p99']}; from the exec "
        f"event: p50 {e['p50']} ms, p90 {e['p90']}, p99 {e['p99']}",
        f"{indent}{'part of the path (ms)':44} {'p50':>8} {'p90':>8} {'p99':>8} "
        f"{'slowest ' + str(bd['slowest_tenth']):>11}   on CPU / wait CPU / blocked (slowest)",
    ]
    split = bd["slowest_tenth_step_split_ms"]
    for k, v in bd["parts_ms"].items():
        s = split.get(k)
        how = f"   {s['cpu']:.2f} / {s['rq']:.2f} / {s['blocked']:.2f}" if s else ""
        out.append(
            f"{indent}{k:44} {v['p50']:8.2f} {v['p90']:8.2f} {v['p99']:8.2f} "
            f"{v['slowest_tenth_mean']:11.2f}{how}"
        )
    return out


def main(argv: list[str]) -> int:
    """``[--trace FILE] [--tree DIR] GPUTUNED-ARGS...``: trace when asked, and run the
    gputuned found in DIR (an earlier version, to compare) instead of this checkout's."""
    opts: dict[str, str] = {}
    while argv[:1] in (["--trace"], ["--tree"]):
        opts[argv[0]], argv = argv[1], argv[2:]
    if "--tree" in opts:
        sys.path.insert(0, str(Path(opts["--tree"]).resolve()))
    if "--trace" in opts:
        install(Tracer(Path(opts["--trace"])))
    from gputuned.daemon.main import main as daemon_main

    with contextlib.suppress(KeyboardInterrupt):
        return daemon_main(argv)
    return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
