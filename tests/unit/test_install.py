"""install-system / uninstall-system into a temporary prefix (the real one is tested in e2e)."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cli import main as cli
from gputuned.install.system import (
    PROFILES_DIR,
    RECORD,
    RULE,
    UNIT,
    install_system,
    rewrite_exec_start,
    systemd_quote,
    uninstall_system,
)
from gputuned.kernel import sysinstall
from tests.faults import tree_kernel

REPO = Path(__file__).resolve().parents[2]
EXE = "/opt/venv/bin/gputuned"
SHIPPED_PROFILES = sorted(p.name for p in (REPO / "profiles").glob("*.toml"))


def files_under(root: Path) -> dict[str, bytes]:
    return {"/" + str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def actions(report: object) -> dict[str, str]:
    return {f.path: f.action for f in report.files}  # type: ignore[attr-defined]


def test_package_data_is_the_top_level_sources() -> None:
    """gputuned/data/* are links to profiles/, systemd/, udev/: one source, shipped in wheels."""
    assert sorted(sysinstall.package_data("profiles")) == SHIPPED_PROFILES
    assert (
        sysinstall.package_data("systemd")["gputuned.service"]
        == (REPO / "systemd/gputuned.service").read_bytes()
    )
    assert (
        sysinstall.package_data("udev")["90-gputuned.rules"]
        == (REPO / "udev/90-gputuned.rules").read_bytes()
    )


def test_install_into_prefix(tmp_path: Path) -> None:
    report = install_system(tree_kernel(tmp_path), exe=EXE)
    want = {UNIT, RULE, *(f"{PROFILES_DIR}/{n}" for n in SHIPPED_PROFILES)}
    assert actions(report) == dict.fromkeys(want, "install")
    assert set(files_under(tmp_path)) == want | {RECORD}
    unit = (tmp_path / UNIT.lstrip("/")).read_text()
    assert f"\nExecStart={EXE}\n" in unit
    assert "/usr/local/bin/gputuned" not in unit.split("ExecStart=", 1)[1].split("\n", 1)[0]
    record = json.loads((tmp_path / RECORD.lstrip("/")).read_text())
    assert record["exec_start"] == EXE
    assert {f["path"] for f in record["files"]} == want
    assert (tmp_path / UNIT.lstrip("/")).stat().st_mode & 0o777 == 0o644
    # not the running system: nothing to reload, and it says why
    assert [(s.command, s.result) for s in report.steps] == [
        ("systemctl daemon-reload", "skipped"),
        ("udevadm control --reload", "skipped"),
    ]
    assert all("not into the running system" in s.detail for s in report.steps)


def test_install_twice_changes_nothing(tmp_path: Path) -> None:
    install_system(tree_kernel(tmp_path), exe=EXE)
    before = files_under(tmp_path)
    report = install_system(tree_kernel(tmp_path), exe=EXE)
    assert set(actions(report).values()) == {"unchanged"}
    after = files_under(tmp_path)
    assert {k: v for k, v in after.items() if k != RECORD} == {
        k: v for k, v in before.items() if k != RECORD
    }


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    report = install_system(tree_kernel(tmp_path), exe=EXE, dry_run=True)
    assert set(actions(report).values()) == {"install"}
    assert files_under(tmp_path) == {}
    install_system(tree_kernel(tmp_path), exe=EXE)
    before = files_under(tmp_path)
    report = uninstall_system(tree_kernel(tmp_path), dry_run=True)
    assert set(actions(report).values()) == {"remove"}
    assert files_under(tmp_path) == before


def test_reinstall_updates_ours_and_keeps_changed(tmp_path: Path) -> None:
    install_system(tree_kernel(tmp_path), exe=EXE)
    changed = tmp_path / PROFILES_DIR.lstrip("/") / "shared-host.toml"
    changed.write_text(changed.read_text() + "# the admin's edit\n")
    report = install_system(tree_kernel(tmp_path), exe="/usr/local/bin/gputuned")  # another venv
    acts = actions(report)
    assert acts[UNIT] == "update"  # ours, unchanged since: replaced
    assert acts[f"{PROFILES_DIR}/shared-host.toml"] == "keep"
    assert changed.read_text().endswith("# the admin's edit\n")
    kept = next(f for f in report.files if f.action == "keep")
    assert "changed since gputuned installed it" in kept.detail


def test_a_file_gputuned_did_not_install_is_never_replaced(tmp_path: Path) -> None:
    mine = tmp_path / RULE.lstrip("/")
    mine.parent.mkdir(parents=True)
    mine.write_text("# the admin's own rule\n")
    report = install_system(tree_kernel(tmp_path), exe=EXE)
    assert actions(report)[RULE] == "keep"
    assert mine.read_text() == "# the admin's own rule\n"
    uninstall_system(tree_kernel(tmp_path))
    assert mine.read_text() == "# the admin's own rule\n"  # not in the record: not removed


def test_uninstall_removes_exactly_what_it_installed(tmp_path: Path) -> None:
    own = tmp_path / PROFILES_DIR.lstrip("/") / "mine.toml"
    install_system(tree_kernel(tmp_path), exe=EXE)
    own.write_text('name = "mine"\n')
    changed = tmp_path / PROFILES_DIR.lstrip("/") / "latency-critical.toml"
    changed.write_text("# rewritten\n")
    (tmp_path / RULE.lstrip("/")).unlink()
    report = uninstall_system(tree_kernel(tmp_path))
    acts = actions(report)
    assert acts[UNIT] == "remove"
    assert acts[RULE] == "gone"
    assert acts[f"{PROFILES_DIR}/latency-critical.toml"] == "keep"
    assert acts[RECORD] == "remove"
    assert set(files_under(tmp_path)) == {
        f"{PROFILES_DIR}/mine.toml",
        f"{PROFILES_DIR}/latency-critical.toml",
    }
    assert report.exit_code == 0


def test_uninstall_removes_empty_folders_and_nothing_else(tmp_path: Path) -> None:
    install_system(tree_kernel(tmp_path), exe=EXE)
    uninstall_system(tree_kernel(tmp_path))
    assert not (tmp_path / "etc/gputuned").exists()
    assert (tmp_path / "etc/systemd/system").is_dir()  # not ours to remove
    report = uninstall_system(tree_kernel(tmp_path))
    assert report.files == [] and report.steps[0].result == "skipped"


def test_files_no_longer_shipped_are_removed_on_reinstall(tmp_path: Path) -> None:
    install_system(tree_kernel(tmp_path), exe=EXE)
    old = f"{PROFILES_DIR}/retired.toml"
    (tmp_path / old.lstrip("/")).write_text("old\n")
    record_path = tmp_path / RECORD.lstrip("/")
    record = json.loads(record_path.read_text())
    import hashlib

    record["files"].append({"path": old, "sha256": hashlib.sha256(b"old\n").hexdigest()})
    record_path.write_text(json.dumps(record))
    report = install_system(tree_kernel(tmp_path), exe=EXE)
    assert actions(report)[old] == "remove"
    assert not (tmp_path / old.lstrip("/")).exists()


def test_damaged_record_changes_nothing(tmp_path: Path) -> None:
    record = tmp_path / RECORD.lstrip("/")
    record.parent.mkdir(parents=True)
    record.write_text("{not json")
    record.chmod(0o600)
    with pytest.raises(errors.GputunedError, match="is not what install-system writes"):
        uninstall_system(tree_kernel(tmp_path))
    assert files_under(tmp_path) == {RECORD: b"{not json"}


@pytest.mark.parametrize(
    ("exe", "line"),
    [
        ("/opt/venv/bin/gputuned", "ExecStart=/opt/venv/bin/gputuned"),
        ("/opt/my venv/bin/gputuned", 'ExecStart="/opt/my venv/bin/gputuned"'),
        ("/opt/100%/gputuned", "ExecStart=/opt/100%%/gputuned"),
    ],
)
def test_exec_start_rewrite(exe: str, line: str) -> None:
    unit = "[Service]\nType=notify\nExecStart=/usr/local/bin/gputuned --foreground\nX=1\n"
    out = rewrite_exec_start(unit, exe)
    assert out.splitlines()[2] == f"{line} --foreground"
    assert out.splitlines()[3] == "X=1"


def test_exec_start_must_be_one_line() -> None:
    with pytest.raises(errors.GputunedError, match="2 ExecStart= lines"):
        rewrite_exec_start("ExecStart=/a\nExecStart=/b\n", EXE)
    assert systemd_quote('a"b') == '"a\\"b"'
    with pytest.raises(errors.GputunedError, match="cannot hold"):
        systemd_quote("/opt/$HOME/bin/gputuned")


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["install-system", "--prefix", str(tmp_path), "--dry-run", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dry_run"] and data["ok"] and data["prefix"] == str(tmp_path)
    assert data["exec_start"].endswith("/gputuned")
    assert cli.main(["install-system", "--prefix", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "install " in out and "next: systemctl enable --now gputuned.service" in out
    assert cli.main(["uninstall-system", "--prefix", str(tmp_path)]) == 0
    assert "remove " in capsys.readouterr().out


# ---- whose code root's unit runs (issue 30, item 4) ---------------------------------------------


@pytest.fixture
def owner() -> Iterator[pwd.struct_passwd]:
    """A real unprivileged account (made for the test, removed again) to own a tree."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a tree of another user's, and root's check of it")
    from tests.users import system_user

    with system_user("gputuned-test-venv") as pw:
        yield pw


def fake_venv(base: Path) -> str:
    """A venv as install-system looks at it: bin/gputuned, whose #! names bin/python."""
    bin_ = base / "venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text("#!/bin/sh\n")
    (bin_ / "gputuned").write_text(f"#!{bin_}/python\nimport sys\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    for d in (base, base / "venv", bin_):
        d.chmod(0o755)
    return str(bin_ / "gputuned")


def chown_tree(top: Path, uid: int, gid: int) -> None:
    for p in [top, *top.rglob("*")]:
        os.lchown(p, uid, gid)


def install_json(
    capsys: pytest.CaptureFixture[str], prefix: Path, *extra: str
) -> tuple[int, dict[str, object]]:
    rc = cli.main(["install-system", "--prefix", str(prefix), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("part", ["venv", "interpreter", "package"])
def test_a_venv_another_user_owns_is_refused(
    tmp_path: Path,
    owner: pwd.struct_passwd,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    part: str,
) -> None:
    """Root's unit ran the gputuned beside the running Python whoever owned it: a venv of
    another user's (README's clone plus .venv, in their home) gave root a unit running their
    files, exit 0. Now their venv, a link on the way to the interpreter through a folder of
    theirs, or the gputuned package imported from a clone of theirs (an editable install) is
    refused, with --dry-run too, and nothing is written."""
    exe = fake_venv(tmp_path / "home")
    top = tmp_path / "home" / "venv"
    if part == "interpreter":  # bin/python links to a file in a folder of theirs
        top = tmp_path / "theirs"
        top.mkdir()
        (top / "python3").write_text("#!/bin/sh\n")
        (top / "python3").chmod(0o755)
        link = tmp_path / "home" / "venv" / "bin" / "python"
        link.unlink()
        link.symlink_to(top / "python3")
    if part == "package":  # an editable install: the package is their clone's
        top = tmp_path / "clone"
        (top / "gputuned").mkdir(parents=True)
        monkeypatch.setattr(sysinstall, "package_folders", lambda: [str(top / "gputuned")])
    chown_tree(top, owner.pw_uid, owner.pw_gid)
    monkeypatch.setattr(sysinstall, "entry_point", lambda name: exe)
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    for extra in (["--dry-run"], []):
        rc, out = install_json(capsys, prefix, *extra)
        assert rc == 4 and out["error_class"] == "UnsafeInstall", out
        text = str(out["error"])
        assert f"is owned by uid {owner.pw_uid}, not root" in text, text
        assert str(top) in text and exe in text, text
        assert "python3 -m venv /opt/gputuned" in text, text
    assert files_under(prefix) == {}


def test_a_group_writable_folder_above_is_refused(
    tmp_path: Path,
    owner: pwd.struct_passwd,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Root's own tree, but a folder above it that the owner's group may write: they can put
    another venv in its place."""
    base = tmp_path / "opt"
    exe = fake_venv(base)
    os.chown(base, 0, owner.pw_gid)
    base.chmod(0o775)
    monkeypatch.setattr(sysinstall, "entry_point", lambda name: exe)
    prefix = tmp_path / "prefix"
    rc, out = install_json(capsys, prefix)
    assert rc == 4 and f"the folder {base} is writable by others" in str(out["error"]), out
    assert not prefix.exists() or files_under(prefix) == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="a tree only root may change needs root")
def test_a_root_owned_tree_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Root's tree, a link through root's folders to root's interpreter, in a sticky folder
    (as /tmp) holding only root's entry: installed, ExecStart naming it."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    exe = fake_venv(sticky / "opt")
    real = tmp_path / "usr-bin"
    real.mkdir()
    (real / "python3.11").write_text("#!/bin/sh\n")
    (real / "python3.11").chmod(0o755)
    link = sticky / "opt" / "venv" / "bin" / "python"
    link.unlink()
    link.symlink_to(real / "python3.11")
    monkeypatch.setattr(sysinstall, "entry_point", lambda name: exe)
    rc, out = install_json(capsys, tmp_path / "prefix")
    assert rc == 0 and out["exec_start"] == exe, out
    assert f"\nExecStart={exe}\n" in (tmp_path / "prefix" / UNIT.lstrip("/")).read_text()


@pytest.mark.parametrize(
    ("script", "program"),
    [
        ("#!/opt/g/bin/python3\n", ["/opt/g/bin/python3"]),
        ("#! /opt/g/bin/python3 -E\n", ["/opt/g/bin/python3"]),
        # pip's form for a path too long for #! or with a space (distlib's _build_shebang)
        (
            "#!/bin/sh\n'''exec' \"/opt/my g/bin/python3\" \"$0\" \"$@\"\n' '''\n",
            ["/bin/sh", "/opt/my g/bin/python3"],
        ),
        ("#!/usr/bin/env python3\n", ["/usr/bin/env", "python3"]),
        ("\x7fELF", []),
    ],
)
def test_the_interpreter_a_script_names(tmp_path: Path, script: str, program: list[str]) -> None:
    exe = tmp_path / "gputuned"
    exe.write_bytes(script.encode())
    got = sysinstall.interpreter_of(str(exe))
    if program[-1:] == ["python3"]:  # env: found on the PATH systemd gives a service
        assert got[0] == "/usr/bin/env" and (len(got) == 1 or got[1].endswith("/python3"))
    else:
        assert got == program
