"""The matrix at a glance (benchmarks/matrix_glance.py): the shipped H200 data file agrees with
the runs' files kept beside it, a row that does not is named, malformed rows stop with what is
wrong, and the table's verdicts follow the goal. Nothing is run or measured here."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.benchscript import load

mg = load("matrix_glance")


def shipped() -> dict[str, Any]:
    doc: dict[str, Any] = mg.load(mg.DATA)
    return doc


def test_shipped_rows_agree_with_the_runs_files() -> None:
    doc = shipped()
    backed = [r for r in doc["rows"] if r["run"] in doc["files"]]
    assert len(backed) == 9  # baseline, net, disk x untuned and both orders, server-shaped
    assert mg.check(doc, mg.DATA.parent) == []
    assert mg.main([str(mg.DATA), "--check"]) == 0


def test_a_row_that_differs_from_its_files_is_named(tmp_path: Path) -> None:
    doc = shipped()
    bad = copy.deepcopy(doc)
    row = next(r for r in bad["rows"] if r["run"] in bad["files"] and r["scenario"] == "net")
    row["tok_s_x"][0] = round(row["tok_s_x"][0] + 0.01, 4)
    row["blocks"] += 1
    problems = mg.check(bad, mg.DATA.parent)
    assert len(problems) == 2, problems
    assert all(f"net / server / {row['condition']}" in p for p in problems)
    assert any("tok_s_x is" in p for p in problems) and any("blocks is" in p for p in problems)
    # the same through the command line: a data file beside copies of the runs' files
    for names in bad["files"].values():
        for name in names:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes((mg.DATA.parent / name).read_bytes())
    (tmp_path / "d.json").write_text(json.dumps(bad))
    assert mg.main([str(tmp_path / "d.json"), "--check"]) == 1


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"tok_s_x": [0.9, 0.95, 1.0]}, "min <= median <= max"),
        ({"condition": "tuned"}, "condition 'tuned'"),
        ({"scenario": "pinned"}, "pinned is a condition of heavy"),
        ({"run": "elsewhere"}, "run 'elsewhere'"),
        ({"blocks": 0}, "blocks must be"),
        ({"p99_x": [1.0, "x", 1.1]}, "p99_x must be"),
        ({"runq_ms_per_token": None}, "runq_ms_per_token must be"),
    ],
)
def test_malformed_rows_stop_with_what_is_wrong(
    tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    doc = json.loads(mg.DATA.read_text())
    doc["rows"][3].update(change)
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as e:
        mg.load(path)
    assert "row 4" in str(e.value) and says in str(e.value)


def test_table_verdicts_follow_the_goal_and_the_blocks_each_scenario_needs() -> None:
    doc = shipped()
    lines = mg.table(doc).splitlines()
    assert len(lines) == 2 + len(doc["rows"])
    heavy = next(ln for ln in lines if ln.startswith("| heavy | server | gputuned (daemon first)"))
    assert "| 7 |" in heavy and "not met: tok/s 0.930x < 0.97 |" in heavy
    row = {
        "scenario": "heavy",
        "shape": "server",
        "condition": "gputuned",
        "blocks": 5,
        "tok_s_x": [1.0, 0.9, 1.1],
        "p99_x": [1.0, 0.9, 1.1],
    }
    assert mg.verdict(row) == "too few blocks (5 < 6)"
    assert mg.verdict({**row, "blocks": 6}) == "met"
    assert mg.verdict({**row, "scenario": "cpu", "blocks": 2}) == "met"
    assert mg.verdict({**row, "blocks": 6, "p99_x": [1.06, 1.0, 1.1]}).startswith("not met: p99")


def test_figure_is_written(tmp_path: Path) -> None:
    how = mg.figure(shipped(), tmp_path / "g.png", "t")
    assert how in ("matplotlib", "plain (matplotlib not installed: bars only, no labels)")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
