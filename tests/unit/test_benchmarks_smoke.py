"""The noisy-neighbour benchmark end to end, tiny and CPU-only: JSON and PNG out, nothing left.

No gputuned condition here (that would tune this machine); the noise generators that the short
run does not use are started on their own with a deadline, to show they end by themselves.
"""

from __future__ import annotations

import ast
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests import benchscript

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "noisy_neighbor.py"


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def load() -> ModuleType:
    return benchscript.load("noisy_neighbor")


def png_size(data: bytes) -> tuple[int, int]:
    """Check signature and every chunk's CRC; return (width, height)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    i, size = 8, (0, 0)
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        tag, body = data[i + 4 : i + 8], data[i + 8 : i + 8 + n]
        assert struct.unpack(">I", data[i + 8 + n : i + 12 + n])[0] == zlib.crc32(tag + body)
        if tag == b"IHDR":
            size = struct.unpack(">II", body[:8])
        i += 12 + n
    assert tag == b"IEND"
    return size


def test_tiny_cpu_only_run(tmp_path: Path) -> None:
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--noise", "cpu", "--rounds", "1",
         "--window", "1", "--warmup", "0.2", "--settle", "0.3", "--no-gputuned",
         "--worker", "cpu", "--cpu-burners", "2", "--token-ms", "1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert time.monotonic() - t0 < 30
    doc: dict[str, Any] = json.loads((tmp_path / "noisy_neighbor.json").read_text())
    assert doc["ok"] and doc["worker"] == "cpu-standin"
    assert doc["config"]["conditions"] == ["clean", "noisy", "clean-again"]
    assert doc["config"]["noise_processes"] == {"cpu": {"cpu": 2}}
    assert [w["condition"] for w in doc["windows"]] == ["clean", "noisy", "clean-again"]
    for w in doc["windows"]:
        assert w["tokens"] > 0 and w["tok_s"] > 0 and w["p99_ms"] >= w["p50_ms"] > 0
        for key in ("tok_s_x", "p50_x", "p99_x", "runq_ms_per_token", "invol_cs_per_1k"):
            assert key in w
    summary = doc["summary"]["cpu"]
    assert set(summary) == {"clean", "noisy", "clean-again"}
    for key in ("tok_s_x", "p50_x", "p99_x", "runq_ms_per_token", "invol_cs_per_1k"):
        assert set(summary["noisy"][key]) == {"median", "min", "max", "n"}
    assert summary["noisy"]["p99_pooled_x"] > 0 and summary["noisy"]["tokens"] > 0
    # Worker and two burners, each stopped by PID and reaped.
    assert len(doc["started_pids"]) == 3 and doc["leftover_pids"] == []
    assert all(gone(pid) for pid in doc["started_pids"])
    assert png_size((tmp_path / "noisy_neighbor.png").read_bytes())[0] > 100
    assert "CPU STAND-IN" in run.stdout and "noisy" in run.stdout


def test_tiny_server_shaped_run(tmp_path: Path) -> None:
    """--shape server: an API process that tokenises and spawns the decoding engine; the
    tokens are measured as the API receives them; every process ends with the run."""
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--noise", "cpu", "--rounds", "1",
         "--window", "1", "--warmup", "0.2", "--settle", "0.3", "--no-gputuned", "--shape",
         "server", "--worker", "cpu", "--cpu-burners", "1", "--token-ms", "1", "--api-ms",
         "0.5", "--request-tokens", "16"],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    doc: dict[str, Any] = json.loads((tmp_path / "noisy_neighbor.json").read_text())
    assert doc["ok"] and doc["config"]["shape"] == "server"
    assert "server-shaped" in doc["worker_info"]["desc"]
    # The API process, its spawned engine and Python's resource tracker, all gone now.
    assert len(doc["worker_pids"]) == 3 and doc["worker_pids"][0] == doc["started_pids"][0]
    assert doc["leftover_pids"] == [], run.stdout
    for w in doc["windows"]:
        assert w["tokens"] > 0 and w["ttft_p50_ms"] > 0 and w["p99_ms"] >= w["p50_ms"] > 0


def test_tiny_matrix_try_out(tmp_path: Path) -> None:
    """benchmarks/matrix.py --try-out: paired blocks that take turns (the quiet baseline and
    network noise, two blocks each, untuned only), one row per scenario with its verdict."""
    matrix = SCRIPT.parent / "matrix.py"
    run = subprocess.run(
        [sys.executable, str(matrix), "--out", str(tmp_path), "--try-out", "--no-gputuned",
         "--scenarios", "baseline,net", "--blocks", "2", "--net-streams", "1",
         "--keep-latencies"],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    doc: dict[str, Any] = json.loads((tmp_path / "matrix.json").read_text())
    assert doc["ok"] and doc["config"]["try_out"] and doc["leftover_pids"] == []
    blocks = [(w["noise"], w["round"]) for w in doc["windows"] if w["condition"] == "clean"]
    assert blocks == [("none", 1), ("net", 1), ("net", 2), ("none", 2)]
    rows = doc["summary"]["rows"]
    assert [(r["scenario"], r["condition"], r["blocks"]) for r in rows] == [
        ("baseline", "untuned", 2),
        ("net", "untuned", 2),
    ]
    assert all(r["verdict"] == "met" or r["verdict"].startswith("not met: ") for r in rows)
    assert "neighbour_work_per_s" in next(w for w in doc["windows"] if w["noise"] == "net"
                                          and w["condition"] == "noisy")  # fmt: skip
    assert "TRY-OUT" in run.stdout and "| baseline | untuned | 2 |" in run.stdout
    assert png_size((tmp_path / "matrix.png").read_bytes())[0] > 100


@pytest.mark.parametrize("role", ["cpu", "net", "disk"])
def test_noise_ends_by_itself_at_its_deadline(tmp_path: Path, role: str) -> None:
    argv = [sys.executable, str(SCRIPT), "--role", role, "--deadline", str(time.time() + 0.5)]
    if role == "disk":
        argv += ["--disk-dir", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == []  # the disk writer removed its file


def test_plain_png_and_figures(tmp_path: Path) -> None:
    nn = load()
    block = [
        {"condition": "clean", "tok_s": 100.0, "p50_ms": 2.0, "p99_ms": 4.0},
        {"condition": "noisy", "tok_s": 50.0, "p50_ms": 3.0, "p99_ms": 12.0},
        {"condition": "clean-again", "tok_s": 100.0, "p50_ms": 2.0, "p99_ms": 4.0},
    ]
    nn.add_ratios(block)
    assert (block[1]["tok_s_x"], block[1]["p50_x"], block[1]["p99_x"]) == (0.5, 1.5, 3.0)
    assert nn.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert nn.percentile([5.0], 99) == 5.0
    summary = {"cpu": {"noisy": {"tok_s_x": nn.spread([0.5, 0.6]), "p99_x": nn.spread([3.0])}}}
    nn._plain_png(summary, tmp_path / "p.png")
    assert png_size((tmp_path / "p.png").read_bytes()) == (640, 360)


def test_isolated_profile_loads(tmp_path: Path) -> None:
    """The benchmarks' profile copy (one rule narrowed to the probe) is a profile gputuned
    takes: its include lies beside it, as gputuned/profile.py demands of includes."""
    from gputuned.profile.load import load_profile

    nn = load()
    out = nn.isolated_profile(REPO / "profiles" / "shared-host.toml", tmp_path, r"/probe\.py\b")
    prof = load_profile(out)
    assert [r.name for r in prof.process] == ["server"]
    assert prof.process[0].match.cmdline == r"/probe\.py\b"
    assert prof.cpuset is not None and prof.cpuset.cgroup == "gputuned.inference"


def test_isolated_profile_of_a_profile_in_the_work_folder(tmp_path: Path) -> None:
    """reaction.py writes a variant of the profile (realtime_priority) into its work folder and
    isolates that: the folder copy must not copy itself into itself (it recursed until the
    path was too long: seen on the H200 host)."""
    from gputuned.profile.load import load_profile

    nn = load()
    nn.isolated_profile(REPO / "profiles" / "shared-host.toml", tmp_path, r"/probe\.py\b")
    variant = tmp_path / "variant.toml"  # beside the work/base folder the first call made
    variant.write_text((REPO / "profiles" / "shared-host.toml").read_text())
    out = nn.isolated_profile(variant, tmp_path, r"/probe\.py\b")
    assert not (tmp_path / "base" / "base").exists()
    assert [r.name for r in load_profile(out).process] == ["server"]


def test_neighbours_bill_against_the_untuned_noisy_window() -> None:
    """Server gain and each neighbour's loss (1 - work / untuned work) are taken against the
    block's noisy window (issue 20, item 3); windows without noise get neither."""
    nn = load()

    def win(cond: str, tok_s: float, work: dict[str, float] | None) -> dict[str, Any]:
        w: dict[str, Any] = {"condition": cond, "tok_s": tok_s, "p50_ms": 1.0, "p99_ms": 2.0}
        if work is not None:
            w["neighbour_work_per_s"] = work
        return w

    block = [
        win("clean", 100.0, None),
        win("noisy", 50.0, {"cpu": 1000.0, "net": 4e6, "disk": 2e6}),
        win("tuned:p", 90.0, {"cpu": 750.0, "net": 4e6, "disk": 1e6}),
        win("clean-again", 100.0, None),
    ]
    nn.add_ratios(block)
    tuned = block[2]
    assert tuned["server_gain"] == pytest.approx(0.8)
    assert tuned["neighbour_loss"] == pytest.approx({"cpu": 0.25, "net": 0.0, "disk": 0.5})
    assert block[1]["neighbour_loss"] == {"cpu": 0.0, "net": 0.0, "disk": 0.0}
    assert "neighbour_loss" not in block[0] and "server_gain" not in block[3]
    summary = nn.summarize(
        [{**w, "noise": "heavy", "round": 1, "_lat": [1.0]} | _figs(w) for w in block]
    )
    assert summary["heavy"]["tuned:p"]["neighbour_loss_disk"]["median"] == pytest.approx(0.5)
    assert "neighbours' bill, tuned:p under heavy" in nn.table(summary, "h")


