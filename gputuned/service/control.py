"""The daemon's control socket: the server ``gputuned`` runs (the protocol and who may send what:
:mod:`gputuned.service.controlproto`; the client ``gputunectl`` uses: :mod:`gputuned.service.controlclient`).

- A Unix stream socket, by default ``/run/gputuned/control.sock`` under the kernel's root.
- The socket file is mode 0600, or 0660 and owned by the group when a control or admin group
  is configured (then its directory also gets search permission, ``--x``, for everyone, or the
  mode would never be reached; /run/gputuned is 0700 otherwise, and gets its mode back when
  the server closes). Mode and group are set before ``listen(2)``, so no connection is ever
  accepted under the umask's mode. Giving the file to the group needs ``CAP_CHOWN`` (the
  shipped unit has it). At start a socket file left behind is removed only when nothing
  answers on it (``ECONNREFUSED``); a daemon that answers makes the new one fail with
  :class:`~gputuned.errors.Busy` naming its PID (its ``SO_PEERCRED``).
- Limits (issue 14, finding 16): 32 connections at once, of which 4 are kept for root, and 8
  per other user; beyond them a connection gets ``too many clients ...`` and is closed. A
  request line over 64 KiB gets ``request too large (max 65536 bytes)`` and the connection
  closed. A connection must complete its next request within 10 s of connecting or of its
  last answer, or it is closed (idle, or trickling one byte at a time, alike). A client that
  does not take its answer within 1 s is dropped.
- Fairness: requests are read as they come but answered by :meth:`ControlServer.serve`, which
  the daemon calls once per loop turn: one request per client per round, root's clients
  first, at most 32 per turn. A client that sends thousands of requests at once gets them
  answered in turn with everyone else's, not before root's next ``status``.
"""

from __future__ import annotations

import errno as E
import grp
import logging
import os
import socket
import stat
from collections.abc import Callable
from typing import Any

from gputuned import errors
from gputuned.kernel import Kernel
from gputuned.kernel.oserrors import translate
from gputuned.service.controlclient import (  # the client API, re-exported
    CONTROL_SOCKET,
    daemon_running,
    peercred,
    probe,
    request,
    via_short_path,
)
from gputuned.service.controlproto import (
    CHANGING,
    MAX_LINE,
    PROTOCOL_VERSION,
    READ_ONLY,
    Access,
    GroupsOf,
    PeerCred,
    encode,
    error,
    failed,
    internal,
    parse_request,
    peer_allowed,
    proc_groups,
)
from gputuned.service.peerlog import PEER_LOG
from gputuned.service.sockserve import Client, StreamServer
from gputuned.store.state import ensure_dir

__all__ = [
    "CHANGING", "CONTROL_SOCKET", "IDLE_TIMEOUT_S", "MAX_CLIENTS", "MAX_LINE", "PER_USER",
    "PROTOCOL_VERSION", "READ_ONLY", "ROOT_RESERVED", "ControlServer", "PeerCred",
    "daemon_running", "peer_allowed", "proc_groups", "request",
]  # fmt: skip

log = logging.getLogger(__name__)

MAX_CLIENTS = 32
#: Slots only root may take: other users' connections never lock root out.
ROOT_RESERVED = 4
#: Connections one user other than root may hold at once.
PER_USER = 8
#: A connection's next request must be complete this long after it connected or was last
#: answered (seconds, monotonic clock).
IDLE_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 1.0
#: Requests answered per loop turn, at most one per client per round.
LINES_PER_TURN = 32

#: Runs one request: returns the response body (without ``"v"``; ``"ok": true`` is added unless
#: the body sets it) or raises :class:`~gputuned.errors.GputunedError`, which becomes
#: ``{"ok": false, "error": str(exc)}``.
Handler = Callable[[dict[str, Any], PeerCred], dict[str, Any]]
#: The credentials of a connected socket (injectable for tests of other users' limits).
PeerOf = Callable[[socket.socket], PeerCred]


