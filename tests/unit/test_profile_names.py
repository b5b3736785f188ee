"""Profiles by name (issue 19, item 2): the folders, includes by name, list, show, recommend."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from gputuned.engine.recommend import recommend
from gputuned.errors import ProfileError
from gputuned.profile.load import load_profile
from gputuned.store.profiledirs import ProfileDirs, shipped_dir
from tests.fakeproc import add_process, add_user
from tests.faults import tree_kernel
from tests.unit.test_apply import PROFILES, tree_copy

SHIPPED = ("dedicated-inference", "latency-critical", "shared-host")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def user_tree(tmp_path: Path, name: str = "dual-socket-8gpu") -> Path:
    """A copy of a committed tree with an empty /etc/gputuned/profiles of its own."""
    root = tree_copy(name, tmp_path)
    (root / "etc/gputuned/profiles").mkdir(parents=True)
    return root


def test_shipped_folder_is_this_checkouts_profiles() -> None:
    assert shipped_dir() == PROFILES.resolve()
    assert {p.stem for p in shipped_dir().glob("*.toml")} >= set(SHIPPED)


def test_a_user_profile_overrides_the_shipped_one_of_its_name(tmp_path: Path) -> None:
    root = user_tree(tmp_path)
    mine = root / "etc/gputuned/profiles/shared-host.toml"
    mine.write_text('name = "shared-host"\ndescription = "mine"\n')
    (root / "etc/gputuned/profiles/extra.toml").write_text('name = "extra"\n')
    (root / "etc/gputuned/profiles/not a name.toml").write_text('name = "x"\n')
    dirs = ProfileDirs.for_host(tree_kernel(root))
    assert dirs.find("shared-host") == mine
    assert dirs.find("shared-host.toml") == mine
    assert dirs.find("latency-critical") == shipped_dir() / "latency-critical.toml"
    entries = {(e.name, e.origin): e for e in dirs.entries()}
    assert entries["shared-host", "user"].overrides
    assert entries["shared-host", "shipped"].hidden
    assert not entries["latency-critical", "shipped"].hidden
    assert ("extra", "user") in entries
    assert not any(n == "not a name" for n, _ in entries)  # a file name no name can reach


def test_unknown_or_path_like_names_are_refused_with_the_choices(tmp_path: Path) -> None:
    dirs = ProfileDirs.for_host(tree_kernel(user_tree(tmp_path)))
    with pytest.raises(ProfileError) as exc:
        dirs.find("nope")
    # Every shipped name, sorted, whatever the profiles/ folder holds today.
    shipped = sorted(f.stem for f in (Path(__file__).parents[2] / "profiles").glob("*.toml"))
    assert "known profiles: " + ", ".join(shipped) in str(exc.value)
    assert "gputunectl list" in str(exc.value)
    for bad in ("../shared-host", "/etc/passwd", "a/b", ".hidden", ""):
        with pytest.raises(ProfileError, match="not a profile name"):
            dirs.find(bad)


def test_a_file_given_as_a_path_stays_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names are names, paths are paths (a ``/`` or ``.toml``): a file of the current folder
    named like a profile is never taken for it (issue 30: another user's /tmp/shared-host
    link sent root's ``plan shared-host``, run from /tmp, to a profile of their choosing)."""
    dirs = ProfileDirs.for_host(tree_kernel(user_tree(tmp_path)))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shared-host").write_text('name = "local"\n')
    (tmp_path / "mine.toml").write_text('name = "mine"\n')
    assert dirs.resolve("shared-host") == shipped_dir() / "shared-host.toml"
    assert dirs.resolve("./shared-host") == Path("./shared-host")
    assert dirs.resolve("mine.toml") == Path("mine.toml")
    assert dirs.resolve("dedicated-inference") == shipped_dir() / "dedicated-inference.toml"
    with pytest.raises(ProfileError, match=r"^missing/x\.toml does not exist \(no such file in "):
        dirs.resolve("missing/x.toml")  # a path, never a name: no profile is looked up
    with pytest.raises(ProfileError) as exc:
        dirs.resolve("shared-host.toml")  # no such file here, but a profile of that name
    assert exc.value.problems == [
        ("", f"shared-host.toml does not exist (no such file in {tmp_path}); the profile "
             "named 'shared-host' is given by its name alone, without .toml")
    ]  # fmt: skip