def _figs(w: dict[str, Any]) -> dict[str, Any]:
    keys = ("runq_ms_per_token", "invol_cs_per_1k", "vol_cs_per_1k")
    return dict.fromkeys(keys, 0.0)


@pytest.mark.parametrize(
    "path", sorted((REPO / "benchmarks" / "profiles").glob("*.toml")), ids=lambda p: p.name
)
def test_benchmark_profiles_load(path: Path) -> None:
    """The benchmarks' profile variants stay loadable (two included the shipped profile by a
    ``../..`` path, which issue 14's include rules refuse; they name it now)."""
    from gputuned.profile.load import load_profile

    assert load_profile(path).process, path


def test_neighbours_curve_from_a_run_summary(tmp_path: Path) -> None:
    """benchmarks/neighbours_curve.py: one row per cap, sorted, loss against the bound."""

    def s(m: float) -> dict[str, float]:
        return {"median": m, "min": m - 0.01, "max": m + 0.01, "n": 3}

    cond = {"tok_s_x": s(0.9), "p99_x": s(1.1), "server_gain": s(0.5)}
    summary = {
        "heavy": {
            "noisy": {"tok_s_x": s(0.5), "p99_x": s(2.0)},
            "tuned:shared-host": {**cond, "neighbour_loss_cpu": s(0.45)},
            "tuned:shared-host-cap2": {**cond, "neighbour_loss_cpu": s(0.8)},
            "tuned:shared-host-cap12": {**cond, "neighbour_loss_cpu": s(0.3)},
        }
    }
    result = tmp_path / "noisy_neighbor.json"
    result.write_text(json.dumps({"summary": summary}))
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/neighbours_curve.py"),
            str(result),
            "--json",
            "--reserved",
            "8",
            "--cpus",
            "16",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    curve = json.loads(out.stdout)["curve"]
    assert [(r["cap_cpus"], r["bound_kept"]) for r in curve] == [
        ("2", False),
        ("12", True),
        ("none", True),
    ]


