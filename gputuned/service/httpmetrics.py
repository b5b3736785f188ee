"""A tiny HTTP server for Prometheus: ``GET /metrics`` on a local port, driven by the daemon's loop.

Off unless the profile's ``[daemon] metrics_port`` sets a port. It binds ``metrics_address``
(127.0.0.1 unless set). The figures name processes (their PIDs and commands), which a host
mounting /proc with ``hidepid`` keeps from other users, so not every local user may scrape
(issue 14, finding 10):

- a connection from this machine is let in when the user that owns the client's socket (the
  kernel says, :mod:`gputuned.service.sockdiag`) is root, or is named in ``metrics_allow`` (a
  user name, or ``@group`` for every member of a group);
- a connection from elsewhere is let in when its address lies in a network named there
  (``10.0.0.0/8``, ``2001:db8::/32``; a bare address is a /32 or /128);
- everyone else gets ``403 Forbidden`` at once, before any figure is collected.

Like the control socket it never blocks the daemon (:mod:`gputuned.service.sockserve`): every
socket is non-blocking, output the socket buffer does not take waits for a writable event.
Scrapes never delay the daemon's real work: the figures are collected at most once per
``min_interval_s`` (1 s) whatever the number of scrapers, and the daemon's loop takes process
events before any scraper that became readable at the same time.

HTTP/1.0 and 1.1 requests are answered once and the connection closed (``Connection: close``);
``GET`` and ``HEAD`` of ``/metrics`` (any query string) give the exposition text, ``/`` a
pointer to it, other paths 404, other methods 405. A request head over 8 KiB gets 431, one not
complete 5 s after the connection was accepted is dropped, a 17th concurrent client gets 503.
"""

from __future__ import annotations

import errno as E
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any

from gputuned import errors
from gputuned.kernel.oserrors import translate
from gputuned.kernel.users import GroupCache
from gputuned.service.sockdiag import tcp_owner
from gputuned.service.sockserve import Client, StreamServer

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_HEAD = 8192
MAX_CLIENTS = 16
IDLE_TIMEOUT_S = 5.0
SEND_TIMEOUT_S = 1.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: (client address, our address) -> the uid owning the client's socket, None when not local.
OwnerOf = Callable[[tuple[str, int], tuple[str, int]], int | None]


class Allowed:
    """Who may scrape: root and ``uids`` or members of ``gids`` from this machine, and the
    clients of ``networks`` from others."""

    def __init__(
        self,
        uids: Iterable[int] = (),
        gids: Iterable[int] = (),
        networks: Iterable[Network] = (),
        *,
        owner_of: OwnerOf = tcp_owner,
    ) -> None:
        self.uids = frozenset(uids)
        self.gids = frozenset(gids)
        self.networks = tuple(networks)
        self._owner_of = owner_of
        self._groups = GroupCache()

    def check(self, client: tuple[str, int], server: tuple[str, int]) -> str | None:
        """Why the client is refused (None: let in)."""
        uid = self._owner_of(client, server)
        if uid is not None:
            if uid == 0 or uid in self.uids or self.gids & self._groups.groups(uid):
                return None
            return f"local user {uid} is not in [daemon] metrics_allow"
        addr = ipaddress.ip_address(client[0].split("%", 1)[0])
        if any(addr in net for net in self.networks):
            return None
        return f"{client[0]} is not in a network of [daemon] metrics_allow"


