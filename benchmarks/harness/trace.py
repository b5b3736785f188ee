"""A daemon trace read back: where each start's time went, from the records
benchmarks/daemon_trace.py writes (one JSON line per handled batch of process events; the
fields are in its docstring), for benchmarks/reaction.py --breakdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.figures import percentile

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
