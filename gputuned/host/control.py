"""The daemon's control socket: the server ``gputuned`` runs and the client ``gputunectl`` uses.

Protocol (version 1)
--------------------
- A Unix stream socket, by default ``/run/gputuned/control.sock`` under the Host's root. Paths
  longer than ``sun_path`` allows (108 bytes, deep ``--root`` trees) are bound and connected
  through ``/proc/self/fd/<dirfd>/<name>`` of the socket's directory.
- JSON lines. A request is one UTF-8 JSON object ending in ``"\\n"``, with ``"v": 1`` and
  ``"cmd"`` (a non-empty string) beside the command's own fields. Each request gets one response,
  in order: a JSON object ending in ``"\\n"`` with ``"v": 1`` and ``"ok"``; ``true`` comes with
  the command's result fields, ``false`` with ``"error"``: a message that says what to do. A
  client may send several requests on one connection. Blank lines are ignored.
- Errors that leave the connection usable: invalid UTF-8 or JSON, a value other than an object,
  a missing ``"cmd"``, an unsupported ``"v"`` (``unsupported protocol version X; this daemon
  speaks 1``), and any error the command raises.
- Errors that close it, after one error line: a request line over 64 KiB (``request too large
  (max 65536 bytes)``); a request line not complete 10 s after its first byte (a stalled client
  must not hold a slot; measuring from the first byte rather than the last also stops a client
  that trickles one byte at a time); a 33rd concurrent client; a refused peer.
- Who may talk: checked on every connection from ``SO_PEERCRED`` (unix(7): the peer's pid, euid
  and egid at connect time), not only by the file mode. Root (uid 0) may; with a control group
  configured, so may a peer whose gid is that group's or whose supplementary groups (the
  ``Groups:`` line of ``/proc/<pid>/status``, read through the Host) include it. Others get
  ``permission denied: gputuned's control socket is for root (or group X)``; the refusal is
  logged with their pid and uid.
- The socket file is mode 0600, or 0660 and owned by the group when one is configured (then its
  directory also gets search permission, ``--x``, for everyone, or the mode would never be
  reached; /run/gputuned is 0700 otherwise). Mode and group are set before ``listen(2)``, so no
  connection is ever accepted under the umask's mode. At start a socket file left behind is
  removed only when nothing answers on it (``ECONNREFUSED``); a daemon that answers makes the new
  one fail with :class:`~gputuned.errors.Busy` naming its PID (its ``SO_PEERCRED``).

The server never blocks the daemon for long: every socket is non-blocking and driven by the
daemon's selector (:meth:`ControlServer.fileno`, :meth:`ControlServer.client_fds`,
:meth:`ControlServer.on_readable`, :meth:`ControlServer.expire`). Responses are written with
``sendall`` under a 1 s timeout rather than buffered for a writability event: a response is a few
KiB and lands in the socket buffer (about 200 KiB) at once; only a client that stops reading its
answers can make the write wait, and such a client is dropped after that second.
"""

from __future__ import annotations

import contextlib
import errno as E
import grp
import json
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gputuned import errors
from gputuned.host.fs import Host, translate
from gputuned.host.state import ensure_dir

log = logging.getLogger(__name__)

CONTROL_SOCKET = "/run/gputuned/control.sock"
PROTOCOL_VERSION = 1
#: Longest request line, without its newline.
MAX_LINE = 65536
MAX_CLIENTS = 32
#: A request line must be complete this long after its first byte (seconds, monotonic clock).
IDLE_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 1.0
_PROBE_TIMEOUT_S = 2.0
_MAX_RESPONSE = 64 << 20
# struct ucred (include/linux/socket.h): pid_t pid; uid_t uid; gid_t gid.
_UCRED = struct.Struct("3i")
# sizeof(sockaddr_un.sun_path), NUL included (include/uapi/linux/un.h).
_SUN_PATH_MAX = 108
_NOT_RUNNING = (E.ENOENT, E.ECONNREFUSED, E.ENOTDIR)


@dataclass(frozen=True)
class PeerCred:
    """Who is on the other end of a connection (``SO_PEERCRED``: effective ids at connect)."""

    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"pid {self.pid} uid {self.uid} gid {self.gid}"


#: Runs one request: returns the response body (without ``"v"``; ``"ok": true`` is added unless
#: the body sets it) or raises :class:`~gputuned.errors.GputunedError`, which becomes
#: ``{"ok": false, "error": str(exc)}``.
Handler = Callable[[dict[str, Any], PeerCred], dict[str, Any]]
#: The supplementary group ids of a peer (injectable: unit tests must not read the real /proc).
GroupsOf = Callable[[PeerCred], Iterable[int]]


def proc_groups(host: Host, cred: PeerCred) -> frozenset[int]:
    """The peer's supplementary groups from ``/proc/<pid>/status``, read through ``host``.

    Empty when the process is gone, or when its effective uid is no longer the one it connected
    with: its PID may have been reused by another process, whose groups prove nothing.
    """
    try:
        status = host.read_text(f"/proc/{cred.pid}/status")
    except errors.HostError:
        return frozenset()
    fields: dict[str, str] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    uids = fields.get("Uid", "").split()  # real, effective, saved, filesystem
    if len(uids) < 2 or uids[1] != str(cred.uid):
        return frozenset()
    return frozenset(int(g) for g in fields.get("Groups", "").split() if g.isdigit())


def peer_allowed(cred: PeerCred, group_gid: int | None, groups_of: GroupsOf) -> bool:
    """Root always; with a control group, also its members (primary or supplementary)."""
    if cred.uid == 0:
        return True
    if group_gid is None:
        return False
    return cred.gid == group_gid or group_gid in set(groups_of(cred))


@dataclass
class _Client:
    sock: socket.socket
    cred: PeerCred
    buf: bytearray = field(default_factory=bytearray)
    #: When the unfinished line in ``buf`` got its first byte (monotonic).
    line_started: float = 0.0