# ---- the layout: scripts over a harness (issue 29, step 5) -----------------------------------

HARNESS = REPO / "benchmarks" / "harness"


def bench_imports() -> dict[str, set[str]]:
    """Per module of benchmarks/ (a script by its file name, ``harness`` and ``harness.NAME``),
    the modules of benchmarks/ it imports anywhere in it, lazy imports in functions included."""
    scripts = {p.stem: p for p in (REPO / "benchmarks").glob("*.py")}
    lib = {"harness": HARNESS / "__init__.py"} if HARNESS.is_dir() else {}
    lib |= {f"harness.{p.stem}": p for p in HARNESS.glob("*.py") if p.stem != "__init__"}
    known = scripts.keys() | lib.keys()
    out: dict[str, set[str]] = {}
    for name, path in (scripts | lib).items():
        got: set[str] = set()
        package = "harness" if name in lib else ""
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                got |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: only the harness is a package
                    base = ".".join(filter(None, [package, base]))
                got.add(base)
                got |= {f"{base}.{a.name}" for a in node.names}
        out[name] = {m for m in got if m in known and m != name}
    return out


def test_no_script_imports_another_script() -> None:
    """Each benchmark script stands on the harness alone: one script imported by another
    (noisy_neighbor.py by six) ran its module code and tied the two together."""
    graph = bench_imports()
    scripts = {m for m in graph if not m.startswith("harness")}
    assert {m: sorted(graph[m] & scripts) for m in sorted(scripts) if graph[m] & scripts} == {}


def test_the_harness_imports_no_script() -> None:
    graph = bench_imports()
    lib = sorted(m for m in graph if m.startswith("harness."))
    assert lib, "benchmarks/harness/ holds the shared machinery"
    assert {m: sorted(s for s in graph[m] if not s.startswith("harness")) for m in lib} == {
        m: [] for m in lib
    }


def test_no_import_cycle_among_benchmark_modules() -> None:
    """noisy_neighbor.py and server_shape.py imported each other (lazily, both ways)."""
    graph = bench_imports()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append([*path[path.index(n) :], n])
            elif n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []
