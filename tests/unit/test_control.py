"""The control socket against a server in a tmp tree: protocol, limits, peers, start and stop.

The server runs as the test does (root in CI), so every peer here is allowed; refusals of real
unprivileged users are in tests/integration/test_control_live.py. Each server is driven either
by a select loop in a thread, as the daemon drives it, or step by step for the timing tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gputuned import errors
from gputuned.service.control import (
    CONTROL_SOCKET,
    IDLE_TIMEOUT_S,
    MAX_CLIENTS,
    MAX_LINE,
    PER_USER,
    ROOT_RESERVED,
    ControlServer,
    PeerCred,
    daemon_running,
    peer_allowed,
    proc_groups,
    request,
)
from gputuned.service.controlproto import COMMANDS
from tests.faults import FaultKernel, tree_kernel


def echo(req: dict[str, Any], cred: PeerCred) -> dict[str, Any]:
    if req["cmd"] == "fail":
        raise errors.Busy("the engine is busy; retry in a moment")
    if req["cmd"] == "crash":
        raise ValueError("boom")
    if req["cmd"] == "unjsonable":
        return {"x": {1, 2}}
    if req["cmd"] == "whoami":
        return dataclasses.asdict(cred)
    return {"echo": req}


class Loop:
    """Serves ``server`` from a thread the way the daemon does: select, on_readable/on_writable,
    serve, expire."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            fds = [self.server.fileno(), *self.server.client_fds()]
            timeout = 0.0 if self.server.pending() else 0.01
            readable, writable, _ = select.select(fds, self.server.writing_fds(), [], timeout)
            for fd in writable:
                self.server.on_writable(fd)
            for fd in readable:
                self.server.on_readable(fd)
            self.server.serve()
            self.server.expire(time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive()


class Conn:
    """A raw client: send bytes, read response lines (None at EOF)."""

    def __init__(self, real: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        fd = os.open(real.parent, os.O_PATH | os.O_DIRECTORY)  # sun_path is 108 bytes at most
        try:
            self.sock.connect(f"/proc/self/fd/{fd}/{real.name}")
        finally:
            os.close(fd)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> dict[str, Any] | None:
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        resp = json.loads(line)
        assert isinstance(resp, dict)
        return resp

    def close(self) -> None:
        self.sock.close()


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def host(tmp_path: Path) -> FaultKernel:
    return tree_kernel(tmp_path)


@pytest.fixture
def real(host: FaultKernel) -> Path:
    return host.path(CONTROL_SOCKET)


@pytest.fixture
def served(host: FaultKernel) -> Iterator[ControlServer]:
    server = ControlServer(host, echo)
    loop = Loop(server)
    try:
        yield server
    finally:
        loop.stop()
        server.close()


# -- the protocol ---------------------------------------------------------------------------


def test_several_requests_on_one_connection(served: ControlServer, real: Path) -> None:
    c = Conn(real)
    c.send(b'{"v": 1, "cmd": "a"}\n{"v": 1, "cmd": "b", "n": 2}\n')
    c.send(b'{"v": 1, "cmd"')  # a line may arrive in pieces
    c.send(b': "c"}\n')
    assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "a"}}
    assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "b", "n": 2}}
    assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "c"}}
    c.close()


def test_client_request_round_trip(served: ControlServer, host: FaultKernel) -> None:
    resp = request(host, {"cmd": "status", "verbose": True})
    assert resp == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "status", "verbose": True}}
    assert daemon_running(host)


def test_handler_sees_the_peer_credentials(served: ControlServer, host: FaultKernel) -> None:
    resp = request(host, {"cmd": "whoami"})
    assert (resp["pid"], resp["uid"], resp["gid"]) == (os.getpid(), os.geteuid(), os.getegid())


