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
from gputuned.store.userfiles import write_user_file_atomic

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
    from gputuned.kernel.capture import capture
    from tests.conftest import TREES_DIR
    from tests.faults import tree_kernel

    capture(tree_kernel(TREES_DIR / "ci-vm"), dest)


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
    from gputuned.kernel.capture import _Writer

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


# -- finding 12: profiles and their includes --------------------------------------------------


@pytest.mark.parametrize("name", ["/etc/passwd", "../up.toml", "sub/../../up.toml", ""])
def test_an_include_outside_the_profiles_folder_is_refused(tmp_path: Path, name: str) -> None:
    from gputuned.profile.load import load_profile

    (tmp_path / "up.toml").write_text('[cpusets.housekeeping]\ncpus = "0"\n')
    here = tmp_path / "profiles"
    here.mkdir()
    top = here / "top.toml"
    top.write_text(f'include = ["{name}"]\nname = "t"\n')
    with pytest.raises(errors.ProfileError) as info:
        load_profile(top)
    ((key, msg),) = info.value.problems
    assert key == "include[0]" and "without '..'" in msg, msg


def test_an_include_below_the_profiles_folder_is_fine(tmp_path: Path) -> None:
    from gputuned.profile.load import load_profile

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "cpus.toml").write_text('[cpusets.housekeeping]\ncpus = "0"\n')
    top = tmp_path / "top.toml"
    top.write_text('include = ["base/cpus.toml"]\nname = "t"\n')
    assert load_profile(top).cpusets["housekeeping"].cpus == "0"


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder of another user needs root to make")
@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda d: os.chown(d, 65534, 65534), "is owned by uid 65534, not root"),
        (lambda d: d.chmod(0o777), "is writable by others"),
        (lambda d: d.chmod(0o775) or os.chown(d, 0, 65534), "is writable by others"),
    ],
    ids=["other-owner", "world-writable", "group-writable"],
)
def test_a_root_file_in_a_folder_others_control_is_refused(
    tmp_path: Path, make: object, why: str
) -> None:
    """Root's own 0644 file, but in a folder another user may write or owns: they can put
    another file in its place. Only the file itself was checked."""
    from gputuned.profile.load import load_profile

    folder = tmp_path / "shared"
    folder.mkdir()
    prof = folder / "p.toml"
    prof.write_text('name = "t"\n')
    assert load_profile(prof).name == "t"
    make(folder)  # type: ignore[operator]
    with pytest.raises(errors.ProfileError) as info:
        load_profile(prof)
    ((_key, msg),) = info.value.problems
    assert f"the folder {folder} {why}" in msg and "/etc/gputuned" in msg, msg
    (folder / "deeper").mkdir()
    sub = folder / "deeper" / "q.toml"
    sub.write_text('name = "q"\n')
    os.chown(folder / "deeper", 0, 0)
    (folder / "deeper").chmod(0o755)
    with pytest.raises(errors.ProfileError, match=f"the folder {folder} "):
        load_profile(sub)  # any folder up to /, not only the nearest


@pytest.mark.skipif(os.geteuid() != 0, reason="the check applies to root")
def test_a_link_another_user_made_is_refused_even_to_roots_own_file(tmp_path: Path) -> None:
    """Issue 30, item 6: the path as given is checked as well as its target. Another user's
    link in a sticky folder (as in /tmp) to a profile of root's, shipped or not, is refused;
    root's own link there is fine."""
    from gputuned.profile.load import load_profile

    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    target = tmp_path / "p.toml"
    target.write_text('name = "roots"\n')
    theirs = sticky / "shared-host.toml"
    theirs.symlink_to(target)
    os.lchown(theirs, 1000, 1000)
    with pytest.raises(errors.ProfileError) as info:
        load_profile(theirs)
    ((_key, msg),) = info.value.problems
    assert f"the link {theirs} is owned by uid 1000, not root" in msg, msg
    mine = sticky / "mine.toml"
    mine.symlink_to(target)
    assert load_profile(mine).name == "roots"


@pytest.mark.skipif(os.geteuid() != 0, reason="the check applies to root")
def test_a_root_file_in_a_sticky_folder_is_fine(tmp_path: Path) -> None:
    from gputuned.profile.load import load_profile

    folder = tmp_path / "sticky"
    folder.mkdir()
    folder.chmod(0o1777)
    prof = folder / "p.toml"
    prof.write_text('name = "t"\n')
    assert load_profile(prof).name == "t"


# -- finding 17: --root ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["relative", "missing", "not-a-tree", "a-file"])
def test_a_root_that_is_not_a_tree_is_refused_and_not_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    from gputuned.cli import main as cli
    from tests.unit.test_apply import PROFILES

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("")
    root = {
        "relative": "trees/h200",
        "missing": str(tmp_path / "h200-captred"),
        "not-a-tree": str(tmp_path / "empty"),
        "a-file": str(tmp_path / "file"),
    }[kind]
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    rc = cli.main(["apply", str(PROFILES / "shared-host.toml"), "--root", root])
    assert rc == 64  # a usage error (issue 19): 2 is verify's "pending reboot"
    assert "--root" in capsys.readouterr().err
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before, "nothing made"


@pytest.mark.skipif(os.geteuid() != 0, reason="the check applies to root")
def test_every_link_on_the_way_counts(
    tmp_path: Path,
) -> None:
    """Issue 30, item 4 (one walk for profiles and install-system): a link that a link points
    to, in a folder of another user's, was not looked at (only the path as given and the
    final file's folders were). A folder reached through root's link stays fine (the walk
    judges a link by its owner, not by its mode, which is always 0777)."""
    from gputuned.profile.load import load_profile

    real = tmp_path / "real"
    real.mkdir()
    (real / "p.toml").write_text('name = "roots"\n')
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "hop.toml").symlink_to(real / "p.toml")
    os.chown(theirs, 65534, 65534)
    first = tmp_path / "first.toml"
    first.symlink_to(theirs / "hop.toml")
    with pytest.raises(errors.ProfileError, match=f"the folder {theirs} is owned by uid 65534"):
        load_profile(first)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "gputuned").symlink_to(real)
    assert load_profile(tmp_path / "etc" / "gputuned" / "p.toml").name == "roots"
