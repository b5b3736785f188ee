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