def test_garbage_gets_an_error_and_the_connection_stays_usable(
    served: ControlServer, real: Path
) -> None:
    c = Conn(real)
    bad = [
        (b"not json", "request is not valid JSON"),
        (b"[1, 2]", "request must be a JSON object, not list"),
        (b'{"v": 1}', 'request has no "cmd"'),
        (b'{"v": 1, "cmd": ""}', 'request has no "cmd"'),
        (b'{"v": 1, "cmd": 7}', 'request has no "cmd"'),
        (b'{"cmd": "status"}', 'request has no "v"'),
        (b"\xff\xfe{}", "request is not UTF-8"),
    ]
    c.send(b"".join(line + b"\n" for line, _ in bad) + b"\n  \n" + b'{"v":1,"cmd":"ok"}\n')
    for _, message in bad:
        resp = c.line()
        assert resp is not None
        assert resp["v"] == 1
        assert resp["ok"] is False
        assert resp["error"].startswith(message), resp
    assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "ok"}}  # blank lines: no answer
    c.close()


@pytest.mark.parametrize(("v", "shown"), [(2, "2"), (0, "0"), ("1", '"1"'), (True, "true")])
def test_version_mismatch(served: ControlServer, host: FaultKernel, v: object, shown: str) -> None:
    with pytest.raises(errors.GputunedError) as err:
        request(host, {"v": v, "cmd": "status"})
    assert str(err.value) == f"unsupported protocol version {shown}; this daemon speaks 1"
    assert request(host, {"cmd": "status"})["ok"] is True


def test_last_request_without_newline_is_answered_at_eof(served: ControlServer, real: Path) -> None:
    c = Conn(real)
    c.send(b'{"v": 1, "cmd": "last"}')
    c.sock.shutdown(socket.SHUT_WR)
    assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "last"}}
    assert c.line() is None
    c.close()


# -- limits -------------------------------------------------------------------------------


def test_a_line_of_exactly_the_limit_is_served(served: ControlServer, real: Path) -> None:
    head = b'{"v": 1, "cmd": "big", "pad": "'
    line = head + b"x" * (MAX_LINE - len(head) - 2) + b'"}'
    assert len(line) == MAX_LINE
    c = Conn(real)
    c.send(line + b"\n")
    resp = c.line()
    assert resp is not None
    assert resp["ok"] is True
    c.close()


@pytest.mark.parametrize("newline", [b"", b"\n"])
def test_oversized_line_gets_an_error_and_is_closed(
    served: ControlServer, real: Path, newline: bytes
) -> None:
    c = Conn(real)
    c.send(b'{"v": 1, "cmd": "ok"}\n')
    assert c.line() is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the server hangs up
        c.send(b"x" * (MAX_LINE + 1) + newline)
    assert c.line() == {"v": 1, "ok": False, "error": "request too large (max 65536 bytes)"}
    assert c.line() is None
    c.close()
    wait_for(lambda: served.client_fds() == [], "the client to be dropped")


def test_stalled_client_does_not_stop_others(
    served: ControlServer, host: FaultKernel, real: Path
) -> None:
    slow = Conn(real)
    slow.send(b'{"v": 1, "cmd": "sta')  # ... and nothing more
    wait_for(lambda: len(served.client_fds()) == 1, "the slow client to be accepted")
    t0 = time.monotonic()
    for i in range(5):
        assert request(host, {"cmd": "status", "i": i}, timeout=2)["ok"] is True
    assert time.monotonic() - t0 < 2
    slow.send(b'tus"}\n')  # it may finish its line and be served after all
    assert slow.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "status"}}
    slow.close()


def test_client_stalled_mid_line_is_dropped_after_the_idle_limit(
    host: FaultKernel, real: Path
) -> None:
    with ControlServer(host, echo) as server:
        stalled, idle = Conn(real), Conn(real)
        server.on_readable(server.fileno())
        assert len(server.client_fds()) == 2
        stalled.send(b'{"v": 1, "cmd": "sta')
        for fd in server.client_fds():
            server.on_readable(fd)
        server.expire(time.monotonic() + IDLE_TIMEOUT_S - 1)
        assert len(server.client_fds()) == 2
        server.expire(time.monotonic() + IDLE_TIMEOUT_S + 0.5)
        resp = stalled.line()
        assert resp is not None
        assert resp["error"].startswith("request not finished within 10 s")
        assert stalled.line() is None
        # A client between requests holds a slot too: it has the same deadline (finding 16).
        assert server.client_fds() == []
        resp = idle.line()
        assert resp is not None and resp["error"].startswith("idle for 10 s")
        stalled.close()
        idle.close()