class MetricsServer(StreamServer):
    """Serve ``render()`` at ``http://ADDRESS:PORT/metrics`` to the clients ``allowed`` lets in.

    ``render`` runs in the daemon's thread, at most once per ``min_interval_s``; an exception
    becomes a 500 (logged). ``clock`` gives monotonic seconds for deadlines and the cache.
    """

    name = "metrics"
    idle_timeout_s = IDLE_TIMEOUT_S
    send_timeout_s = SEND_TIMEOUT_S
    recv_size = MAX_HEAD + 1
    accept_per_turn = 16
    min_interval_s = 1.0

    def __init__(
        self,
        render: Callable[[], str],
        *,
        port: int,
        address: str = "127.0.0.1",
        allowed: Allowed | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._render = render
        self.address = address
        self.allowed = allowed if allowed is not None else Allowed()
        self._cache: tuple[float, str] | None = None
        self.renders = 0  # how often the figures were collected (tests, docs)
        super().__init__(self._listen(address, port), clock=clock)
        self.port: int = self._sock.getsockname()[1]

    # -- StreamServer --------------------------------------------------------------------

    def admit(self, conn: socket.socket, addr: Any) -> tuple[Any, bytes | None]:
        if len(self.client_fds()) >= MAX_CLIENTS:
            return addr, _response(503, "too many scrapers at once; retry\n")
        why = self.allowed.check(addr[:2], self._sock.getsockname()[:2])
        if why is not None:
            log.info("metrics: refused %s: %s", addr[0], why)
            return addr, _response(403, f"not allowed: {why}\n")
        return addr, None

    def take(self, client: Client) -> None:
        if client.eof and not client.inbuf:
            self.drop(client)
            return
        end = _head_end(client.inbuf)
        if end < 0:
            if len(client.inbuf) > MAX_HEAD:
                self.send(
                    client, _response(431, f"request head over {MAX_HEAD} bytes\n"), hang_up=True
                )
            elif client.eof:
                self.drop(client)
            return
        head = bytes(client.inbuf[:end])
        client.inbuf.clear()
        self.send(client, self._respond(head), hang_up=True)

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _listen(address: str, port: int) -> socket.socket:
        where = f"{address}:{port}"
        try:
            family = (
                socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
            )
            sock = socket.socket(family, socket.SOCK_STREAM)
        except ValueError:
            raise errors.InvalidValue(
                f"metrics address {address!r} is not an IP address; set [daemon] metrics_address "
                "to one, such as 127.0.0.1"
            ) from None
        except OSError as exc:
            # EAFNOSUPPORT/EPERM: a sandbox without IP (systemd RestrictAddressFamilies=).
            raise translate(exc, "open a TCP socket for metrics port", where) from exc
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno == E.EADDRINUSE:
                    raise errors.Busy(
                        f"metrics port {where} is in use by another program; choose "
                        "another [daemon] metrics_port, or leave it unset to turn metrics off",
                        path=where,
                        errno=exc.errno,
                    ) from exc
                raise translate(exc, "bind metrics port", where) from exc
            sock.listen(MAX_CLIENTS)
        except BaseException:
            sock.close()
            raise
        return sock

    def _figures(self) -> str:
        """The exposition text, collected at most once per ``min_interval_s``."""
        now = self._clock()
        if self._cache is not None and now - self._cache[0] < self.min_interval_s:
            return self._cache[1]
        self.renders += 1
        text = self._render()
        self._cache = (now, text)
        return text

    def _respond(self, head: bytes) -> bytes:
        line = head.split(b"\n", 1)[0].strip().decode("latin-1")
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response(400, "send an HTTP request: GET /metrics HTTP/1.1\n")
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response(405, "only GET and HEAD\n", extra="Allow: GET, HEAD\r\n")
        if target == "/metrics":
            try:
                body = self._figures()
            except Exception:
                log.exception("metrics: collecting the figures failed")
                return _response(500, "collecting the metrics failed; see gputuned's log\n")
            return _response(200, body, content_type=CONTENT_TYPE, head_only=method == "HEAD")
        if target == "/":
            return _response(200, "gputuned metrics: /metrics\n", head_only=method == "HEAD")
        return _response(404, "not found; the metrics are at /metrics\n")


def _head_end(buf: bytearray) -> int:
    """Length of the request head (through the blank line), or -1 while incomplete."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        i = buf.find(sep, 0, MAX_HEAD + len(sep))
        if i >= 0:
            return i + len(sep)
    return -1


def _response(
    status: int,
    body: str,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: str = "",
    head_only: bool = False,
) -> bytes:
    data = body.encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(data)}\r\n"
        f"Connection: close\r\n{extra}\r\n"
    )
    return head.encode("latin-1") + (b"" if head_only else data)
