"""The figures: per window (tokens/s, p50/p99 per-token latency, run-queue delay, context
switches), per block (ratios to the block's own clean windows, the neighbours' bill), over
rounds (median and range, pooled percentiles), and the summary table."""

from __future__ import annotations

import statistics
from typing import Any

GOAL_TOK, GOAL_P99 = 0.97, 1.10


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def window_figures(res: dict[str, Any]) -> dict[str, Any]:
    lat = res["lat_ms"]
    n = max(1, len(lat))
    return {
        "tokens": len(lat),
        "seconds": round(res["elapsed_s"], 3),
        "tok_s": len(lat) / res["elapsed_s"],
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "runq_ms_per_token": res["wait_ns"] / 1e6 / n,
        "cpu_ms_per_token": res["run_ns"] / 1e6 / n,
        "host_ms_per_token": res.get("host_ms", float("nan")),
        "invol_cs_per_1k": res["invol"] * 1000 / n,
        "vol_cs_per_1k": res["vol"] * 1000 / n,
    }


def public_window(w: dict[str, Any], latencies: bool) -> dict[str, Any]:
    """A window as the JSON has it: its tokens' latencies as ``lat_ms`` only when asked."""
    out = {k: v for k, v in w.items() if k != "_lat"}
    if latencies:
        out["lat_ms"] = w["_lat"]
    return out


def add_ratios(block: list[dict[str, Any]]) -> None:
    """Ratios to the mean of the block's own clean windows (clean and clean-again)."""
    clean = [w for w in block if w["condition"] in ("clean", "clean-again")]
    for key, name in (("tok_s", "tok_s_x"), ("p50_ms", "p50_x"), ("p99_ms", "p99_x")):
        ref = statistics.fmean(w[key] for w in clean)
        for w in block:
            w[name] = w[key] / ref if ref else float("nan")
    # The neighbours' bill (issue 20, item 3): against the block's untuned noisy window, what
    # the server gained and what each kind of neighbour lost (1 - work / untuned work).
    noisy = next((w for w in block if w["condition"] == "noisy"), None)
    if noisy is None or "neighbour_work_per_s" not in noisy:
        return
    base = noisy["neighbour_work_per_s"]
    for w in block:
        if "neighbour_work_per_s" in w:
            w["server_gain"] = w["tok_s"] / noisy["tok_s"] - 1 if noisy["tok_s"] else float("nan")
            w["neighbour_loss"] = {
                p: 1 - v / base[p] if base.get(p) else float("nan")
                for p, v in w["neighbour_work_per_s"].items()
            }


def spread(xs: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }


def pooled(windows: list[dict[str, Any]], noise: str, conds: tuple[str, ...]) -> list[float]:
    return [
        x for w in windows if w["noise"] == noise and w["condition"] in conds for x in w["_lat"]
    ]


def summarize(windows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per noise kind and condition: the spread over rounds of each figure, and p50/p99 of all
    rounds' tokens pooled against the pooled clean tokens (more tokens: a steadier p99)."""
    out: dict[str, dict[str, Any]] = {}
    for w in windows:
        cond = out.setdefault(w["noise"], {}).setdefault(w["condition"], {})
        for key in (
            "tok_s_x",
            "p50_x",
            "p99_x",
            "tok_s",
            "p99_ms",
            "runq_ms_per_token",
            "invol_cs_per_1k",
            "vol_cs_per_1k",
        ):
            cond.setdefault(key, []).append(w[key])
        if "neighbour_loss" in w:
            cond.setdefault("server_gain", []).append(w["server_gain"])
            for part, loss in w["neighbour_loss"].items():
                cond.setdefault(f"neighbour_loss_{part}", []).append(loss)
    summary = {
        noise: {c: {k: spread(v) for k, v in vals.items()} for c, vals in conds.items()}
        for noise, conds in out.items()
    }
    for noise, conds in summary.items():
        clean = pooled(windows, noise, ("clean", "clean-again"))
        for cond, figures in conds.items():
            mine = pooled(windows, noise, (cond,))
            for q in (50, 99):
                figures[f"p{q}_pooled_x"] = percentile(mine, q) / percentile(clean, q)
            figures["tokens"] = len(mine)
    return summary


def table(summary: dict[str, Any], header: str) -> str:
    def r(s: dict[str, float]) -> str:
        return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"

    lines = [
        header,
        f"{'noise':6} {'condition':22} {'tok/s x':18} {'p50 x':18} {'p99 x':18} "
        f"{'p99 pooled x':>12} {'runq ms/tok':>11} {'invcs/1k tok':>12} {'tok/s':>8}",
    ]
    for noise, conds in summary.items():
        for cond, s in conds.items():
            lines.append(
                f"{noise:6} {cond:22} {r(s['tok_s_x']):18} {r(s['p50_x']):18} "
                f"{r(s['p99_x']):18} {s['p99_pooled_x']:12.2f} "
                f"{s['runq_ms_per_token']['median']:11.3f} "
                f"{s['invol_cs_per_1k']['median']:12.1f} {s['tok_s']['median']:8.1f}"
            )
    for noise, conds in summary.items():
        for cond, s in conds.items():
            if "server_gain" in s and cond != "noisy":
                losses = ", ".join(
                    f"{k.removeprefix('neighbour_loss_')} {v['median']:+.1%}"
                    for k, v in s.items()
                    if k.startswith("neighbour_loss_")
                )
                lines.append(
                    f"neighbours' bill, {cond} under {noise}: server tok/s "
                    f"{s['server_gain']['median']:+.1%} against untuned; neighbours lose "
                    f"{losses} of their untuned work (median over rounds)"
                )
    for noise, conds in summary.items():
        for cond, s in conds.items():
            if cond.startswith("tuned"):
                tok, p99 = s["tok_s_x"]["median"], s["p99_x"]["median"]
                p99p = s["p99_pooled_x"]
                # Three decimals: at two, a p99 of 1.1023x prints as 1.10x beside "NOT met".
                lines.append(
                    f"goal {cond} under {noise} noise: tok/s {tok:.3f}x "
                    f"({'met' if tok >= GOAL_TOK else 'NOT met'}: >= {GOAL_TOK}), p99 {p99:.3f}x "
                    f"and pooled {p99p:.3f}x "
                    f"({'both met' if max(p99, p99p) <= GOAL_P99 else 'NOT met'}: <= {GOAL_P99})"
                )
    return "\n".join(lines)