def test_more_than_32_clients(served: ControlServer, host: FaultKernel, real: Path) -> None:
    conns = [Conn(real) for _ in range(MAX_CLIENTS)]
    wait_for(lambda: len(served.client_fds()) == MAX_CLIENTS, "32 clients")
    extra = Conn(real)
    resp = extra.line()
    assert resp is not None
    assert resp["ok"] is False
    assert resp["error"].startswith("too many clients on gputuned's control socket (max 32,")
    assert extra.line() is None
    extra.close()
    with pytest.raises(errors.GputunedError, match="too many clients"):
        request(host, {"cmd": "status"})
    conns.pop().close()
    wait_for(lambda: len(served.client_fds()) == MAX_CLIENTS - 1, "a slot to free up")
    assert request(host, {"cmd": "status"})["ok"] is True
    for c in conns:  # the others were kept and still work
        c.send(b'{"v": 1, "cmd": "x"}\n')
        assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "x"}}
        c.close()


# -- handler errors -----------------------------------------------------------------------


def test_handler_errors_become_error_responses(served: ControlServer, real: Path) -> None:
    c = Conn(real)
    for cmd in ("fail", "crash", "unjsonable", "ok"):
        c.send(json.dumps({"v": 1, "cmd": cmd}).encode() + b"\n")
    assert c.line() == {
        "v": 1,
        "ok": False,
        "error": "the engine is busy; retry in a moment",
        "error_class": "Busy",  # and its exit code, as without the daemon (issue 31, item 3)
        "exit_code": 3,
    }
    crash = c.line()
    assert crash is not None
    assert crash["ok"] is False
    assert "internal error in gputuned while running 'crash' (ValueError: boom)" in crash["error"]
    unjsonable = c.line()
    assert unjsonable is not None
    assert "its result is not JSON" in unjsonable["error"]
    assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "ok"}}
    c.close()


def test_client_raises_the_daemons_error(served: ControlServer, host: FaultKernel) -> None:
    with pytest.raises(errors.GputunedError, match=r"^the engine is busy; retry in a moment$"):
        request(host, {"cmd": "fail"})


# -- the socket file: start, stale, busy, modes, stop -------------------------------------


def test_socket_file_is_root_only(host: FaultKernel, real: Path) -> None:
    with ControlServer(host, echo):
        assert real.stat().st_mode & 0o7777 == 0o600
        assert real.parent.stat().st_mode & 0o7777 == 0o700


def test_socket_file_with_a_group(host: FaultKernel, real: Path) -> None:
    with ControlServer(host, echo, group="root"):
        st = real.stat()
        assert (st.st_mode & 0o7777, st.st_gid) == (0o660, 0)
        assert real.parent.stat().st_mode & 0o7777 == 0o711  # searchable, not listable


def test_the_directory_gets_its_mode_back_at_close(host: FaultKernel, real: Path) -> None:
    """Finding 18: /run/gputuned stayed 0711 after a daemon with a control group stopped."""
    with ControlServer(host, echo, group="root"):
        assert real.parent.stat().st_mode & 0o7777 == 0o711
    assert real.parent.stat().st_mode & 0o7777 == 0o700
    assert not real.exists()


def test_unknown_group_is_refused(host: FaultKernel, real: Path) -> None:
    with pytest.raises(errors.InvalidValue, match="group 'no-such-group-xyz' does not exist"):
        ControlServer(host, echo, group="no-such-group-xyz")
    assert not real.exists()