class ControlServer(StreamServer):
    """The listening control socket and its clients, driven by the daemon's loop.

    With a :class:`~gputuned.service.loop.Loop`, call :meth:`attach`, then :meth:`serve` and
    :meth:`expire` (with ``time.monotonic()``) once per loop turn, and never sleep while
    :meth:`pending` is true. Without one, watch :meth:`fileno`, :meth:`client_fds` (readable)
    and :meth:`writing_fds` (writable) and call :meth:`on_readable` / :meth:`on_writable`.
    """

    name = "control socket"
    idle_timeout_s = IDLE_TIMEOUT_S
    send_timeout_s = SEND_TIMEOUT_S
    recv_size = MAX_LINE + 1

    def __init__(
        self,
        kernel: Kernel,
        handler: Handler,
        *,
        group: str | None = None,
        admin_group: str | None = None,
        path: str = CONTROL_SOCKET,
        groups_of: GroupsOf | None = None,
        peer_of: PeerOf | None = None,
    ) -> None:
        self.kernel = kernel
        self.path = path
        self.group = group
        self._real = str(kernel.path(path))
        self._handler = handler
        self.access = Access(
            _group_gid(group, "control_group") if group is not None else None,
            _group_gid(admin_group, "admin_group") if admin_group is not None else None,
            group,
            admin_group,
        )
        self._groups_of: GroupsOf = groups_of or (lambda cred: proc_groups(kernel, cred))
        self._peer_of = peer_of or peercred
        self._dir_mode: int | None = None  # the mode /run/gputuned had before search was added
        sock, self._ident = self._listen()
        super().__init__(sock)

    # -- the daemon's side ---------------------------------------------------------------

    def pending(self) -> bool:
        return any(self._has_line(c) for c in self.clients())

    def serve(self) -> None:
        """Answer up to LINES_PER_TURN waiting requests: one per client per round, root first."""
        budget = LINES_PER_TURN
        while budget > 0:
            ready = sorted(
                (c for c in self.clients() if self._has_line(c)), key=lambda c: c.peer.uid != 0
            )
            if not ready:
                break
            for client in ready[:budget]:
                budget -= 1
                self._answer_next(client)

    def close(self) -> None:
        """Close every connection and the socket; remove the socket file if it is still ours,
        and give its directory back the mode it had."""
        listening = self.fileno() >= 0
        super().close()
        if not listening:
            return
        try:
            st = os.lstat(self._real)
        except OSError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == self._ident:  # not a successor's
            try:
                os.unlink(self._real)
            except OSError as exc:
                log.warning("control socket: could not remove %s: %s", self.path, exc)
        if self._dir_mode is not None:
            try:
                os.chmod(os.path.dirname(self._real), self._dir_mode)
            except OSError as exc:
                log.warning("control socket: could not restore the mode of its directory: %s", exc)

    # -- admission -----------------------------------------------------------------------

    def admit(self, conn: socket.socket, addr: Any) -> tuple[Any, bytes | None]:
        cred: PeerCred = self._peer_of(conn)
        if not self.access.may_connect(cred, self._groups_of):
            log.warning("control socket: refused %s: not root or in the control group", cred)
            msg = (
                f"permission denied: gputuned's control socket is for {self.access.who_connects()}"
            )
            return cred, encode(error(msg))
        clients = [c.peer for c in self.clients()]
        others = sum(1 for p in clients if p.uid != 0)
        mine = sum(1 for p in clients if p.uid == cred.uid)
        full = len(clients) >= MAX_CLIENTS or (
            cred.uid != 0 and (others >= MAX_CLIENTS - ROOT_RESERVED or mine >= PER_USER)
        )
        if full:
            log.warning("control socket: refused %s: %d clients already", cred, len(clients))
            limit = MAX_CLIENTS if cred.uid == 0 else PER_USER
            msg = (
                f"too many clients on gputuned's control socket (max {MAX_CLIENTS}, "
                f"{limit} for you); close some and retry"
            )
            return cred, encode(error(msg))
        return cred, None

    # -- requests ------------------------------------------------------------------------

    def take(self, client: Client) -> None:
        if client.eof and client.inbuf and not client.inbuf.endswith(b"\n"):
            client.inbuf += b"\n"  # EOF ends a last request sent without its newline
        if client.inbuf.find(b"\n", 0, MAX_LINE + 1) < 0 and len(client.inbuf) > MAX_LINE:
            log.warning("control socket: dropped %s: request over %d bytes", client.peer, MAX_LINE)
            self.drop(client, encode(error(f"request too large (max {MAX_LINE} bytes)")))
        elif client.eof and not self._has_line(client) and not client.outbuf:
            self.drop(client)

    def timed_out(self, client: Client) -> bytes:
        if client.inbuf.strip():
            log.info("control socket: dropped %s: request line unfinished", client.peer)
            why = f"request not finished within {IDLE_TIMEOUT_S:g} s; send whole lines"
        else:
            log.info("control socket: dropped %s: idle", client.peer)
            why = f"idle for {IDLE_TIMEOUT_S:g} s; connect again when there is a request to send"
        return encode(error(why))

    def waits_for_us(self, client: Client) -> bool:
        return self._has_line(client)

    @staticmethod
    def _has_line(client: Client) -> bool:
        return not client.outbuf and client.inbuf.find(b"\n", 0, MAX_LINE + 1) >= 0

    def _answer_next(self, client: Client) -> None:
        nl = client.inbuf.find(b"\n", 0, MAX_LINE + 1)
        line = bytes(client.inbuf[:nl])
        del client.inbuf[: nl + 1]
        if line.strip():
            self.send(client, encode(self.respond(line, client.peer)))
            self.answered(client)
        if client.fd in self.client_fds():
            self.take(client)  # an oversized line may follow; EOF may be all that is left

    def respond(self, line: bytes, cred: PeerCred) -> dict[str, Any]:
        """The response to one request line. Never raises: whatever fails is an error reply."""
        cmd = "?"
        try:
            req = parse_request(line)
            cmd = str(req["cmd"])
            if cmd in CHANGING and not self.access.may_change(cred, self._groups_of):
                if PEER_LOG.allow(cred.uid):
                    log.warning(
                        "control socket: refused %r from %s: it changes the host", cmd, cred
                    )
                return error(
                    f"permission denied: {cmd!r} changes the host; only "
                    f"{self.access.who_changes()} may send it (read-only: "
                    f"{', '.join(sorted(READ_ONLY))})"
                )
            body = self._handler(req, cred)
        except errors.GputunedError as exc:
            return failed(exc)
        except Exception as exc:
            log.exception("control socket: command %r from %s failed", cmd[:40], cred)
            # Only root sees the exception's text: it may quote a file the peer cannot read.
            what = f"{type(exc).__name__}: {exc}" if cred.uid == 0 else type(exc).__name__
            return internal(cmd, what[:500])
        if not isinstance(body, dict):
            return internal(cmd, f"its handler returned {type(body).__name__}, not an object")
        resp: dict[str, Any] = {"v": PROTOCOL_VERSION, "ok": True}
        resp.update(body)
        resp["v"] = PROTOCOL_VERSION
        try:
            encode(resp)
        except (TypeError, ValueError) as exc:
            return internal(cmd, f"its result is not JSON: {exc}")
        return resp

    # -- setting up ----------------------------------------------------------------------

    def _listen(self) -> tuple[socket.socket, tuple[int, int]]:
        parent = self.path.rsplit("/", 1)[0] or "/"
        ensure_dir(self.kernel, parent)
        _remove_stale(self._real, self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                via_short_path(self._real, sock.bind)
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
                self._set_mode(parent)
            except OSError as exc:
                os.unlink(self._real)
                raise _mode_error(exc, self.path) from exc
            # Only now may connections queue: the file already has its final mode and group.
            sock.listen(MAX_CLIENTS)
        except BaseException:
            sock.close()
            raise
        return sock, (st.st_dev, st.st_ino)

    def _set_mode(self, parent: str) -> None:
        # One file has one group: the control group's when there is one (admin_group members
        # then need to be in it too to reach the file), else the admin group's.
        gid = self.access.control_gid
        gid = self.access.admin_gid if gid is None else gid
        if gid is None:
            os.chmod(self._real, 0o600)
            return
        os.chown(self._real, -1, gid)
        os.chmod(self._real, 0o660)
        self._dir_mode = _open_for_search(str(self.kernel.path(parent)), parent)


def _mode_error(exc: OSError, hpath: str) -> errors.HostError:
    if exc.errno == E.EPERM:
        return errors.PermissionDenied(
            f"set the group of {hpath}: permission denied (EPERM); giving the socket to the "
            "control group needs CAP_CHOWN (add it to CapabilityBoundingSet= of the unit)",
            path=hpath,
            errno=exc.errno,
        )
    return translate(exc, "set the mode of", hpath)


def _group_gid(group: str, key: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise errors.InvalidValue(
            f"[daemon] {key} {group!r} does not exist; create it (groupadd {group}) or "
            "leave the setting out (root only)"
        ) from None


def _open_for_search(real_dir: str, hpath: str) -> int | None:
    """Give everyone search (not read) permission on the socket's directory; return the mode
    it had when it changed (to put back at close), else None.

    The group's 0660 on the socket is checked only after path lookup reaches it; /run/gputuned
    is 0700. Search alone lists nothing, and the journal and lock inside stay 0600.
    """
    mode = stat.S_IMODE(os.stat(real_dir).st_mode)
    if mode & 0o011 == 0o011:
        return None
    log.info(
        "control socket: %s made searchable (mode %o) for the control group", hpath, mode | 0o011
    )
    os.chmod(real_dir, mode | 0o011)  # noqa: S103  search only; nothing is listed
    return mode


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
        pid = probe(real)
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