def test_include_by_name_extends_the_shipped_profile_of_the_same_name(tmp_path: Path) -> None:
    """/etc/gputuned/profiles/shared-host.toml includes "shared-host": the shipped one, not
    itself (TuneD's way to change a shipped profile without copying it)."""
    root = user_tree(tmp_path)
    mine = root / "etc/gputuned/profiles/shared-host.toml"
    mine.write_text('include = ["shared-host"]\nname = "shared-host"\n[cpusets.inference]\n'
                    'per = "gpu"\nexclude = ["housekeeping"]\ncount = 4\n')  # fmt: skip
    dirs = ProfileDirs.for_host(tree_kernel(root))
    mine_p = load_profile(mine, names=dirs)
    shipped = load_profile(PROFILES / "shared-host.toml")
    assert mine_p.cpusets["inference"].count == 4
    assert shipped.cpusets["inference"].count == 8
    assert mine_p.process == shipped.process  # the rest comes from the shipped one
    # and a name another user profile includes resolves to the user's
    other = root / "etc/gputuned/profiles/other.toml"
    other.write_text('include = ["shared-host"]\nname = "other"\n')
    assert load_profile(other, names=dirs).cpusets["inference"].count == 4


def test_include_by_unknown_name_names_the_include(tmp_path: Path) -> None:
    root = user_tree(tmp_path)
    p = root / "etc/gputuned/profiles/x.toml"
    p.write_text('include = ["no-such-profile"]\nname = "x"\n')
    with pytest.raises(ProfileError) as exc:
        load_profile(p, names=ProfileDirs.for_host(tree_kernel(root)))
    assert exc.value.problems[0][0] == "include[0]"
    assert "no such profile" in exc.value.problems[0][1]
    # '..' stays refused as before: a name never leaves the profile folders
    p.write_text('include = ["../shared-host.toml"]\nname = "x"\n')
    with pytest.raises(ProfileError, match=r"without '\.\.'"):
        load_profile(p, names=ProfileDirs.for_host(tree_kernel(root)))


def test_plan_and_apply_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tree_copy("h200-captured", tmp_path))
    rc, out, _ = run(capsys, "plan", "shared-host", "--root", root)
    assert rc == 0 and "Profile shared-host" in out
    rc, out, _ = run(capsys, "apply", "shared-host", "--root", root, "--json")
    assert rc == 0 and json.loads(out)["profile"] == "shared-host"
    rc, out, _ = run(capsys, "list", "--root", root, "--json")
    data = json.loads(out)
    active = [p for p in data["profiles"] if p["active"]]
    assert [p["name"] for p in active] == ["shared-host"] and active[0]["origin"] == "shipped"
    rc, out, _ = run(capsys, "list", "--root", root)
    assert rc == 0 and "* shared-host" in out and "active: shared-host (marked *)" in out
    rc, out, _ = run(capsys, "verify", "shared-host", "--root", root, "--json")
    assert json.loads(out)["counts"]["drifted"] == 0
    rc, _, err = run(capsys, "plan", "no-such", "--root", root)
    assert rc != 0 and "no such profile" in err and "shared-host" in err


def test_list_marks_user_profiles_and_one_that_does_not_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = user_tree(tmp_path)
    (root / "etc/gputuned/profiles/latency-critical.toml").write_text(
        'include = ["latency-critical"]\nname = "latency-critical"\ndescription = "ours"\n'
    )
    (root / "etc/gputuned/profiles/broken.toml").write_text("name = \n")
    rc, out, _ = run(capsys, "list", "--root", str(root), "--json")
    rows = {(p["name"], p["origin"]): p for p in json.loads(out)["profiles"]}
    assert rc == 0
    assert rows["latency-critical", "user"]["overrides_shipped"]
    assert rows["latency-critical", "user"]["description"] == "ours"
    assert rows["latency-critical", "shipped"]["hidden_by_user"]
    assert "TOML syntax error" in rows["broken", "user"]["error"]
    rc, out, _ = run(capsys, "list", "--root", str(root))
    assert "overrides the shipped one" in out and "does not load" in out