def test_stale_socket_file_is_removed(host: FaultKernel, real: Path) -> None:
    real.parent.mkdir(parents=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(real.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        dead.bind(f"/proc/self/fd/{fd}/{real.name}")
    finally:
        os.close(fd)
    dead.close()  # the file stays, as after a daemon killed with SIGKILL
    assert real.is_socket()
    assert not daemon_running(host)
    with pytest.raises(errors.TargetGone, match="gputuned daemon not running"):
        request(host, {"cmd": "status"})
    server = ControlServer(host, echo)
    loop = Loop(server)
    try:
        assert request(host, {"cmd": "status"})["ok"] is True
    finally:
        loop.stop()
        server.close()


def test_live_daemon_is_detected(host: FaultKernel, real: Path) -> None:
    with ControlServer(host, echo) as first:
        with pytest.raises(
            errors.Busy, match=rf"another gputuned daemon is running \(PID {os.getpid()}\)"
        ):
            ControlServer(host, echo)
        assert real.is_socket()  # the live daemon's socket is left alone
        loop = Loop(first)
        try:
            assert request(host, {"cmd": "status"})["ok"] is True
        finally:
            loop.stop()


def test_something_else_at_the_path_is_left_alone(host: FaultKernel, real: Path) -> None:
    real.parent.mkdir(parents=True)
    real.write_text("not a socket")
    with pytest.raises(errors.HostError, match="exists and is not a socket"):
        ControlServer(host, echo)
    assert real.read_text() == "not a socket"


def test_close_removes_the_socket_file(host: FaultKernel, real: Path) -> None:
    server = ControlServer(host, echo)
    c = Conn(real)
    server.on_readable(server.fileno())
    server.close()
    server.close()  # twice is harmless
    assert not real.exists()
    assert c.line() is None
    c.close()
    assert not daemon_running(host)
    with pytest.raises(errors.TargetGone, match="gputuned daemon not running"):
        request(host, {"cmd": "status"})


def test_close_leaves_a_successors_socket(host: FaultKernel, real: Path) -> None:
    old = ControlServer(host, echo)
    real.unlink()  # someone removed it, and a new daemon started
    with ControlServer(host, echo):
        old.close()
        assert real.is_socket()


def test_no_daemon_no_directory(host: FaultKernel) -> None:
    assert not daemon_running(host)
    with pytest.raises(errors.TargetGone) as err:
        request(host, {"cmd": "status"})
    assert err.value.errno == errno.ENOENT


def test_paths_longer_than_sun_path(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 5)
    host = tree_kernel(deep)
    assert len(str(host.path(CONTROL_SOCKET))) > 108
    server = ControlServer(host, echo)
    loop = Loop(server)
    try:
        assert daemon_running(host)
        assert request(host, {"cmd": "status"})["ok"] is True
    finally:
        loop.stop()
        server.close()
    assert not host.exists(CONTROL_SOCKET)


def test_unanswered_request_times_out(host: FaultKernel) -> None:
    with ControlServer(host, echo):  # listening, but nobody drives it
        t0 = time.monotonic()
        with pytest.raises(errors.HostError, match=r"did not answer within 0\.3 s") as err:
            request(host, {"cmd": "status"}, timeout=0.3)
        assert err.value.errno == errno.ETIMEDOUT
        assert time.monotonic() - t0 < 2


# -- who may talk -------------------------------------------------------------------------


def no_groups(cred: PeerCred) -> list[int]:
    return []


def test_policy_root_only() -> None:
    assert peer_allowed(PeerCred(10, 0, 0), None, no_groups)
    assert peer_allowed(PeerCred(10, 0, 1000), None, no_groups)
    assert not peer_allowed(PeerCred(10, 1000, 0), None, no_groups)  # gid 0 alone is not root


def test_policy_with_a_group() -> None:
    def groups(cred: PeerCred) -> list[int]:
        return {11: [27, 990], 12: [27]}.get(cred.pid, [])

    assert peer_allowed(PeerCred(10, 1000, 990), 990, no_groups)  # primary group
    assert peer_allowed(PeerCred(11, 1000, 1000), 990, groups)  # supplementary group
    assert not peer_allowed(PeerCred(12, 1000, 1000), 990, groups)
    assert peer_allowed(PeerCred(12, 0, 0), 990, groups)


def test_supplementary_groups_are_read_through_the_host(host: FaultKernel) -> None:
    status = host.path("/proc/4321/status")
    status.parent.mkdir(parents=True)
    status.write_text(
        "Name:\tgputunectl\nPid:\t4321\nUid:\t1000\t1000\t1000\t1000\n"
        "Gid:\t1000\t1000\t1000\t1000\nGroups:\t27 990 1000 \n"
    )
    assert proc_groups(host, PeerCred(4321, 1000, 1000)) == {27, 990, 1000}
    # Another user's process under that PID now (the PID was reused): its groups prove nothing.
    assert proc_groups(host, PeerCred(4321, 1001, 1001)) == frozenset()
    assert proc_groups(host, PeerCred(4322, 1000, 1000)) == frozenset()  # gone


# -- hostile input (issue 14) -------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b'{"v": 1, "cmd": "status", "n": ' + b"9" * 5000 + b"}",  # int past 4300 digits
        b'{"v": 1, "cmd": "status", "n": -' + b"1" * 60000 + b"}",
        b"[" * 60000 + b"]" * 5,
        b'{"v": 1, "cmd": "status", "f": 1e99999}',
    ],
    ids=["int-5000-digits", "int-60000-digits", "nested", "huge-float"],
)
def test_no_request_ends_the_server(served: ControlServer, real: Path, line: bytes) -> None:
    """Finding 1: json.loads raised ValueError for long integers, out of on_readable."""
    c = Conn(real)
    c.send(line + b"\n")
    resp = c.line()
    assert resp is not None and resp["v"] == 1, "answered, not dropped"
    c.send(b'{"v": 1, "cmd": "ok"}\n')
    assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "ok"}}
    c.close()


