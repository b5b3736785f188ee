"""Permissions: who may talk to the daemon, which files root may trust, and no shell anywhere.

- The daemon's control socket, served by a real ``gputuned`` process, refuses a real
  unprivileged user (``gputuned-test2``, made here if missing and removed again) even when the
  socket file's mode lets the connection through, keeps serving root afterwards, and accepts
  that user once ``[daemon] control_group`` names its group.
  (tests/integration/test_control_live.py checks the same rules on the bare ControlServer.)
- The journal, and the state files beside it, are refused when others could have written them.
- Profiles and their includes are refused, when gputuned runs as root, if another user could
  have written them (world- or group-writable, or owned by a user other than root).
- Nothing runs through a shell: no ``shell=True``, ``os.system``, ``os.popen`` or exec/spawn in
  the package, every subprocess gets an argument list, and applying a profile full of shell
  syntax starts no process at all.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gputuned
from gputuned import errors
from gputuned.daemon.core import Daemon
from gputuned.engine.apply import apply_profile, read_state, revert_all
from gputuned.engine.plan import plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.errors import ProfileError
from gputuned.profile.load import load_profile, parse_profile
from gputuned.service.control import request
from gputuned.store.state import ACTIVE, JOURNAL, STATE
from tests.faults import tree_kernel
from tests.localuser import LocalUser
from tests.reliability.conftest import USER, cli, daemon
from tests.unit.test_apply import PROFILES, SERVER_PID, digest, tree_copy

PACKAGE = Path(gputuned.__file__).parent

# -- the control socket, with a real unprivileged user ----------------------------------------

# Runs as the test user with the system's Python and only its standard library.
CLIENT = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
out = {}
try:
    s.connect(sys.argv[1])
except OSError as exc:
    out["connect_errno"] = exc.errno
else:
    try:
        s.sendall(b'{"v": 1, "cmd": "status"}\n')
    except OSError:  # a refused peer may be answered and hung up on before it sends
        pass
    buf = b""
    while b"\n" not in buf and (chunk := s.recv(65536)):
        buf += chunk
    out["line"] = json.loads(buf.split(b"\n")[0]) if buf else None
    s.settimeout(1)
    try:
        out["closed"] = s.recv(4096) == b""
    except ConnectionResetError:
        out["closed"] = True
    except TimeoutError:
        out["closed"] = False
print(json.dumps(out))
"""


def client(user: LocalUser, sock: Path, *ids: str) -> dict[str, Any]:
    """CLIENT as ``user`` (``ids``: setpriv's group options; default its own group)."""
    out = user.python_json(CLIENT, str(sock), groups=ids, timeout=60)
    assert isinstance(out, dict)
    return out


def test_daemon_socket_refuses_unprivileged_peer(user: LocalUser, open_tree: Path) -> None:
    root = open_tree
    before = digest(root)
    prof = root.parent / "prof.toml"
    shutil.copy(PROFILES / "shared-host.toml", prof)
    sock = root / "run/gputuned/control.sock"
    with daemon(root, prof) as d:
        assert os.stat(sock).st_mode & 0o777 == 0o600
        assert client(user, sock)["connect_errno"] == 13  # EACCES: /run/gputuned is 0700
        # Let the kernel pass the user (this test only), so that SO_PEERCRED must refuse it.
        (root / "run/gputuned").chmod(0o711)
        sock.chmod(0o666)
        out = client(user, sock)
        denied = "permission denied: gputuned's control socket is for root"
        assert out["line"] == {"v": 1, "ok": False, "error": denied}, out
        assert out["closed"] is True
        st = request(tree_kernel(root), {"cmd": "status"})  # and root is still served
        assert st["ok"] and st["daemon"]["pid"] == d.pid
    _, err = d.communicate()
    assert f"uid {user.uid}" in err and "refused" in err, err[-1500:]
    assert digest(root) == before


def test_daemon_socket_accepts_the_control_group(user: LocalUser, open_tree: Path) -> None:
    root = open_tree
    prof = root.parent / "prof.toml"
    prof.write_text(
        (PROFILES / "shared-host.toml").read_text() + f'\n[daemon]\ncontrol_group = "{USER}"\n'
    )
    sock = root / "run/gputuned/control.sock"
    with daemon(root, prof):
        st = os.stat(sock)
        assert (st.st_mode & 0o777, st.st_gid) == (0o660, user.gid)
        out = client(user, sock, f"--regid={user.gid}", "--init-groups")
        assert out["line"]["ok"] is True, out
        assert out["line"]["active_profile"] == "shared-host"
        sock.chmod(0o666)  # outside the group, the peer check still refuses
        out = client(user, sock, "--regid=65534", "--clear-groups")
        assert out["line"]["ok"] is False and "permission denied" in out["line"]["error"]


