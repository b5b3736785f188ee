"""Files root writes or reads where other users can reach: the --prometheus target, capture's
folder, profile includes (issue 14, findings 8, 9 and 12).

The planted links here are made by the test itself in folders it owns; the same attacks by a
real unprivileged user are in tests/reliability/test_local_users.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.host.userfiles import write_user_file_atomic

# -- finding 8: verify --prometheus FILE ----------------------------------------------------


def test_prometheus_file_does_not_follow_a_planted_temporary_link(tmp_path: Path) -> None:
    """The temporary name was predictable (.NAME.PID.tmp) and opened with O_TRUNC following
    links: whoever could write the folder made root overwrite any file."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    target = tmp_path / "textfile" / "gputuned.prom"
    target.parent.mkdir()
    for pid in range(os.getpid() - 5, os.getpid() + 6):  # the old name, and its neighbours
        (target.parent / f".gputuned.prom.{pid}.tmp").symlink_to(victim)
    write_user_file_atomic(target, b"gputuned_up 1\n")
    assert victim.read_text() == "precious\n"
    assert target.read_bytes() == b"gputuned_up 1\n" and not target.is_symlink()
    assert target.stat().st_mode & 0o777 == 0o644  # node_exporter reads it as its own user
    leftovers = {p.name for p in target.parent.iterdir()} - {target.name}
    assert all(n.startswith(".gputuned.prom.") and n.endswith(".tmp") for n in leftovers)
    assert len(leftovers) == 11, "only the planted links; no temporary file left"


def test_prometheus_file_replaces_a_link_at_the_target_not_what_it_points_to(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    target = tmp_path / "gputuned.prom"
    target.symlink_to(victim)
    write_user_file_atomic(target, b"x 1\n")
    assert victim.read_text() == "precious\n" and not target.is_symlink()


def test_prometheus_file_in_a_missing_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(errors.GputunedError, match="cannot write"):
        write_user_file_atomic(tmp_path / "nope" / "x.prom", b"x 1\n")


# -- finding 9: capture DIR -------------------------------------------------------------------


def _capture(dest: Path) -> None:
    from gputuned.host import Host
    from gputuned.host.capture import capture
    from tests.conftest import TREES_DIR

    capture(Host(TREES_DIR / "ci-vm"), dest)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_capture_refuses_a_folder_another_user_owns(tmp_path: Path) -> None:
    dest = tmp_path / "theirs"
    dest.mkdir()
    os.chown(dest, 65534, 65534)
    with pytest.raises(errors.GputunedError, match="owned by uid 65534"):
        _capture(dest)
    assert list(dest.iterdir()) == []


def test_capture_refuses_a_folder_others_may_write(tmp_path: Path) -> None:
    dest = tmp_path / "open"
    dest.mkdir()
    dest.chmod(0o777)
    with pytest.raises(errors.GputunedError, match="writable by others"):
        _capture(dest)
    assert list(dest.iterdir()) == []


def test_capture_does_not_follow_a_link_at_the_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "cap"
    dest.symlink_to(elsewhere)
    with pytest.raises(errors.GputunedError, match="is a symbolic link"):
        _capture(dest)
    assert list(elsewhere.iterdir()) == []


def test_capture_writes_under_the_folder_it_opened(tmp_path: Path) -> None:
    """Even when the folder is swapped for a link once the capture has it open, every file
    lands in the folder opened (each component opened with O_NOFOLLOW below it)."""
    from gputuned.host.capture import _Writer

    dest = tmp_path / "cap"
    dest.mkdir(mode=0o700)
    w = _Writer.open(dest)
    try:
        dest.rename(tmp_path / "moved")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        dest.symlink_to(elsewhere)
        w.put("/sys/a/b", b"x")
        w.link("/sys/bus/l", "../a")
    finally:
        w.close()
    assert (tmp_path / "moved/sys/a/b").read_bytes() == b"x"
    assert os.readlink(tmp_path / "moved/sys/bus/l") == "../a"
    assert list(elsewhere.iterdir()) == []