def test_an_idle_connection_is_dropped_after_the_idle_limit(host: FaultKernel, real: Path) -> None:
    """Finding 16: a connection that never sends was kept for ever; 32 of them locked every
    client out, root included."""
    with ControlServer(host, echo) as server:
        idle = Conn(real)
        server.on_readable(server.fileno())
        assert len(server.client_fds()) == 1
        server.expire(time.monotonic() + IDLE_TIMEOUT_S + 0.5)
        assert server.client_fds() == []
        resp = idle.line()
        assert resp is not None and "idle" in resp["error"]
        idle.close()


# -- other users: limits and what they may send (findings 7 and 16) -----------------------

MEMBER_GID = 4242  # the control group of these tests


def as_users(uids: list[int]) -> Callable[[socket.socket], PeerCred]:
    """Peer credentials handed out in turn: connections "from" these uids, in order."""
    queue = list(uids)

    def peer_of(sock: socket.socket) -> PeerCred:
        uid = queue.pop(0)
        return PeerCred(os.getpid(), uid, MEMBER_GID if uid else 0)

    return peer_of


def member_server(host: FaultKernel, uids: list[int], **kw: Any) -> ControlServer:
    server = ControlServer(host, echo, group="root", peer_of=as_users(uids), **kw)
    server.access = dataclasses.replace(server.access, control_gid=MEMBER_GID)
    return server


def accept(server: ControlServer, real: Path, n: int) -> list[Conn]:
    conns = [Conn(real) for _ in range(n)]
    for _ in range(3):
        server.on_readable(server.fileno())
    return conns


def test_each_user_has_a_cap_and_root_always_has_a_slot(host: FaultKernel, real: Path) -> None:
    uids = [1000] * 9 + [1001] * 8 + [1002] * 8 + [1003] * 5 + [0] * 4
    with member_server(host, uids) as server:
        conns = accept(server, real, 9)
        assert len(server.client_fds()) == PER_USER
        refused = conns[-1].line()
        assert refused is not None and "8 for you" in refused["error"]
        conns += accept(server, real, 21)  # other users fill every slot but root's
        assert len(server.client_fds()) == MAX_CLIENTS - ROOT_RESERVED
        last = conns[-1].line()
        assert last is not None and last["error"].startswith("too many clients")
        conns += accept(server, real, 4)
        assert len(server.client_fds()) == MAX_CLIENTS, "root gets in past them"
        for c in conns:
            c.close()