# -- the journal and state files ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "commands"),
    [
        (JOURNAL, (["revert"], ["apply", "PROFILE"], ["status"])),
        (STATE, (["status"], ["verify"])),
        (ACTIVE, (["status"], ["verify"])),
    ],
)
def test_state_files_writable_by_others_are_refused(
    which: str, commands: tuple[list[str], ...], tmp_path: Path
) -> None:
    root = tree_copy("degraded-link", tmp_path)
    prof = tmp_path / "p.toml"
    shutil.copy(PROFILES / "shared-host.toml", prof)
    assert cli("apply", "--root", str(root), str(prof)).returncode == 0
    tuned = digest(root)
    f = root / which.lstrip("/")
    f.chmod(0o666)
    for args in commands:
        run = cli(*[str(prof) if a == "PROFILE" else a for a in args], "--root", str(root))
        text = " ".join(run.stderr.split())
        assert run.returncode == 3, (args, run.stdout, run.stderr)
        assert f"{which} is a link, or writable by others" in text, text
        assert "gputuned will not trust it" in text
    assert digest(root) == tuned, "a refused command writes nothing"
    f.chmod(0o600)
    assert cli("revert", "--root", str(root)).returncode == 0


def test_journal_that_is_a_link_is_refused(tmp_path: Path) -> None:
    root = tree_copy("degraded-link", tmp_path)
    apply_profile(tree_kernel(root), load_profile(PROFILES / "shared-host.toml"))
    journal = root / JOURNAL.lstrip("/")
    elsewhere = tmp_path / "elsewhere.jsonl"
    journal.rename(elsewhere)
    journal.symlink_to(elsewhere)
    with pytest.raises(errors.PermissionDenied, match="is a link"):
        revert_all(tree_kernel(root))
    journal.unlink()
    elsewhere.rename(journal)
    assert revert_all(tree_kernel(root)).failed == []


# -- profiles ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("as_root")
def test_profile_writable_by_others_is_refused(tmp_path: Path, user: LocalUser) -> None:
    root = tree_copy("degraded-link", tmp_path)
    before = digest(root)
    prof = tmp_path / "p.toml"
    shutil.copy(PROFILES / "shared-host.toml", prof)
    assert load_profile(prof).name == "shared-host"  # root's own 0644 file: trusted

    def world() -> None:
        prof.chmod(0o666)

    def group() -> None:
        os.chown(prof, 0, user.gid)
        prof.chmod(0o664)

    def owner() -> None:
        os.chown(prof, user.uid, 0)
        prof.chmod(0o644)

    cases = {
        "the file is writable by every user": world,
        f"the file is writable by group {user.gid}": group,
        f"the file is owned by uid {user.uid}, not root": owner,
    }
    for why, make in cases.items():
        make()
        with pytest.raises(ProfileError) as info:
            load_profile(prof)
        ((key, msg),) = info.value.problems
        assert key == "" and why in msg and f"chmod go-w {prof}" in msg, msg
        run = cli("apply", "--root", str(root), str(prof))
        assert run.returncode == 4 and why in " ".join(run.stderr.split()), run.stderr
        os.chown(prof, 0, 0)
        prof.chmod(0o644)
    assert digest(root) == before and not (root / "run/gputuned/journal.jsonl").exists()
    # An include is checked the same way, and named by its place.
    base = tmp_path / "base.toml"
    base.write_text('[cpusets.housekeeping]\ncpus = "0"\n')
    top = tmp_path / "top.toml"
    top.write_text('include = ["base.toml"]\nname = "t"\n')
    assert load_profile(top).name == "t"
    base.chmod(0o666)
    with pytest.raises(ProfileError) as info:
        load_profile(top)
    ((key, msg),) = info.value.problems
    assert key == "include[0]" and "writable by every user" in msg


