"""Non-blocking stream socket servers driven by the daemon's loop: what the control socket and
the metrics port share.

Both serve clients the daemon must never wait for, and both may be talked to by other users'
programs (issue 14). So:

- every socket is non-blocking and driven by :class:`~gputuned.service.loop.Loop` (or, without
  one, by a caller that watches :meth:`StreamServer.fileno`, :meth:`StreamServer.client_fds`
  and :meth:`StreamServer.writing_fds` and calls the ``on_*`` methods);
- a client is admitted or refused at accept (:meth:`StreamServer.admit`: who it is, how many
  connections it holds), and a refusal is one short answer and a hang-up;
- input is read into the client's buffer only; the subclass says what a whole request is and
  answers it (:meth:`StreamServer.take`), or leaves it for :meth:`StreamServer.serve`, which
  the daemon calls once per loop turn with a budget, so one client's burst of requests waits
  behind everyone else's next one;
- output is written without blocking: what the socket buffer does not take waits for a
  writable event, and a client that takes none of it for ``send_timeout_s`` is dropped (a
  client that stops reading its answers must not hold the daemon, as ``sendall`` did);
- every client has a deadline: its next request must be complete ``idle_timeout_s`` after it
  connected or was last answered, or it is dropped (a connection that sends nothing holds a
  slot too, and trickling one byte at a time does not extend it).

A client is unregistered from the loop *before* its socket is closed: the kernel reuses the fd
number at the next accept, and a registration left behind would hide the new client.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gputuned.service.loop import Loop

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Client:
    sock: socket.socket
    fd: int
    peer: Any
    #: Monotonic time by which the next request must be complete.
    deadline: float
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    #: Monotonic time by which pending output must have been taken (None: nothing pending).
    out_deadline: float | None = None
    #: Close once the output is sent.
    hang_up: bool = False
    #: The peer shut its side down: no more input will come.
    eof: bool = False


class StreamServer:
    """A listening socket and its clients. Subclasses set the limits and implement
    :meth:`admit`, :meth:`take` and, where requests wait for a budget, :meth:`pending` and
    :meth:`serve`."""

    name = "server"
    idle_timeout_s = 10.0
    send_timeout_s = 1.0
    recv_size = 65536
    #: Connections accepted per readable event of the listening socket: a flood of connects
    #: is taken a slice per loop turn, between everything else the loop has to do.
    accept_per_turn = 64

    def __init__(self, sock: socket.socket, *, clock: Callable[[], float] | None = None) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._clock = clock or time.monotonic
        self._clients: dict[int, Client] = {}
        self._loop: Loop | None = None
        self._priority = 0

    # -- the loop's side -----------------------------------------------------------------

    def fileno(self) -> int:
        return self._sock.fileno()

    def client_fds(self) -> list[int]:
        return list(self._clients)

    def writing_fds(self) -> list[int]:
        """Clients with output waiting for the socket to take it."""
        return [fd for fd, c in self._clients.items() if c.outbuf]

    def attach(self, loop: Loop, *, priority: int = 0) -> None:
        """Let ``loop`` drive this server: the listening socket and every client as it comes."""
        self._loop = loop
        self._priority = priority
        loop.add_reader(self.fileno(), self.on_readable, priority=priority)

    def on_readable(self, fd: int) -> None:
        if fd == self._sock.fileno():
            self._accept_some()
        elif (client := self._clients.get(fd)) is not None:
            self._read(client)

    def on_writable(self, fd: int) -> None:
        if (client := self._clients.get(fd)) is not None:
            self._flush(client)

    def pending(self) -> bool:
        """Whether complete requests wait for :meth:`serve` (then the loop must not sleep)."""
        return False

    def serve(self) -> None:
        """Answer requests that wait, within this turn's budget."""

    def expire(self, now: float) -> None:
        """Drop clients past a deadline: output not taken, or the next request not complete."""
        for client in list(self._clients.values()):
            if client.out_deadline is not None and now > client.out_deadline:
                log.info("%s: dropped %s: it does not read its answers", self.name, client.peer)
                self.drop(client)
            elif now > client.deadline and not self.waits_for_us(client):
                self.drop(client, self.timed_out(client))

    def close(self) -> None:
        for client in list(self._clients.values()):
            self.drop(client)
        if self._sock.fileno() >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()

    def __enter__(self) -> StreamServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for subclasses ------------------------------------------------------------------

    def admit(self, conn: socket.socket, addr: Any) -> tuple[Any, bytes | None]:
        """Who the new connection is, and the answer that refuses it (None: admitted)."""
        raise NotImplementedError

    def take(self, client: Client) -> None:
        """New input arrived in ``client.inbuf`` (or ``client.eof`` became true)."""
        raise NotImplementedError

    def timed_out(self, client: Client) -> bytes | None:
        """The last words to a client dropped at its deadline."""
        return None

    def waits_for_us(self, client: Client) -> bool:
        """True while the client's deadline must not run: its request waits for a budget."""
        return False

    def send(self, client: Client, data: bytes, *, hang_up: bool = False) -> None:
        """Queue ``data`` and write what the socket takes now; the rest when it is writable."""
        client.outbuf += data
        client.hang_up = client.hang_up or hang_up
        self._flush(client)

    def answered(self, client: Client) -> None:
        """A request of ``client`` was answered: its next one has a full deadline again."""
        client.deadline = self._clock() + self.idle_timeout_s

    def drop(self, client: Client, last: bytes | None = None) -> None:
        """Forget ``client`` and close it, with ``last`` as best-effort final words."""
        if self._clients.pop(client.fd, None) is None:
            return
        if self._loop is not None:  # before close: the number is free again after it
            self._loop.remove_reader(client.fd)
            self._loop.remove_writer(client.fd)
        if (last is not None or client.hang_up) and not client.outbuf:
            _last_words(client.sock, last or b"")
        client.sock.close()

    def clients(self) -> list[Client]:
        return list(self._clients.values())

    # -- internals -----------------------------------------------------------------------

    def _accept_some(self) -> None:
        for _ in range(self.accept_per_turn):
            try:
                conn, addr = self._sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE and friends: leave the rest queued for later
                log.warning("%s: accept failed: %s", self.name, exc)
                return
            conn.setblocking(False)
            try:
                peer, refusal = self.admit(conn, addr)
            except Exception:
                log.exception("%s: checking a new connection failed; refused", self.name)
                peer, refusal = None, b""
            if refusal is not None:
                _last_words(conn, refusal)
                conn.close()
                continue
            client = Client(conn, conn.fileno(), peer, self._clock() + self.idle_timeout_s)
            self._clients[client.fd] = client
            if self._loop is not None:
                self._loop.add_reader(client.fd, self.on_readable, priority=self._priority)

    def _read(self, client: Client) -> None:
        if client.eof:
            return
        try:
            data = client.sock.recv(self.recv_size)
        except BlockingIOError:
            return
        except OSError:
            self.drop(client)
            return
        if not data:
            client.eof = True
            if self._loop is not None:
                self._loop.remove_reader(client.fd)  # EOF stays readable: stop the wake-ups
        else:
            client.inbuf += data
        self.take(client)

    def _flush(self, client: Client) -> None:
        if client.outbuf:
            try:
                sent = client.sock.send(client.outbuf)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                log.info("%s: dropped %s: %s", self.name, client.peer, exc)
                self.drop(client)
                return
            del client.outbuf[:sent]
        if client.outbuf:
            if client.out_deadline is None:
                client.out_deadline = self._clock() + self.send_timeout_s
                if self._loop is not None:
                    self._loop.add_writer(client.fd, self.on_writable)
            return
        if client.out_deadline is not None:
            client.out_deadline = None
            if self._loop is not None:
                self._loop.remove_writer(client.fd)
        if client.hang_up:
            self.drop(client)


def _last_words(sock: socket.socket, data: bytes) -> None:
    """Best effort: one short answer into an empty socket buffer, then a clean hang-up.

    Closing with unread input makes the kernel send RST, which can destroy the answer before
    the client reads it: what is there is read first.
    """
    try:
        sock.setblocking(False)
        if data:
            sock.send(data)
        sock.shutdown(socket.SHUT_WR)
        for _ in range(4):
            if not sock.recv(65536):
                break
    except OSError:
        pass
