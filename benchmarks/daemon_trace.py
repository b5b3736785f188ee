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

benchmarks/harness/trace.py reads a trace back for reaction.py: where each start's time went.
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
    from harness import applysteps

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
    # One op's steps, wherever this version keeps them (benchmarks/harness/applysteps.py).
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