class ControlServer:
    """The listening control socket and its clients, driven by the daemon's selector.

    Watch :meth:`fileno` and every fd of :meth:`client_fds` for reading (the set changes after
    each :meth:`on_readable`), call :meth:`on_readable` with a readable fd, and call
    :meth:`expire` with ``time.monotonic()`` about once a second.
    """

    def __init__(
        self,
        host: Host,
        handler: Handler,
        *,
        group: str | None = None,
        path: str = CONTROL_SOCKET,
        groups_of: GroupsOf | None = None,
    ) -> None:
        self.host = host
        self.path = path
        self.group = group
        self._real = host.real(path)
        self._handler = handler
        self._gid = _group_gid(group) if group is not None else None
        self._groups_of: GroupsOf = groups_of or (lambda cred: proc_groups(host, cred))
        self._clients: dict[int, _Client] = {}
        self._sock, self._ident = self._listen()

    # -- the daemon's side ---------------------------------------------------------------

    def fileno(self) -> int:
        return self._sock.fileno()

    def client_fds(self) -> list[int]:
        return list(self._clients)

    def on_readable(self, fd: int) -> None:
        """Accept (listening fd) or read, answer every complete line, and drop broken clients."""
        if fd == self._sock.fileno():
            self._accept_all()
        elif (client := self._clients.get(fd)) is not None:
            self._read(client)

    def expire(self, now: float) -> None:
        """Drop clients whose current request line began more than 10 s before ``now``."""
        for client in list(self._clients.values()):
            if client.buf and now - client.line_started > IDLE_TIMEOUT_S:
                log.info("control socket: dropped %s: request line unfinished", client.cred)
                self._drop(
                    client,
                    _error(f"request not finished within {IDLE_TIMEOUT_S:g} s; send whole lines"),
                )

    def close(self) -> None:
        """Close every connection and the socket; remove the socket file if it is still ours."""
        for client in list(self._clients.values()):
            self._drop(client)
        if self._sock.fileno() < 0:
            return
        self._sock.close()
        try:
            st = os.lstat(self._real)
        except OSError:
            return
        if (st.st_dev, st.st_ino) == self._ident:  # not a successor's socket
            try:
                os.unlink(self._real)
            except OSError as exc:
                log.warning("control socket: could not remove %s: %s", self.path, exc)

    def __enter__(self) -> ControlServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- setting up ----------------------------------------------------------------------

    def _listen(self) -> tuple[socket.socket, tuple[int, int]]:
        parent = self.path.rsplit("/", 1)[0] or "/"
        ensure_dir(self.host, parent)
        _remove_stale(self._real, self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                _via_short_path(self._real, sock.bind)
            except OSError as exc:
                if exc.errno == E.EADDRINUSE:
                    raise errors.Busy(
                        "another gputuned daemon is starting on the same control socket "
                        f"{self.path}; stop it first",
                        path=self.path,
                        errno=exc.errno,
                    ) from exc
                raise translate(exc, "bind control socket", self.path) from exc
            try:
                st = os.lstat(self._real)
                if self._gid is None:
                    os.chmod(self._real, 0o600)
                else:
                    os.chown(self._real, -1, self._gid)
                    os.chmod(self._real, 0o660)
                    _open_for_search(self.host.real(parent), parent)
            except OSError as exc:
                os.unlink(self._real)
                raise translate(exc, "set the mode of", self.path) from exc
            # Only now may connections queue: the file already has its final mode and group.
            sock.listen(MAX_CLIENTS)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock, (st.st_dev, st.st_ino)

    # -- connections ---------------------------------------------------------------------

    def _accept_all(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE and friends: leave the rest queued for later
                log.warning("control socket: accept failed: %s", exc)
                return
            conn.setblocking(False)
            cred = _peercred(conn)
            if not peer_allowed(cred, self._gid, self._groups_of):
                log.warning("control socket: refused %s: not root or in the control group", cred)
                who = f"root (or group {self.group})" if self.group else "root"
                msg = f"permission denied: gputuned's control socket is for {who}"
                _send_and_close(conn, _error(msg))
            elif len(self._clients) >= MAX_CLIENTS:
                log.warning("control socket: refused %s: %d clients already", cred, MAX_CLIENTS)
                msg = f"too many clients on gputuned's control socket (max {MAX_CLIENTS}); retry"
                _send_and_close(conn, _error(msg))
            else:
                self._clients[conn.fileno()] = _Client(conn, cred)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(MAX_LINE + 1)
        except BlockingIOError:
            return
        except OSError:
            self._drop(client)
            return
        if not data:  # EOF: answer a last request sent without its newline, then hang up
            if client.buf.strip():
                self._answer(client, bytes(client.buf))
            self._drop(client)
            return
        if not client.buf:
            client.line_started = time.monotonic()
        client.buf += data
        # A newline past MAX_LINE bytes ends a line that is already too large.
        while (nl := client.buf.find(b"\n", 0, MAX_LINE + 1)) >= 0:
            line = bytes(client.buf[:nl])
            del client.buf[: nl + 1]
            if not self._answer(client, line):
                return
            client.line_started = time.monotonic()
        if len(client.buf) > MAX_LINE:
            log.warning("control socket: dropped %s: request over %d bytes", client.cred, MAX_LINE)
            self._drop(client, _error(f"request too large (max {MAX_LINE} bytes)"))

    def _answer(self, client: _Client, line: bytes) -> bool:
        """Send the response to one line; False when the client was dropped."""
        if not line.strip():
            return True
        data = _encode(self._respond(line, client.cred))
        try:
            client.sock.settimeout(SEND_TIMEOUT_S)
            client.sock.sendall(data)
            client.sock.setblocking(False)
        except OSError as exc:  # TimeoutError included: the client stopped reading
            log.info("control socket: dropped %s: %s", client.cred, exc)
            self._drop(client)
            return False
        return True

    def _respond(self, line: bytes, cred: PeerCred) -> dict[str, Any]:
        try:
            req = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            return _error("request is not UTF-8; send one UTF-8 JSON object per line")
        except json.JSONDecodeError as exc:
            return _error(
                f"request is not valid JSON ({exc.msg} at column {exc.colno}); "
                'send one JSON object per line, like {"v": 1, "cmd": "status"}'
            )
        except RecursionError:  # "[[[[..." within the line limit: json gives up, not the daemon
            return _error(
                'request nests too deeply; send one JSON object per line, like {"v": 1, "cmd": "status"}'
            )
        if not isinstance(req, dict):
            return _error(
                f"request must be a JSON object, not {type(req).__name__}; "
                'send one per line, like {"v": 1, "cmd": "status"}'
            )
        if "v" not in req:
            return _error(
                f'request has no "v"; this daemon speaks protocol version {PROTOCOL_VERSION}: send "v": {PROTOCOL_VERSION}'
            )
        v = req["v"]
        if type(v) is not int or v != PROTOCOL_VERSION:
            return _error(
                f"unsupported protocol version {json.dumps(v)}; this daemon speaks {PROTOCOL_VERSION}"
            )
        cmd = req.get("cmd")
        if not isinstance(cmd, str) or not cmd:
            return _error('request has no "cmd"; send "cmd": the name of a command, like "status"')
        try:
            body = self._handler(req, cred)
        except errors.GputunedError as exc:
            return _error(str(exc))
        except Exception as exc:
            log.exception("control socket: command %r from %s failed", cmd, cred)
            return _internal(cmd, f"{type(exc).__name__}: {exc}")
        if not isinstance(body, dict):
            return _internal(cmd, f"its handler returned {type(body).__name__}, not an object")
        resp: dict[str, Any] = {"v": PROTOCOL_VERSION, "ok": True}
        resp.update(body)
        resp["v"] = PROTOCOL_VERSION
        try:
            json.dumps(resp)
        except (TypeError, ValueError) as exc:
            return _internal(cmd, f"its result is not JSON: {exc}")
        return resp

    def _drop(self, client: _Client, last: dict[str, Any] | None = None) -> None:
        self._clients.pop(client.sock.fileno(), None)
        if last is not None:
            _send_and_close(client.sock, last)
        else:
            client.sock.close()


def _peercred(sock: socket.socket) -> PeerCred:
    return PeerCred(
        *_UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    )


def _error(message: str) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "ok": False, "error": message}


def _internal(cmd: str, what: str) -> dict[str, Any]:
    return _error(
        f"internal error in gputuned while running {cmd!r} ({what}); the daemon's log has the "
        "traceback: please report it"
    )


def _encode(resp: dict[str, Any]) -> bytes:
    return json.dumps(resp, separators=(",", ":")).encode() + b"\n"


def _send_and_close(sock: socket.socket, resp: dict[str, Any]) -> None:
    """Best effort: one small line into an empty socket buffer never blocks."""
    try:
        sock.setblocking(False)
        sock.send(_encode(resp))
    except OSError:
        pass
    finally:
        sock.close()


def _group_gid(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise errors.InvalidValue(
            f"control socket group {group!r} does not exist; create it (groupadd {group}) or "
            "leave the group setting out (root only)"
        ) from None


def _open_for_search(real_dir: str, hpath: str) -> None:
    """Give everyone search (not read) permission on the socket's directory.

    The group's 0660 on the socket is checked only after path lookup reaches it; /run/gputuned
    is 0700. Search alone lists nothing, and the journal and lock inside stay 0600.
    """
    mode = stat.S_IMODE(os.stat(real_dir).st_mode)
    if mode & 0o011 != 0o011:
        log.info(
            "control socket: %s made searchable (mode %o) for the control group",
            hpath,
            mode | 0o011,
        )
        os.chmod(real_dir, mode | 0o011)  # noqa: S103  search only; nothing is listed


def _via_short_path(real: str, op: Callable[[str], None]) -> None:
    """bind(2) or connect(2) ``real``, also past sun_path's 108 bytes: through the directory's
    /proc/self/fd entry, which the kernel resolves like the directory itself."""
    if len(os.fsencode(real)) < _SUN_PATH_MAX:
        op(real)
        return
    parent, _, name = real.rpartition("/")
    fd = os.open(parent or "/", os.O_PATH | os.O_DIRECTORY)
    try:
        op(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


def _probe(real: str) -> int:
    """Connect to the socket at ``real`` and return the PID of whoever listens (OSError if none)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(_PROBE_TIMEOUT_S)
        _via_short_path(real, s.connect)
        return _peercred(s).pid


def _remove_stale(real: str, hpath: str) -> None:
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise translate(exc, "stat", hpath) from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise errors.HostError(
            f"{hpath} exists and is not a socket; gputuned will not remove it: check what made "
            "it, then remove it",
            path=hpath,
            errno=E.EEXIST,
        )
    try:
        pid = _probe(real)
    except TimeoutError:
        raise errors.Busy(
            f"another gputuned daemon holds {hpath} but accepts no connection; stop it first",
            path=hpath,
            errno=E.ETIMEDOUT,
        ) from None
    except OSError as exc:
        if exc.errno != E.ECONNREFUSED:
            raise translate(exc, "connect to", hpath) from exc
        log.info("control socket: removing %s left by a daemon that is gone", hpath)
        try:
            os.unlink(real)
        except FileNotFoundError:
            pass
        except OSError as exc2:
            raise translate(exc2, "remove", hpath) from exc2
        return
    raise errors.Busy(
        f"another gputuned daemon is running (PID {pid}); stop it first "
        "(systemctl stop gputuned), or talk to it with gputunectl",
        path=hpath,
        errno=E.EADDRINUSE,
    )


# -- the client ---------------------------------------------------------------------------


def request(
    host: Host,
    message: dict[str, Any],
    *,
    timeout: float = 30.0,
    path: str = CONTROL_SOCKET,
) -> dict[str, Any]:
    """Send ``message`` (``"v": 1`` added unless it names a version) and return the response.

    Raises TargetGone when no daemon listens (the CLI then runs the command itself),
    PermissionDenied when the socket's mode keeps this user out, GputunedError with the daemon's
    message for an ``"ok": false`` response, HostError when the daemon does not answer in time.
    """
    line = _encode({"v": PROTOCOL_VERSION, **message})
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            _via_short_path(host.real(path), s.connect)
            # A refused client is hung up on at once: its reason is still there to be read.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(line)
            reply = _read_line(s, deadline)
    except TimeoutError:
        raise errors.HostError(
            f"gputuned daemon did not answer within {timeout:g} s on {path}; is it hung? "
            "(journalctl -u gputuned)",
            path=path,
            errno=E.ETIMEDOUT,
        ) from None
    except OSError as exc:
        raise _client_error(exc, path) from exc
    return _parse_response(reply, path)


def daemon_running(host: Host, path: str = CONTROL_SOCKET) -> bool:
    """True when a daemon answers on the control socket.

    Also True when the socket exists but its mode keeps this user out: a non-root user cannot
    tell a live daemon from a stale file then, and must be told to use root either way.
    """
    try:
        _probe(host.real(path))
    except TimeoutError:
        return True  # its queue is full: alive, busy
    except OSError as exc:
        if exc.errno in _NOT_RUNNING:
            return False
        if exc.errno in (E.EACCES, E.EPERM):
            return True
        raise translate(exc, "connect to", path) from exc
    return True


def _read_line(s: socket.socket, deadline: float) -> bytes:
    buf = bytearray()
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        if len(buf) > _MAX_RESPONSE:
            raise errors.HostError(f"gputuned daemon sent a response over {_MAX_RESPONSE} bytes")
    return bytes(buf.partition(b"\n")[0]) if b"\n" in buf else b""


def _client_error(exc: OSError, path: str) -> errors.HostError:
    if exc.errno in _NOT_RUNNING:
        return errors.TargetGone("gputuned daemon not running", path=path, errno=exc.errno)
    if exc.errno in (E.EACCES, E.EPERM):
        return errors.PermissionDenied(
            f"cannot connect to gputuned's control socket {path}: permission denied; run "
            "gputunectl as root (or as a member of the daemon's control group)",
            path=path,
            errno=exc.errno,
        )
    return translate(exc, "talk to gputuned daemon through", path)


def _parse_response(reply: bytes, path: str) -> dict[str, Any]:
    if not reply:
        raise errors.HostError(
            f"gputuned daemon closed {path} without answering; see its log (journalctl -u gputuned)",
            path=path,
        )
    try:
        resp = json.loads(reply)
    except ValueError:
        resp = None
    if not isinstance(resp, dict) or resp.get("v") != PROTOCOL_VERSION:
        raise errors.HostError(
            f"gputuned daemon answered on {path} in a form this gputunectl does not understand "
            f"(protocol {PROTOCOL_VERSION} expected); are both from the same gputuned version?",
            path=path,
        )
    if resp.get("ok") is not True:
        raise errors.GputunedError(str(resp.get("error") or "gputuned daemon reported an error"))
    return resp
