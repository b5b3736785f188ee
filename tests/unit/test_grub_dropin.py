"""``bootargs --write-grub`` is put back by ``gputunectl revert``, after a reboot too (issue 19,
item 5): the drop-in is recorded under /etc/gputuned, not in the journal in /run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from gputuned.engine.apply import revert_all
from gputuned.sim.tree import SimKernel
from tests.unit.test_apply import PROFILES, tree_copy

PROFILE = str(PROFILES / "latency-critical.toml")  # wants nohz_full, rcu_nocbs, irqaffinity


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = cli.main(list(args))
    return rc, " ".join(capsys.readouterr().out.split())


def reboot(root: Path) -> None:
    """What a reboot does to gputuned's state: /run is gone."""
    shutil.rmtree(root / "run/gputuned", ignore_errors=True)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tree_copy("h200-captured", tmp_path)


def dropin(root: Path) -> Path:
    return root / "etc/default/grub.d/gputuned.cfg"


def record(root: Path) -> Path:
    return root / "etc/gputuned/grub-dropin.json"


def test_revert_after_a_reboot_removes_the_dropin(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "bootargs", PROFILE, "--root", str(root), "--write-grub")[0] == 0
    assert "nohz_full=2-15" in dropin(root).read_text() and record(root).exists()
    reboot(root)
    rc, out = run(capsys, "status", "--root", str(root))
    assert (
        "Boot: /etc/default/grub.d/gputuned.cfg holds the kernel arguments" in out
    )  # the journal went with /run; before, revert then found nothing to remove
    rc, out = run(capsys, "revert", "--root", str(root))
    assert rc == 0 and not dropin(root).exists() and not record(root).exists()
    assert (
        "put back /etc/default/grub.d/gputuned.cfg as it was before gputunectl bootargs "
        "--write-grub; run update-grub"
    ) in out
    assert (
        run(capsys, "revert", "--root", str(root))[1]
        == "Nothing to revert: the journal is empty and no profile is active."
    )


def test_a_dropin_that_was_there_before_comes_back(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dropin(root).parent.mkdir(parents=True, exist_ok=True)
    dropin(root).write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    for _ in range(2):  # a second write keeps the first original
        assert run(capsys, "bootargs", PROFILE, "--root", str(root), "--write-grub")[0] == 0
    reboot(root)
    assert run(capsys, "revert", "--root", str(root))[0] == 0
    assert dropin(root).read_text() == 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'


def test_an_edited_dropin_is_left_and_said(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "bootargs", PROFILE, "--root", str(root), "--write-grub")[0] == 0
    dropin(root).write_text(dropin(root).read_text() + "# mine\n")
    rc, out = run(capsys, "revert", "--root", str(root))
    assert rc == 0 and dropin(root).read_text().endswith("# mine\n")
    assert "changed since gputunectl bootargs --write-grub wrote it, so it was left" in out
    assert not record(root).exists()


def test_a_stopping_daemon_leaves_the_dropin_for_the_next_boot(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "apply", PROFILE, "--root", str(root))[0] == 0
    assert run(capsys, "bootargs", "--root", str(root), "--write-grub")[0] == 0
    # The daemon's revert at stop (shutdown) is not a revert the user asked for.
    rep = revert_all(SimKernel(root), forget_profile=False)
    assert not rep.failed and dropin(root).exists() and record(root).exists()
    assert run(capsys, "revert", "--root", str(root))[0] == 0
    assert not dropin(root).exists()


def test_a_damaged_record_is_refused_with_what_to_do(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "bootargs", PROFILE, "--root", str(root), "--write-grub")[0] == 0
    record(root).write_text('{"old": 3}')
    rc = cli.main(["revert", "--root", str(root)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 3 and "grub-dropin.json is damaged" in err and dropin(root).exists()
