"""The scenario matrix's arithmetic (benchmarks/matrix.py over noisy_neighbor.py): per-block
ratios to the block's own clean windows, medians and spreads over blocks, the verdict against
the goal, which windows make which scenario's row, the block schedule and its deadline, and
pooling blocks of several runs. Synthetic windows only: nothing is run or measured here."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.benchscript import load

mx = load("matrix")
nn = mx.nn


def window(noise: str, cond: str, rnd: int, tok_s: float, p99: float, **kw: Any) -> dict[str, Any]:
    w = {
        "round": rnd,
        "noise": noise,
        "condition": cond,
        "tok_s": tok_s,
        "p50_ms": 10.0,
        "p99_ms": p99,
        "runq_ms_per_token": kw.pop("runq", 0.0),
        "invol_cs_per_1k": kw.pop("invol", 0.0),
        "vol_cs_per_1k": 0.0,
        "_lat": kw.pop("lat", [10.0, p99]),
    }
    w.update(kw)
    return w


def block(
    noise: str, rnd: int, clean: tuple[float, float], **conds: tuple[float, float]
) -> list[dict[str, Any]]:
    """clean (tok/s 100 then 100 * clean[1]... given as (first, again)), the named conditions
    as (tok/s, p99 ms), then clean again; p99 of the clean windows 10 ms. Ratios added."""
    ws = [window(noise, "clean", rnd, clean[0], 10.0)]
    ws += [window(noise, c.replace("_", ":"), rnd, t, p) for c, (t, p) in conds.items()]
    ws.append(window(noise, "clean-again", rnd, clean[1], 10.0))
    nn.add_ratios(ws)
    return ws


def test_ratios_are_to_the_mean_of_the_blocks_own_clean_windows() -> None:
    ws = block("heavy", 1, (90.0, 110.0), noisy=(50.0, 30.0), tuned_p=(98.0, 10.4))
    tuned = next(w for w in ws if w["condition"] == "tuned:p")
    assert tuned["tok_s_x"] == pytest.approx(0.98)  # 98 / mean(90, 110)
    assert tuned["p99_x"] == pytest.approx(1.04)  # 10.4 / 10
    noisy = next(w for w in ws if w["condition"] == "noisy")
    assert noisy["tok_s_x"] == pytest.approx(0.5)
    assert noisy["p99_x"] == pytest.approx(3.0)


def heavy_blocks(tok: list[float], p99: list[float]) -> list[dict[str, Any]]:
    out = []
    for i, (t, p) in enumerate(zip(tok, p99, strict=True), 1):
        out += block("heavy", i, (100.0, 100.0), noisy=(50.0, 30.0), tuned_p=(t, p))
    return out


def test_median_and_spread_of_per_block_ratios_and_met() -> None:
    ws = heavy_blocks([90, 95, 96, 98, 99, 102], [11.0, 10.6, 10.5, 10.4, 10.2, 9.0])
    rows = mx.rows(nn.summarize(ws), ["heavy"], need=2, need_heavy=6)
    tuned = next(r for r in rows if r["condition"] == "gputuned")
    assert tuned["blocks"] == 6
    assert tuned["tok_s_x"]["median"] == pytest.approx(0.97)  # (0.96 + 0.98) / 2
    assert (tuned["tok_s_x"]["min"], tuned["tok_s_x"]["max"]) == pytest.approx((0.90, 1.02))
    assert tuned["p99_x"]["median"] == pytest.approx(1.045)
    assert tuned["verdict"] == "met"
    untuned = next(r for r in rows if r["condition"] == "untuned")
    assert untuned["verdict"].startswith("not met")


def test_not_met_names_each_miss() -> None:
    ws = heavy_blocks([90, 95, 96, 96, 99, 102], [11.0, 11.0, 10.6, 10.6, 10.2, 9.0])
    rows = mx.rows(nn.summarize(ws), ["heavy"], need=2, need_heavy=6)
    v = next(r for r in rows if r["condition"] == "gputuned")["verdict"]
    assert v == "not met: tok/s 0.960x < 0.97, p99 1.060x > 1.05"


def test_too_few_blocks_under_heavy_but_enough_elsewhere() -> None:
    tok, p99 = [98.0] * 5, [10.0] * 5
    ws = heavy_blocks(tok, p99)
    for i in (1, 2):
        ws += block("cpu", i, (100.0, 100.0), noisy=(80.0, 20.0), tuned_p=(99.0, 10.0))
    rows = mx.rows(nn.summarize(ws), ["heavy", "cpu"], need=2, need_heavy=6)
    verdicts = {(r["scenario"], r["condition"]): r["verdict"] for r in rows}
    assert verdicts[("heavy", "gputuned")] == "too few blocks (5 < 6)"
    assert verdicts[("cpu", "gputuned")] == "met"
    one = mx.verdict({"n": 1, "median": 1.0}, {"n": 1, "median": 1.0}, 2)
    assert one == "too few blocks (1 < 2)"


def test_goal_edges_are_inclusive() -> None:
    assert mx.verdict({"n": 6, "median": 0.97}, {"n": 6, "median": 1.05}, 6) == "met"
    assert mx.verdict({"n": 6, "median": 0.9699}, {"n": 6, "median": 1.0}, 6).startswith("not")
    assert mx.verdict({"n": 6, "median": 1.0}, {"n": 6, "median": 1.0501}, 6).startswith("not")


def test_rows_per_scenario_pinned_and_baseline() -> None:
    ws = []
    for i in (1, 2):
        ws += block(
            "heavy",
            i,
            (100.0, 100.0),
            noisy=(50.0, 30.0),
            **{"tuned_p_server-first": (97.0, 10.0), "tuned_p_daemon-first": (95.0, 10.0)},
            pinned=(90.0, 12.0),
        )
        ws += block("none", i, (100.0, 100.0), noisy=(101.0, 10.0), tuned_p=(99.0, 10.0))
    rows = mx.rows(nn.summarize(ws), ["baseline", "heavy", "pinned"], need=2, need_heavy=2)
    got = [(r["scenario"], r["condition"], r["window_condition"]) for r in rows]
    assert got == [
        ("baseline", "untuned", "noisy"),
        ("baseline", "gputuned", "tuned:p"),
        ("heavy", "untuned", "noisy"),
        ("heavy", "gputuned (server first)", "tuned:p:server-first"),
        ("heavy", "gputuned (daemon first)", "tuned:p:daemon-first"),
        ("pinned", "pinned by hand", "pinned"),
        ("pinned", "gputuned (server first)", "tuned:p:server-first"),
        ("pinned", "gputuned (daemon first)", "tuned:p:daemon-first"),
    ]
    pinned = rows[5]
    assert pinned["tok_s_x"]["median"] == pytest.approx(0.9)
    assert pinned["verdict"] == "not met: tok/s 0.900x < 0.97, p99 1.200x > 1.05"


def test_neighbour_loss_against_the_untuned_window() -> None:
    ws = [
        window("cpu", "clean", 1, 100.0, 10.0),
        window("cpu", "noisy", 1, 50.0, 30.0, neighbour_work_per_s={"cpu": 1000.0}),
        window("cpu", "tuned:p", 1, 100.0, 10.0, neighbour_work_per_s={"cpu": 750.0}),
        window("cpu", "clean-again", 1, 100.0, 10.0),
    ]
    nn.add_ratios(ws)
    rows = mx.rows(nn.summarize(ws), ["cpu"], need=1, need_heavy=6)
    assert rows[0]["neighbour_loss"] == {}  # untuned: the reference itself
    assert rows[1]["neighbour_loss"] == {"cpu": pytest.approx(0.25)}


def test_block_steps_take_turns_and_pinned_only_under_heavy() -> None:
    base = [("noisy",), ("tuned", "p", "server-first"), ("tuned", "p", "daemon-first")]
    base.append(("reverted",))
    pin = frozenset({1, 2})
    odd = mx.block_steps("heavy", ["heavy", "pinned"], base, pin, 1)
    assert [s[0] for s in odd] == ["noisy", "tuned", "tuned", "pinned"]
    even = mx.block_steps("heavy", ["heavy", "pinned"], base, pin, 2)
    assert even == list(reversed(odd))
    assert ("pinned", pin) not in mx.block_steps("cpu", ["cpu", "pinned"], base, pin, 1)
    assert ("pinned", pin) not in mx.block_steps("heavy", ["heavy"], base, pin, 1)
    assert mx.noise_kinds(["baseline", "pinned", "heavy", "cpu"]) == ["none", "heavy", "cpu"]


def fake_ctx(window_s: float = 1.0) -> dict[str, Any]:
    args = argparse.Namespace(
        window=window_s, warmup=0.0, settle=0.0, profile=[], shape="single", order="both"
    )
    return {"args": args, "worker": None, "gputuned": None, "result": {"worker_start_s": 1.0}}


def test_schedule_alternates_noise_kinds_and_skips_past_the_deadline() -> None:
    mine = argparse.Namespace(blocks=2, scenarios=["cpu", "net"], deadline=None)
    ctx = fake_ctx()
    got = [(b.noise_kind, b.rnd) for b in mx.schedule(mine, ["cpu", "net"], None)(ctx)]
    assert got == [("cpu", 1), ("net", 1), ("net", 2), ("cpu", 2)]
    assert ctx["result"]["skipped"] == []
    mine.deadline = time.time() + 1.0  # a block: 3 windows of 1 s and 2 s for the noise
    ctx = fake_ctx()
    assert list(mx.schedule(mine, ["cpu", "net"], None)(ctx)) == []
    assert len(ctx["result"]["skipped"]) == 4
    assert ctx["result"]["skipped"][0].startswith("block 1 cpu: skipped, about 5 s needed")


def test_merge_pools_blocks_of_several_runs(tmp_path: Path) -> None:
    runs = []
    for n, tok in enumerate(([96.0, 97.0, 98.0], [99.0, 100.0, 101.0])):
        ws = heavy_blocks(tok, [10.0] * 3)
        doc = {"windows": [{**nn._public(w, True)} for w in ws]}
        path = tmp_path / f"run{n}.json"
        path.write_text(json.dumps(doc))
        runs.append(path)
    mine = argparse.Namespace(
        merge=runs, out=tmp_path / "out", scenarios=["heavy"], need=2, need_heavy=6
    )
    assert mx.merge(mine) == 0
    doc = json.loads((tmp_path / "out" / "matrix-merged.json").read_text())
    tuned = next(r for r in doc["summary"]["rows"] if r["condition"] == "gputuned")
    assert tuned["blocks"] == 6  # rounds 1-3 of each run stay apart
    assert tuned["tok_s_x"]["median"] == pytest.approx(0.985)
    assert tuned["verdict"] == "met"
    assert (tmp_path / "out" / "matrix-merged.png").read_bytes()[:4] == b"\x89PNG"