@pytest.mark.parametrize("name", SHIPPED)
def test_show_prints_toml_that_reads_back_as_the_merged_profile(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(PROFILES.parent / "tests/data/hosts/h200-captured")
    rc, out, _ = run(capsys, "show", name, "--root", root)
    assert rc == 0 and out.startswith(f"# {name}: ")
    shown = tomllib.loads(out)
    rc, js, _ = run(capsys, "show", name, "--root", root, "--json")
    data = json.loads(js)["profile"]
    data.pop("include", None)
    assert shown == data
    # what gputuned applies: the same profile as loading the file with its includes
    direct = load_profile(PROFILES / f"{name}.toml").model_dump(mode="json", exclude_unset=True)
    direct.pop("include", None)
    assert shown == direct


def test_recommend_on_the_8_gpu_two_socket_tree(capsys: pytest.CaptureFixture[str]) -> None:
    root = str(PROFILES.parent / "tests/data/hosts/dual-socket-8gpu")
    rc, out, _ = run(capsys, "recommend", "--root", root, "--json")
    rec = json.loads(out)
    assert rc == 0 and rec["recommended"] == "dedicated-inference"
    host = rec["host"]
    assert (host["gpus"], host["nodes"], host["cpus"], host["threads_per_core"]) == (8, 2, 64, 2)
    assert host["gpu_nodes"] == {"0": 4, "1": 4}
    assert any("latency-critical" in r and "reboot" in r for r in rec["reasons"])
    assert any("holds no processes" in r for r in rec["reasons"])
    rc, out, _ = run(capsys, "recommend", "--root", root)
    assert rc == 0 and out.startswith("dedicated-inference") and "next: gputunectl plan" in out


def test_recommend_leaves_room_when_other_users_work_here(tmp_path: Path) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path, server=False)
    add_user(root, "alice", 1001)
    add_process(root, 4300, comm="make", cmdline=["make", "-j64"], exe="/usr/bin/make",
                start_time=100, uid=1001)  # fmt: skip
    rec = recommend(tree_kernel(root))
    assert rec.recommended == "shared-host"
    assert any("alice (1 processes)" in r for r in rec.reasons)
    # the admin who asks is not "other work"
    assert recommend(tree_kernel(root), ignore_uids={1001}).recommended == "dedicated-inference"


def test_recommend_a_job_runner_means_a_shared_host(tmp_path: Path) -> None:
    root = tree_copy("two-gpu-one-node", tmp_path, server=False)
    add_process(root, 700, comm="kubelet", cmdline=["/usr/bin/kubelet"], exe="/usr/bin/kubelet",
                start_time=50)  # fmt: skip
    rec = recommend(tree_kernel(root))
    assert rec.recommended == "shared-host" and rec.host.job_runners == ["kubelet"]


def test_recommend_without_a_gpu_recommends_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    root = str(PROFILES.parent / "tests/data/hosts/ci-vm")
    rc, out, _ = run(capsys, "recommend", "--root", root)
    assert rc == 1 and out.startswith("no profile recommended: no inference GPU on this host")


# ---- unknown names, missing files (issue 31, item 6) ----------------------------------------------


