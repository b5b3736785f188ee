"""What plan, apply, verify and status say will and will not happen (issue 19, item 4):
report-only rows marked and counted apart, who places processes after a one-shot apply, what
was refused kept after apply, a profile file edited since apply, hints that keep --root."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from gputuned.cli.profilecmds import to_toml
from gputuned.profile.load import load_profile
from tests.unit.test_apply import PROFILES, tree_copy


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, " ".join(out.out.split()), " ".join(out.err.split())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tree_copy("h200-captured", tmp_path)


def quiet_irq_profile(tmp_path: Path) -> Path:
    """shared-host with [irq] report_only = true and no [neighbours] (report only too), as one
    file."""
    data = load_profile(PROFILES / "shared-host.toml").model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    data["irq"]["report_only"] = True
    data.pop("neighbours", None)
    path = tmp_path / "quiet-irq.toml"
    path.write_text(to_toml(data))
    return path


def test_report_only_rows_are_marked_and_counted_apart(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prof = str(quiet_irq_profile(tmp_path))
    rc, out, _ = run(capsys, "plan", prof, "--root", str(root), "--json")
    plan = json.loads(out)
    quiet = [c for c in plan["changes"] if c["report_only"]]
    assert rc == 0 and quiet and plan["report_only"] == len(quiet)
    assert {c["tuner"] for c in quiet} == {"irq"}
    changes = len(plan["changes"]) - len(quiet)

    rc, out, _ = run(capsys, "plan", prof, "--root", str(root))
    assert out.count("irq (report only)") == len(quiet)
    assert (
        f"plan shared-host: {changes} change(s) apply makes, {len(quiet)} report only "
        "(listed, never applied)"
    ) in out

    rc, out, _ = run(capsys, "apply", prof, "--root", str(root))
    assert rc == 0 and f"{len(quiet)} report only (not applied)" in out
    assert len(re.findall(r"report only irq irq \d+ .*?\(not applied\)", out)) >= 1

    rc, out, _ = run(capsys, "verify", "--root", str(root))
    assert f"{len(quiet)} report only" in out


def test_a_one_shot_plan_says_nobody_places_later_processes(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capsys, "plan", str(PROFILES / "shared-host.toml"), "--root", str(root))
    assert rc == 0
    assert "it is placed when it starts" not in out  # the old note: no daemon ran to do it
    assert (
        "one-shot: no gputuned daemon runs here; after apply nobody places the processes that "
        "start later or repairs drift unless it runs: systemctl enable --now gputuned"
    ) in out


def test_status_keeps_what_plan_refused(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = str(PROFILES / "shared-host.toml")
    _, out, _ = run(capsys, "plan", prof, "--root", str(root), "--json")
    refused = json.loads(out)["refused"]
    assert any(r["target"].startswith("irq 31") for r in refused)  # unmovable: EPERM

    assert run(capsys, "apply", prof, "--root", str(root))[0] == 0
    rc, out, _ = run(capsys, "status", "--root", str(root), "--json")
    kept = json.loads(out)["refused"]
    assert rc == 0 and [r["target"] for r in kept] == [r["target"] for r in refused]
    _, out, _ = run(capsys, "status", "--root", str(root))
    assert "refused irq irq 31 (virtio0-req.0): unmovable (EPERM)" in out


def test_verify_says_the_profile_file_changed(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "profiles"
    shutil.copytree(PROFILES, mine)
    prof = mine / "dedicated-inference.toml"
    assert run(capsys, "apply", str(prof), "--root", str(root))[0] == 0
    rc, out, _ = run(capsys, "verify", "--root", str(root), "--json")
    assert json.loads(out)["profile_file_changed"] is None

    # A copy stored by an older gputuned lacks keys added since (with defaults): no edit.
    active = root / "etc/gputuned/active.json"
    stored = json.loads(active.read_text())
    assert stored["profile"]["irq"].pop("spread") is True
    active.write_text(json.dumps(stored))
    _, out, _ = run(capsys, "verify", "--root", str(root), "--json")
    assert json.loads(out)["profile_file_changed"] is None

    prof.write_text(prof.read_text() + "\n# a comment changes nothing gputuned reads\n")
    _, out, _ = run(capsys, "verify", "--root", str(root), "--json")
    assert json.loads(out)["profile_file_changed"] is None

    # An edit of a file it includes is an edit of the profile too.
    base = mine / "shared-host.toml"
    base.write_text(base.read_text().replace("mrrs = 4096", "mrrs = 2048"))
    rc2, out, _ = run(capsys, "verify", "--root", str(root))
    assert rc2 == rc  # the host still matches the copy applied; the note says the file moved on
    assert (
        f"note the profile file {prof} changed since it was applied; verify compared the host "
        f"with the copy applied then: to use the edit, gputunectl apply {prof} --root {root}"
    ) in out

    prof.write_text("include = [")
    _, out, _ = run(capsys, "verify", "--root", str(root))
    assert f"note the profile file {prof} no longer loads" in out


def test_hints_keep_the_root(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "bootargs", "--root", str(root))
    assert rc == 3
    assert f"name one: gputunectl bootargs PROFILE --root {root}" in err  # said verify before

    prof = str(PROFILES / "latency-critical.toml")
    rc, out, _ = run(capsys, "apply", prof, "--root", str(root))
    assert rc == 0 and f"Undo with: gputunectl revert --root {root}" in out
    assert f"(gputunectl bootargs --root {root}; needs a reboot)" in out
    _, out, _ = run(capsys, "bootargs", "--root", str(root))
    assert f"(gputunectl bootargs --write-grub --root {root} writes" in out
