"""The daemon against hostile input and a hostile environment (issue 14, findings 2, 4, 7, 11).

Set up first, apply last: a daemon that cannot set up its socket, group or listener writes
nothing; a start that fails after writing puts everything back; no profile, request or signal
handler error ends it. Against trees, in-process; signals are delivered for real.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.daemon.core import Daemon
from gputuned.engine.apply import apply_profile
from gputuned.engine.plan import plan_profile
from gputuned.profile.load import load_profile, parse_profile
from gputuned.service.control import PeerCred
from gputuned.service.loop import Loop
from tests.faults import tree_kernel
from tests.unit.conftest import Events
from tests.unit.test_apply import digest, tree_copy
from tests.unit.test_daemon import profile_file, sent

ROOT_PEER = PeerCred(1, 0, 0)
MISSING = "no-such-group-gputuned"


def with_daemon_table(prof: Path, table: str) -> Path:
    prof.write_text(prof.read_text() + f"\n[daemon]\n{table}\n")
    return prof


# -- set up first, apply last (findings 2 and 4) ----------------------------------------------


def test_metrics_port_in_a_sandbox_without_ip_does_not_end_the_daemon(
    tmp_path: Path,
    events: Events,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Finding 2: RestrictAddressFamilies=AF_UNIX AF_NETLINK makes socket(AF_INET) fail;
    the OSError was raised outside the try, after the apply, and ended the daemon."""
    real = socket.socket

    def restricted(family: int = socket.AF_INET, *a: Any, **kw: Any) -> socket.socket:
        if family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))
        return real(family, *a, **kw)

    monkeypatch.setattr(socket, "socket", restricted)
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    d = Daemon(
        tree_kernel(root),
        profile_path=with_daemon_table(profile_file(tmp_path), "metrics_port = 9466"),
    )
    d.start()
    assert d.metrics is None and d.control is not None
    status = d.requests.handle({"cmd": "status"}, ROOT_PEER)
    assert any("metrics off" in n and "EAFNOSUPPORT" in n for n in status["notes"]), status
    from gputuned.cli.render import render_status

    render_status(status)  # says so on the terminal too
    assert "metrics off" in capsys.readouterr().out
    assert d.stop() == 0
    assert digest(root) == before


def test_a_control_group_that_does_not_exist_stops_the_start_before_any_write(
    tmp_path: Path, events: Events
) -> None:
    """Finding 4: the daemon applied the profile, then failed on the group, and left the host
    tuned."""
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = with_daemon_table(profile_file(tmp_path), f'control_group = "{MISSING}"')
    d = Daemon(tree_kernel(root), profile_path=prof)
    with pytest.raises(errors.InvalidValue, match=f"control_group '{MISSING}' does not exist"):
        d.start()
    assert not [e for e in events if e[0] == "write"] and digest(root) == before
    d2 = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))  # the lock was let go
    d2.start()
    d2.stop()


def test_plan_refuses_a_control_group_that_does_not_exist(tmp_path: Path) -> None:
    root = tree_copy("h200-captured", tmp_path)
    prof = load_profile(with_daemon_table(profile_file(tmp_path), f'admin_group = "{MISSING}"'))
    with pytest.raises(errors.PlanError, match=f"daemon admin_group: group '{MISSING}'"):
        plan_profile(tree_kernel(root), prof)
    plan = plan_profile(tree_kernel(root), prof, allow_blocked=True)
    assert [r.target for r in plan.blocked] == ["admin_group"]


def test_without_cap_chown_the_start_fails_before_any_write(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_cap_chown(*_a: Any, **_k: Any) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr("gputuned.service.control.os.chown", no_cap_chown)
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = with_daemon_table(profile_file(tmp_path), 'control_group = "root"')
    with pytest.raises(errors.PermissionDenied, match="needs CAP_CHOWN"):
        Daemon(tree_kernel(root), profile_path=prof).start()
    assert digest(root) == before


def test_a_failed_start_puts_back_a_journal_it_adopted(tmp_path: Path, events: Events) -> None:
    """A killed daemon left the host tuned; a successor that cannot start must not leave it
    so with nobody to revert it."""
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path)
    apply_profile(tree_kernel(root), load_profile(prof), source=str(prof), reload_path=str(prof))
    assert digest(root) != before
    bad = tmp_path / "bad.toml"
    bad.write_text(prof.read_text() + f'\n[daemon]\ncontrol_group = "{MISSING}"\n')
    with pytest.raises(errors.InvalidValue):
        Daemon(tree_kernel(root), profile_path=bad).start()
    assert digest(root) == before


# -- no error ends the daemon (findings 1 and 11) ---------------------------------------------


