"""The client side of the control socket (``gputunectl``), and the socket helpers both sides use.

Paths longer than ``sun_path`` allows (108 bytes, deep ``--root`` trees) are connected (and
bound, by the server) through ``/proc/self/fd/<dirfd>/<name>`` of the socket's directory.
"""

from __future__ import annotations

import contextlib
import errno as E
import json
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from gputuned import errors, exitcodes
from gputuned.kernel import Kernel
from gputuned.kernel.oserrors import translate
from gputuned.service.controlproto import PROTOCOL_VERSION, PeerCred, encode

CONTROL_SOCKET = "/run/gputuned/control.sock"
_PROBE_TIMEOUT_S = 2.0
_MAX_RESPONSE = 64 << 20
# struct ucred (include/linux/socket.h): pid_t pid; uid_t uid; gid_t gid.
_UCRED = struct.Struct("3i")
# sizeof(sockaddr_un.sun_path), NUL included (include/uapi/linux/un.h).
_SUN_PATH_MAX = 108
NOT_RUNNING = (E.ENOENT, E.ECONNREFUSED, E.ENOTDIR)


def peercred(sock: socket.socket) -> PeerCred:
    return PeerCred(
        *_UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    )


def via_short_path(real: str, op: Callable[[str], None]) -> None:
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


def probe(real: str) -> int:
    """Connect to the socket at ``real`` and return the PID of whoever listens (OSError if none)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(_PROBE_TIMEOUT_S)
        via_short_path(real, s.connect)
        return peercred(s).pid


def request(
    kernel: Kernel,
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
    line = encode({"v": PROTOCOL_VERSION, **message})
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            via_short_path(str(kernel.path(path)), s.connect)
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


def daemon_running(kernel: Kernel, path: str = CONTROL_SOCKET) -> bool:
    """True when a daemon answers on the control socket.

    Also True when the socket exists but its mode keeps this user out: a non-root user cannot
    tell a live daemon from a stale file then, and must be told to use root either way.
    """
    try:
        probe(str(kernel.path(path)))
    except TimeoutError:
        return True  # its queue is full: alive, busy
    except OSError as exc:
        if exc.errno in NOT_RUNNING:
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
    if exc.errno in NOT_RUNNING:
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
        raise _daemon_error(resp)
    return resp


#: The exit statuses an error reply may carry: 0-2 are results, never an error's.
_ERROR_CODES = frozenset(c.code for c in exitcodes.TABLE) - {
    exitcodes.OK,
    exitcodes.DRIFTED,
    exitcodes.PENDING_REBOOT,
}


def _daemon_error(resp: dict[str, Any]) -> errors.DaemonError:
    """The daemon's error reply as the error the command raised there: its message, class and
    exit status (a daemon older than these fields: exit 3, as before)."""
    code = resp.get("exit_code")
    cls = resp.get("error_class")
    problems = resp.get("problems")
    return errors.DaemonError(
        str(resp.get("error") or "gputuned daemon reported an error"),
        error_class=cls if isinstance(cls, str) and cls.isidentifier() else "GputunedError",
        exit_code=code if type(code) is int and code in _ERROR_CODES else exitcodes.ERROR,
        problems=[(str(p.get("key", "")), str(p.get("message", ""))) for p in problems]
        if isinstance(problems, list) and all(isinstance(p, dict) for p in problems)
        else None,
    )