@pytest.mark.usefixtures("as_root")
def test_daemon_reload_of_a_profile_made_world_writable_keeps_the_old_one(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = tmp_path / "p.toml"
    shutil.copy(PROFILES / "shared-host.toml", prof)
    d = Daemon(tree_kernel(root), profile_path=prof)
    d.start()
    try:
        prof.write_text(prof.read_text().replace("count = 8", "count = 6"))
        prof.chmod(0o666)
        d._on_hup(signal.SIGHUP)
        assert d.counters["reloads"] == 0, "the reload was refused"
        assert (root / "sys/fs/cgroup/gputuned.inference/cpuset.cpus").read_text() == "1-8\n"
    finally:
        d.stop()
    assert digest(root) == before


# -- no shell ---------------------------------------------------------------------------------

_FORBIDDEN = {
    ("os", "system"), ("os", "popen"), ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"), ("pty", "spawn"), ("commands", "getoutput"),
}  # fmt: skip
_SPAWNERS = {"run", "Popen", "call", "check_call", "check_output"}


def _calls() -> Iterator[tuple[str, ast.Call]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node


def test_no_shell_in_the_package(terminal: list[str]) -> None:
    bad = []
    spawns = []
    for where, call in _calls():
        f = call.func
        name = (
            (f.value.id, f.attr)
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
            else None
        )
        if name in _FORBIDDEN or (
            name and name[0] == "os" and name[1].startswith(("exec", "spawn", "posix_spawn"))
        ):
            bad.append(f"{where}: {name[0]}.{name[1]}")
        for kw in call.keywords:
            if kw.arg == "shell" and not (
                isinstance(kw.value, ast.Constant) and kw.value.value is False
            ):
                bad.append(f"{where}: shell={ast.unparse(kw.value)}")
        if name and name[0] == "subprocess" and name[1] in _SPAWNERS:
            argv = call.args[0] if call.args else None
            spawns.append(f"{where}: subprocess.{name[1]}({ast.unparse(argv) if argv else ''})")
            # An argument list (a list display, or a parameter typed list[str]); never a string.
            if isinstance(argv, ast.Constant | ast.JoinedStr | ast.BinOp) or argv is None:
                bad.append(f"{where}: subprocess.{name[1]} with a string command")
        if (
            isinstance(f, ast.Name)
            and f.id == "run_tool"  # kernel/sysinstall.py's wrapper
            and (not call.args or not isinstance(call.args[0], ast.List | ast.Name))
        ):
            bad.append(f"{where}: run_tool without an argument list")
    assert not bad, bad
    terminal.append(f"no shell: {len(spawns)} subprocess call sites, all with argument lists:")
    terminal += [f"  {s}" for s in spawns]


def test_profile_text_is_only_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile full of shell syntax is applied and reverted without starting any process."""
    marker = tmp_path / "pwned"
    payload = f"$(touch {marker}); `touch {marker}` | touch {marker} && touch {marker}"
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    spawned: list[str] = []

    def refuse(*args: object, **kw: object) -> None:
        spawned.append(repr(args)[:200])
        raise AssertionError(f"a process was started: {args!r}")

    for mod, attr in [(subprocess, "Popen"), (os, "system"), (os, "popen"), (os, "posix_spawn"),
                      (os, "posix_spawnp"), (os, "execv"), (os, "execve"), (os, "fork")]:  # fmt: skip
        monkeypatch.setattr(mod, attr, refuse)
    profile = parse_profile(
        {
            "name": f"evil {payload}",
            "description": payload,
            "cpusets": {"housekeeping": {"cpus": "0"}, "work": {"cpus": "1-2"}},
            "cpuset": {"mode": "root", "cpus": "work", "cgroup": "g;$(reboot)&&`reboot`"},
            "irq": {"others_cpus": "housekeeping", "irqbalance": "ignore"},
            "process": [
                {
                    "name": f"r {payload}",
                    # A regular expression, used with re.search only: "$(...)" is an anchor
                    # and a group here, and the alternative matches the server.
                    "match": {"cmdline": f"vllm|{payload}", "user": "inference"},
                    "cpus": "work",
                    "nice": 5,
                    "move_to_partition": True,
                }
            ],
            "bootargs": {"extra": ["quiet"]},
        },
        "evil",
    )
    plan, report = apply_profile(tree_kernel(root), profile)
    assert report.failed == [] and any("4242" in w["target"] for w in report.written)
    assert verify_plan(
        plan_profile(tree_kernel(root), profile), read_state(tree_kernel(root))
    ).exit_code in (
        0,
        2,
    )
    assert revert_all(tree_kernel(root)).failed == []
    assert digest(root) == before
    assert not marker.exists() and spawned == []
    assert SERVER_PID and plan.profile.startswith("evil")
