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
    assert len(re.findall(r"report only irq \d+ .*?\(not applied\)", out)) >= 1

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
    assert "refused irq 31 (virtio0-req.0): unmovable (EPERM)" in out


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


# ---- options where users put them; relative paths (issue 31, items 4 and 5) ----------------------


def test_v_and_json_work_before_and_after_the_command(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-v`` worked only before the command, ``--json`` only after it."""
    prof = str(PROFILES / "dedicated-inference.toml")
    assert run(capsys, "apply", prof, "--root", str(root))[0] == 0
    quiet = run(capsys, "verify", "--root", str(root))
    assert quiet[0] == 2 and " passed " not in quiet[1]  # 2: its boot arguments are pending
    for args in (["-v", "verify"], ["verify", "-v"], ["verify", "--verbose"]):
        rc, out, err = run(capsys, *args, "--root", str(root))
        assert (rc, err) == (2, "") and " passed " in out, args
    for args in (["--json", "list"], ["list", "--json"], ["--json", "plan", prof]):
        rc, out, err = run(capsys, *args, "--root", str(root))
        assert rc == 0 and err == "" and out.startswith("{"), args
    # Every command takes it (schema prints JSON either way).
    assert run(capsys, "--json", "schema")[0] == run(capsys, "schema", "--json")[0] == 0
    # The help shows them where they work: before the command, and in each command's usage.
    top = cli.build_parser().format_help()
    assert "[-v] [--json] COMMAND" in top
    for name, sub in cli._commands(cli.build_parser()).items():
        usage = sub.format_usage()
        assert "[-v]" in usage, name
        assert "[--json]" in usage, name


def test_verify_help_says_v_shows_the_settings_that_hold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["verify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "-v, --verbose also list the settings that passed" in text


def test_an_internal_error_says_where_v_goes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(_args: object) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(cli, "cmd_schema", broken)
    assert cli.main(["schema"]) == 70
    err = " ".join(capsys.readouterr().err.split())
    assert "run it again with -v (gputunectl -v schema) and report the traceback" in err


def test_a_relative_root_is_the_tree_under_the_current_folder(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/multi-gpu.md runs ``--root tree``; it was refused ("give the tree's absolute
    path")."""
    monkeypatch.chdir(root.parent)
    rc, out, err = run(capsys, "plan", "shared-host", "--root", root.name)
    assert (rc, err) == (0, "") and "Profile shared-host" in out
    rc, _, err = run(capsys, "plan", "shared-host", "--root", "no-such-tree")
    assert rc == 64 and f"no-such-tree ({root.parent / 'no-such-tree'}) is not a folder" in err