def test_a_member_may_read_but_not_change(host: FaultKernel, real: Path) -> None:
    """Every command of the table (gputuned/service/controlproto.py COMMANDS), as a member of
    the control group sends it: the read-only ones answered, the others refused."""
    assert {c.name for c in COMMANDS if not c.changes} == {"status", "verify", "top"}
    with member_server(host, [1000]) as server:
        c = accept(server, real, 1)[0]
        for cmd in COMMANDS:
            c.send(json.dumps({"v": 1, "cmd": cmd.name}).encode() + b"\n")
        for fd in server.client_fds():
            server.on_readable(fd)
        while server.pending():
            server.serve()
        answers = [c.line() for _ in COMMANDS]
        assert [a is not None and a["ok"] for a in answers] == [not x.changes for x in COMMANDS]
        for cmd, a in zip(COMMANDS, answers, strict=True):
            if cmd.changes:
                assert a is not None and a["error"].startswith(f"permission denied: '{cmd.name}'")
                assert "changes the host; only root may send it" in a["error"]
        c.close()


def test_the_daemon_answers_every_command_and_no_other() -> None:
    from gputuned.daemon.control import Requests

    handlers = {m.removeprefix("_cmd_") for m in dir(Requests) if m.startswith("_cmd_")}
    assert handlers == {c.name for c in COMMANDS}


def test_gputunectl_sends_only_commands_of_the_table() -> None:
    """Every request the CLI builds names a command of the table (its "cmd" literals)."""
    import ast

    sent = set()
    for path in (Path(__file__).resolve().parents[2] / "gputuned" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "cmd":
                        # gputunectl register and unregister send their own name (args.command)
                        sent.add(v.value if isinstance(v, ast.Constant) else "register")
    assert sent and sent <= {c.name for c in COMMANDS}, sent


def test_the_usage_page_lists_the_table() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()
    rows = [
        f"| `{c.name}` | {'changes the host' if c.changes else 'read-only'} | {c.does} | "
        f"{c.reply} |"
        for c in COMMANDS
    ]
    table = "| command | who | what it does | reply |\n|---|---|---|---|\n" + "\n".join(rows)
    assert table in page, "docs/usage.md: the control commands' table differs from COMMANDS"


def test_an_admin_group_may_change(host: FaultKernel, real: Path) -> None:
    with member_server(host, [1000], admin_group="root") as server:
        server.access = dataclasses.replace(server.access, admin_gid=MEMBER_GID)
        c = accept(server, real, 1)[0]
        c.send(b'{"v": 1, "cmd": "revert"}\n')
        server.on_readable(c_fd := server.client_fds()[0])
        server.serve()
        assert c.line() == {"v": 1, "ok": True, "echo": {"v": 1, "cmd": "revert"}}, c_fd
        c.close()


def test_root_is_answered_before_a_burst_from_another_user(host: FaultKernel, real: Path) -> None:
    with member_server(host, [1000, 0]) as server:
        member, root = accept(server, real, 2)
        member.send(b'{"v": 1, "cmd": "status", "from": "member"}\n' * 500)
        root.send(b'{"v": 1, "cmd": "status", "from": "root"}\n')
        time.sleep(0.05)
        for fd in server.client_fds():
            server.on_readable(fd)
        server.serve()  # one turn: root's one request, and a slice of the member's
        assert root.line() == {
            "v": 1, "ok": True, "echo": {"v": 1, "cmd": "status", "from": "root"}
        }  # fmt: skip
        assert server.pending(), "the member's burst waits for later turns"
        member.close()
        root.close()


def test_internal_errors_name_no_value_to_other_users(host: FaultKernel, real: Path) -> None:
    with member_server(host, [1000]) as server:
        c = accept(server, real, 1)[0]
        c.send(b'{"v": 1, "cmd": "crash"}\n')
        server.on_readable(server.client_fds()[0])
        server.serve()
        resp = c.line()
        assert resp is not None and "(ValueError)" in resp["error"] and "boom" not in resp["error"]
        c.close()