def test_a_deeply_nested_profile_is_a_profile_error(tmp_path: Path) -> None:
    """Finding 11: tomllib raised RecursionError, which nothing caught."""
    deep = tmp_path / "deep.toml"
    deep.write_text('name = "x"\ndescription = ' + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(errors.ProfileError, match="nest deeper than"):
        load_profile(deep)
    with pytest.raises(errors.ProfileError, match="nest deeper than"):
        parse_profile({"name": "x", "cpusets": _nested(5000)}, "sent")


def _nested(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"a": out}
    return out


def test_any_error_in_a_reload_keeps_the_profile_and_the_daemon(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    applied = digest(root)

    def broken(*_a: Any, **_k: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("gputuned.daemon.keeper.load_profile", broken)
    os.kill(os.getpid(), signal.SIGHUP)
    d.loop.run_once(1.0)
    assert d.running and d.profile is not None and d.profile.name == "shared-host"
    assert ("notify", "READY=1") in events and digest(root) == applied
    d.stop()


def test_a_profile_file_that_breaks_at_restart_falls_back_to_the_copy(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 11: the fallback caught only ProfileError, and the service crash-looped."""
    root = tree_copy("h200-captured", tmp_path)
    before = digest(root)
    prof = profile_file(tmp_path)
    apply_profile(tree_kernel(root), load_profile(prof), source=str(prof), reload_path=str(prof))

    def broken(*_a: Any, **_k: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("gputuned.daemon.keeper.load_profile", broken)
    d = Daemon(tree_kernel(root))
    d.start()
    assert d.profile is not None and d.profile.name == "shared-host"
    d.stop()
    assert digest(root) == before


def test_a_handler_that_raises_does_not_end_the_loop() -> None:
    loop = Loop()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    seen: list[str] = []

    def bad(_fd: int) -> None:
        seen.append("bad")
        raise RuntimeError("boom")

    try:
        loop.add_reader(r1, bad)
        loop.add_reader(r2, lambda _fd: seen.append("good"), priority=-1)
        os.write(w1, b"x")
        os.write(w2, b"x")
        loop.run_once(1.0)
        assert seen == ["good", "bad"], "priority order, and the loop went on after bad"
    finally:
        loop.close()
        for fd in (r1, w1, r2, w2):
            os.close(fd)


# -- what control clients send (finding 7) ----------------------------------------------------


def test_apply_by_path_is_refused_without_reading_the_file(tmp_path: Path, events: Events) -> None:
    """Finding 7: the daemon opened the path a control client named, as root, and quoted
    what it found in the error."""
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    secret = tmp_path / "secret.toml"
    secret.write_text('name = "x"\n[irq]\nspread = "SECRET-1234"\n')
    secret.chmod(0o600)
    with pytest.raises(errors.GputunedError) as exc:
        d.requests.handle({"cmd": "apply", "profile": str(secret)}, ROOT_PEER)
    assert "opens no file a client names" in str(exc.value)
    assert "SECRET" not in str(exc.value)
    assert d.profile is not None and d.profile.name == "shared-host"
    d.stop()


@pytest.mark.parametrize(
    ("req", "message"),
    [
        ({"cmd": "register", "pid": "1"}, "pid must be a positive integer"),
        ({"cmd": "register", "pid": 10**30, "start": 1}, "there is no process"),
        ({"cmd": "register", "pid": True}, "pid must be a positive integer"),
        ({"cmd": "unregister", "pid": -1}, "pid must be a positive integer"),
        ({"cmd": "verify", "strict": "yes"}, '"strict" must be true or false'),
        ({"cmd": "apply"}, 'apply needs "profile"'),
        ({"cmd": "apply", "name": "../../etc/shadow"}, "not a profile name"),
        ({"cmd": "apply", "profile": {"name": "x", "irq": {"spread": 1}}}, "irq.spread"),
        ({"cmd": "\x1b]0;pwned\x07"}, "unknown command '\\x1b]0;pwned\\x07'"),
    ],
)
def test_request_fields_are_checked(
    tmp_path: Path, events: Events, req: dict[str, Any], message: str
) -> None:
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    applied = digest(root)
    with pytest.raises(errors.GputunedError, match=re.escape(message)):
        d.requests.handle(req, ROOT_PEER)
    assert digest(root) == applied and d.profile is not None and d.profile.name == "shared-host"
    d.stop()


def test_a_profile_sent_over_the_socket_is_reloaded_from_its_copy(
    tmp_path: Path, events: Events
) -> None:
    """SIGHUP re-reads what root named (here --profile), but a profile a client sent is
    re-applied from the copy the daemon stored, whatever the file it came from says now."""
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path, count=4))
    d.start()
    other = profile_file(tmp_path, count=6)
    resp = d.requests.handle(
        {"cmd": "apply", "profile": sent(other), "source": str(other)}, ROOT_PEER
    )
    assert resp["failed"] == []
    cpus = root / "sys/fs/cgroup/gputuned.inference/cpuset.cpus"
    assert cpus.read_text() == "1-6\n"
    other.write_text(other.read_text().replace("count = 6", "count = 2"))
    os.kill(os.getpid(), signal.SIGHUP)
    d.loop.run_once(1.0)
    assert cpus.read_text() == "1-6\n", "the stored copy, not the file"
    active = json.loads((root / "etc/gputuned/active.json").read_text())
    assert "path" not in active and "sent by uid 0" in active["source"]
    d.stop()


def test_a_members_requests_log_a_bounded_number_of_lines(
    tmp_path: Path,
    events: Events,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30, item 2: unknown commands are not logged; a member's known ones at most 20 a
    window (service/peerlog.py), whatever it sends."""
    import logging

    from gputuned.daemon import control
    from gputuned.service.control import PeerCred
    from gputuned.service.peerlog import PeerLogLimit

    monkeypatch.setattr(control, "PEER_LOG", PeerLogLimit())
    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path))
    d.start()
    member = PeerCred(4242, 1000, 1000)
    # A read is logged at debug (issue 31): the bound holds where debug lines are on.
    with caplog.at_level(logging.DEBUG, logger="gputuned"):
        for i in range(200):
            with pytest.raises(errors.GputunedError):
                d.requests.handle({"cmd": f"statusX\n<0>forged {i}"}, member)
        for _ in range(100):
            d.requests.handle({"cmd": "status"}, member)
    assert "forged" not in caplog.text
    assert caplog.text.count("daemon: control: status from pid 4242") == 20
    d.stop()