def test_an_unknown_name_suggests_the_closest_and_is_not_called_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``shared-hots`` was "an invalid profile" with an empty ``: `` key before its message,
    and no suggestion."""
    root = str(tree_copy("h200-captured", tmp_path))
    rc, _, err = run(capsys, "plan", "shared-hots", "--root", root)
    err = " ".join(err.split())
    assert rc == 4 and "invalid" not in err and " : " not in err
    assert "gputunectl plan: no such profile: 'shared-hots' is not in" in err
    assert "did you mean shared-host?" in err and "gputunectl list" in err
    rc, out, _ = run(capsys, "plan", "shared-hots", "--root", root, "--json")
    data = json.loads(out)
    assert data["error_class"] == "ProfileNotFound" and data["exit_code"] == 4
    # Nothing close: no guess, the list.
    rc, _, err = run(capsys, "plan", "zzzz", "--root", root)
    assert rc == 4 and "did you mean" not in err and "known profiles: " in err


def test_a_missing_file_is_a_missing_file_not_a_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``nosuch.toml`` was looked up as the name ``nosuch``; ``./shared-host`` (a path, for
    it has a ``/``) reached the command as the name ``shared-host``."""
    root = str(tree_copy("h200-captured", tmp_path / "t"))
    monkeypatch.chdir(tmp_path)
    for arg in ("nosuch.toml", "./nosuch.toml", str(tmp_path / "nosuch.toml")):
        rc, _, err = run(capsys, "plan", arg, "--root", root)
        err = " ".join(err.split())
        assert rc == 4 and "does not exist" in err and "profile named" not in err, (arg, err)
        assert "invalid" not in err and " : " not in err
    (tmp_path / "shared-host").write_text('name = "local"\n[irq]\ngpu_cpus = 3\n')
    rc, _, err = run(capsys, "plan", "./shared-host", "--root", root)
    assert rc == 4 and "irq.gpu_cpus" in err  # the file, not the shipped profile


def test_a_whole_file_problem_has_no_empty_key_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("a = [\n")
    rc, _, err = run(capsys, "plan", str(bad), "--root", str(tree_copy("h200-captured", tmp_path)))
    assert rc == 4
    assert err.splitlines()[1] == "  TOML syntax error: Invalid value (at end of document)"


def test_a_user_in_an_unreadable_folder_gets_an_answer_not_an_internal_error(
    tmp_path: Path,
) -> None:
    """A non-root user whose current folder is mode 000 got exit 70, "internal error
    (PermissionError)"; as one whose /etc/gputuned is root's 0700 (gputuned makes it so)."""
    import os
    import shutil
    import site
    import subprocess
    import tempfile

    from tests.localuser import NoUser, gputuned_copy, local_user

    work = Path(tempfile.mkdtemp(prefix="gputuned-cwd-"))
    try:
        work.chmod(0o755)
        tree = tree_copy("h200-captured", work)
        (tree / "etc/gputuned").mkdir(parents=True, exist_ok=True)
        (tree / "etc/gputuned").chmod(0o700)
        lib = gputuned_copy(work)
        with local_user("gputuned-test-cwd") as user:
            closed = work / "closed"
            closed.mkdir()
            os.chown(closed, user.uid, user.gid)
            closed.chmod(0)
            env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{lib}:{site.getsitepackages()[0]}"}
            probe = user.run(user.python, "-c", "import pydantic, rich", env=env)
            if probe.returncode != 0:
                pytest.skip(f"{user.name} cannot import gputunectl's packages: {probe.stderr}")
            for args in (
                ["list"],
                ["plan", "shared-host"],
                ["plan", "nosuch.toml"],
                ["plan", "./mine.toml"],
                ["plan", str(PROFILES / "shared-host.toml")],
            ):
                done = subprocess.run(
                    user.argv(user.python, "-m", "gputuned.cli", *args, "--root", str(tree)),
                    cwd=closed, env=env, capture_output=True, text=True, timeout=120,
                    check=False,
                )  # fmt: skip
                said = done.stdout[-300:] + done.stderr
                assert done.returncode not in (70, 1) and "internal error" not in said, (args, said)
                assert "Traceback" not in said
                if args == ["list"]:  # the profiles list for anyone, as tuned-adm's do
                    assert done.returncode == 0 and "shared-host" in done.stdout, said
                    assert "active: not known to this user" in done.stdout, said
                elif done.returncode != 0:
                    assert "permission denied" in said.lower(), (args, said)
    except NoUser as exc:
        pytest.skip(str(exc))
    finally:
        for p in work.rglob("*"):
            if p.is_dir():
                p.chmod(0o755)
        shutil.rmtree(work, ignore_errors=True)
