"""A tiny HTTP server for Prometheus: ``GET /metrics`` on a local port, driven by the daemon's loop.

Off unless the profile's ``[daemon] metrics_port`` sets a port. It binds 127.0.0.1 only: the
figures name processes, and a scraper on another machine can go through node_exporter's textfile
collector (``gputunectl verify --prometheus FILE``) or a local proxy.

Like :class:`gputuned.host.control.ControlServer` it never blocks the daemon: every socket is
non-blocking and driven by the daemon's selector. :meth:`MetricsServer.attach` registers the
listening socket and each client with a :class:`~gputuned.host.loop.Loop` and unregisters a
client *before* closing it (a closed fd's number is reused by the next accept; a registration
left behind would hide the new client). Without ``attach``, watch :meth:`fileno` and
:meth:`client_fds` and call :meth:`on_readable` yourself.

HTTP/1.0 and 1.1 requests are answered once and the connection closed (``Connection: close``);
``GET`` and ``HEAD`` of ``/metrics`` (any query string) give the exposition text, ``/`` a
pointer to it, other paths 404, other methods 405. A request head over 8 KiB gets 431, one not
complete 5 s after the connection was accepted is dropped, a 17th concurrent client gets 503.
"""

from __future__ import annotations

import errno as E
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.host.fs import translate

if TYPE_CHECKING:
    from gputuned.host.loop import Loop

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_HEAD = 8192
MAX_CLIENTS = 16
IDLE_TIMEOUT_S = 5.0
SEND_TIMEOUT_S = 1.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass
class _Client:
    sock: socket.socket
    accepted: float
    buf: bytearray = field(default_factory=bytearray)


class MetricsServer:
    """Serve ``render()`` at ``http://ADDRESS:PORT/metrics``.

    ``render`` runs in the daemon's thread on each scrape; an exception becomes a 500 (logged).
    ``clock`` gives monotonic seconds for the 5 s request deadline.
    """

    def __init__(
        self,
        render: Callable[[], str],
        *,
        port: int,
        address: str = "127.0.0.1",
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self._render = render
        self._clock = clock or time.monotonic
        self._clients: dict[int, _Client] = {}
        self._loop: Loop | None = None
        self.address = address
        self._sock = self._listen(address, port)
        self.port: int = self._sock.getsockname()[1]

    # -- the daemon's side ---------------------------------------------------------------

    def fileno(self) -> int:
        return self._sock.fileno()

    def client_fds(self) -> list[int]:
        return list(self._clients)

    def attach(self, loop: Loop) -> None:
        """Let ``loop`` drive this server: the listening socket and every client as it comes."""
        self._loop = loop
        loop.add_reader(self.fileno(), self.on_readable)

    def on_readable(self, fd: int) -> None:
        """Accept (listening fd), or read a client's request and answer it once it is whole."""
        if fd == self._sock.fileno():
            self._accept_all()
        elif (client := self._clients.get(fd)) is not None:
            self._read(client)

    def expire(self, now: float) -> None:
        """Drop clients whose request is not complete ``IDLE_TIMEOUT_S`` after accept."""
        for client in list(self._clients.values()):
            if now - client.accepted > IDLE_TIMEOUT_S:
                log.info("metrics: dropped a client: request not complete in %g s", IDLE_TIMEOUT_S)
                self._drop(client)

    def close(self) -> None:
        for client in list(self._clients.values()):
            self._drop(client)
        if self._sock.fileno() >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------

    @staticmethod
    def _listen(address: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno == E.EADDRINUSE:
                    raise errors.Busy(
                        f"metrics port {address}:{port} is in use by another program; choose "
                        "another [daemon] metrics_port, or leave it unset to turn metrics off",
                        path=f"{address}:{port}",
                        errno=exc.errno,
                    ) from exc
                raise translate(exc, "bind metrics port", f"{address}:{port}") from exc
            sock.listen(MAX_CLIENTS)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _accept_all(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE and friends: leave the rest queued
                log.warning("metrics: accept failed: %s", exc)
                return
            conn.setblocking(False)
            if len(self._clients) >= MAX_CLIENTS:
                _send_and_close(conn, _response(503, "too many scrapers at once; retry\n"))
                continue
            client = _Client(conn, self._clock())
            self._clients[conn.fileno()] = client
            if self._loop is not None:
                self._loop.add_reader(conn.fileno(), self.on_readable)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(MAX_HEAD + 1)
        except BlockingIOError:
            return
        except OSError:
            self._drop(client)
            return
        if not data:
            self._drop(client)
            return
        client.buf += data
        end = _head_end(client.buf)
        if end < 0:
            if len(client.buf) > MAX_HEAD:
                self._answer(client, _response(431, f"request head over {MAX_HEAD} bytes\n"))
            return
        self._answer(client, self._respond(bytes(client.buf[:end])))

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
                body = self._render()
            except Exception:
                log.exception("metrics: collecting the figures failed")
                return _response(500, "collecting the metrics failed; see gputuned's log\n")
            return _response(200, body, content_type=CONTENT_TYPE, head_only=method == "HEAD")
        if target == "/":
            return _response(200, "gputuned metrics: /metrics\n", head_only=method == "HEAD")
        return _response(404, "not found; the metrics are at /metrics\n")

    def _answer(self, client: _Client, data: bytes) -> None:
        try:
            client.sock.settimeout(SEND_TIMEOUT_S)
            client.sock.sendall(data)
            # Closing with unread input makes the kernel send RST, which can destroy the answer
            # before the client reads it (a refused, over-long request): read what is there.
            client.sock.setblocking(False)
            for _ in range(16):
                if not client.sock.recv(65536):
                    break
        except BlockingIOError:
            pass
        except OSError as exc:  # TimeoutError included: the scraper stopped reading
            log.info("metrics: could not answer a client: %s", exc)
        self._drop(client)

    def _drop(self, client: _Client) -> None:
        fd = client.sock.fileno()
        self._clients.pop(fd, None)
        if self._loop is not None and fd >= 0:
            self._loop.remove_reader(fd)  # before close: the number is free again after it
        client.sock.close()


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


def _send_and_close(sock: socket.socket, data: bytes) -> None:
    """Best effort: a short answer into an empty socket buffer never blocks. A request that
    arrives after the close is answered by a reset instead: acceptable when overloaded."""
    try:
        sock.send(data)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(65536)
    except OSError:
        pass
    finally:
        sock.close()
