"""`[workqueues]`: the unbound workqueues' CPU mask and each WQ_SYSFS workqueue's own, planned,
applied, verified and reverted on copies of the H200 tree (which has 16 CPUs; the workqueue
files are added here as Linux 6.8+ shows them: every CPU, none isolated)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from gputuned.engine.opcheck import refusal
from gputuned.errors import ProfileError
from gputuned.kernel.masks import WORKQUEUES
from gputuned.profile.load import parse_profile
from gputuned.settings.base import Op
from tests.unit.test_apply import digest, tree_copy

WQ = WORKQUEUES.lstrip("/")
PROFILE = """name = "wq"
[cpusets.housekeeping]
cpus = "0,8"
[workqueues]
cpus = "housekeeping"
"""


def tree(tmp_path: Path, *, isolated: str = "0000") -> Path:
    root = tree_copy("h200-vm", tmp_path)
    wq = root / WQ
    for folder in ("", "writeback", "blkcg_punt_bio"):
        (wq / folder).mkdir(parents=True, exist_ok=True)
        (wq / folder / "cpumask").write_text("ffff\n")
    (wq / "events_unbound").mkdir()  # a workqueue without WQ_SYSFS: no cpumask of its own
    (wq / "cpumask_isolated").write_text(isolated + "\n")
    return root


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    rc = cli.main([*args, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def profile_file(tmp_path: Path, text: str = PROFILE) -> str:
    path = tmp_path / "wq.toml"
    path.write_text(text)
    return str(path)


def test_unbound_work_moves_to_the_set_and_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path)
    rc, plan = run(capsys, "plan", prof, "--root", str(root))
    assert rc == 0
    changes = plan["changes"]
    assert isinstance(changes, list)
    assert [(c["target"], c["current"], c["wanted"]) for c in changes] == [
        ("unbound workqueues", "ffff", "0101"),
        ("workqueue blkcg_punt_bio", "ffff", "0101"),
        ("workqueue writeback", "ffff", "0101"),
    ]
    assert digest(root) == before

    assert run(capsys, "apply", prof, "--root", str(root))[0] == 0
    for folder in ("", "writeback", "blkcg_punt_bio"):
        assert (root / WQ / folder / "cpumask").read_text().strip() == "0101"
    assert not (root / WQ / "events_unbound" / "cpumask").exists()
    assert run(capsys, "verify", prof, "--root", str(root))[0] == 0

    (root / WQ / "writeback" / "cpumask").write_text("ffff\n")  # someone widened it again
    rc, report = run(capsys, "verify", prof, "--root", str(root))
    assert rc == 1, report

    assert cli.main(["revert", "--root", str(root)]) == 0
    capsys.readouterr()
    assert digest(root) == before


def test_what_the_kernel_already_keeps_off_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path, isolated="00fe")
    rc, plan = run(capsys, "plan", profile_file(tmp_path), "--root", str(root))
    assert rc == 0
    assert (
        "workqueues: the kernel already keeps unbound work off CPUs 1-7 "
        "(isolated partitions or isolcpus=)"
    ) in plan["notes"]  # type: ignore[operator]


def test_a_kernel_without_the_files_is_told_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_copy("h200-vm", tmp_path)
    rc, plan = run(capsys, "plan", profile_file(tmp_path), "--root", str(root))
    assert rc == 0
    refused = plan["refused"]
    assert isinstance(refused, list)
    assert [(r["tuner"], r["target"]) for r in refused] == [("workqueues", "unbound workqueues")]
    assert "Linux before 4.2" in refused[0]["reason"]
    assert plan["changes"] == []


def test_keep_and_report_only_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree(tmp_path)
    before = digest(root)
    keep = PROFILE.replace('cpus = "housekeeping"\n', 'cpus = "keep"\n')
    assert (
        run(capsys, "plan", profile_file(tmp_path, keep), "--root", str(root))[1]["changes"] == []
    )
    report_only = PROFILE + "report_only = true\n"
    assert run(capsys, "apply", profile_file(tmp_path, report_only), "--root", str(root))[0] == 0
    assert digest(root) == before


def test_the_set_must_exist() -> None:
    with pytest.raises(ProfileError) as exc:
        parse_profile({"name": "x", "workqueues": {"cpus": "nosuch"}}, "t")
    assert exc.value.problems == [("workqueues.cpus", "unknown CPU set 'nosuch'; use 'keep'")]


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/sys/devices/virtual/workqueue/cpumask", True),
        ("/sys/devices/virtual/workqueue/writeback/cpumask", True),
        ("/sys/devices/virtual/workqueue/../cpumask", False),
        ("/sys/devices/virtual/workqueue/a/b/cpumask", False),
        ("/sys/devices/virtual/workqueue/writeback/max_active", False),
        ("/sys/devices/virtual/workqueue/cpumask_requested", False),
    ],
)
def test_a_journal_names_only_workqueue_masks(path: str, ok: bool) -> None:
    """The user relies on revert writing only a workqueue's CPU mask, whatever a journal says."""
    op = Op("k", "workqueues", "t", "sysfs", path, "ffff", compare="mask")
    assert (refusal(op, "ffff") is None) is ok
