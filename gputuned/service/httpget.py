"""One HTTP GET of a server's metrics under one deadline (``gputunectl trial``'s reading of a
Prometheus endpoint: gputuned/trial/scrape.py).

The server is another program, and on a shared host perhaps not the one meant; so:

- **One deadline for the whole exchange**: connecting, the status line and headers, the body.
  Each read waits at most the time left. A socket timeout alone starts again at every byte: an
  endpoint that sent a byte every 2 s held trial 16 s, and its numbers were used (issue 30,
  item 5). Past the deadline the answer is an error, and nothing of it is used.
- **A size limit** on the answer (the caller's, plus 64 KiB of status line and headers).
- **No redirects**: a 3xx is an error naming where it pointed; trial reads the endpoint it was
  given, or none.
- **A server on this host is read only when its socket belongs to the server's user or to
  root.** Any local user may listen on a free port: on the server's port while the server
  restarts, or before it starts, and then feed trial numbers that make the side of their choice
  win. Before the request is sent, the kernel names the owner of the server's end of this very
  connection (``NETLINK_SOCK_DIAG``, gputuned/service/sockdiag.py): the listener's owner, or
  the accepting process's once accepted. An answer without an owner (a closed connection, or
  no answer at all for a loopback address) is refused too: nothing vouches for it.

Name resolution is the system resolver's and outside the deadline (an address needs none).
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import socket
import ssl
import time
import urllib.parse
from collections.abc import Collection
from typing import cast

from gputuned import errors
from gputuned.service import sockdiag
from gputuned.textsafe import printable

#: Room for the status line and the headers, beyond the body's limit.
MAX_HEAD = 64 << 10
#: How long a connection's server end may stay without an owner the kernel reports (a
#: handshake the server's side has not finished: NEW_SYN_RECV) before it is refused.
OWNER_WAIT_S = 0.2


def get(url: str, *, timeout: float, max_bytes: int, owners: Collection[int]) -> bytes:
    """The body of ``url`` (http or https), read within ``timeout`` seconds in all; a server
    on this host only if its socket is owned by a uid in ``owners`` or by root. HostError
    for anything else: past the deadline, too large, a status other than 200, a redirect."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise _failed(url, f"its port: {exc}") from exc
    end = time.monotonic() + timeout
    sock = _connect(url, host, port, end, timeout)
    try:
        _check_owner(url, sock, owners, end)
        if parts.scheme == "https":
            sock.settimeout(_left(url, end, timeout))
            # The handshake as a whole waits at most the time left (CPython's _ssl keeps its own
            # deadline across the handshake's reads, from the socket's timeout).
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        # HTTP/1.0: the server answers with a length or by closing, not in chunks, and closes.
        request = (
            f"GET {target} HTTP/1.0\r\nHost: {parts.netloc.rpartition('@')[2]}\r\n"
            "Accept-Encoding: identity\r\n"
            "User-Agent: gputunectl-trial\r\nConnection: close\r\n\r\n"
        )
        sock.settimeout(_left(url, end, timeout))
        sock.sendall(request.encode("ascii", "replace"))
        raw = _read(url, sock, end, timeout, max_bytes + MAX_HEAD)
    except (OSError, ssl.SSLError) as exc:
        if isinstance(exc, TimeoutError):
            raise _late(url, timeout) from exc
        raise _failed(url, str(exc)) from exc
    finally:
        sock.close()
    return _body(url, raw, max_bytes)


def _connect(url: str, host: str, port: int, end: float, timeout: float) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise _failed(url, f"{host!r}: {exc}") from exc
    last: OSError | None = None
    for family, kind, proto, _name, addr in infos:
        left = _left(url, end, timeout)
        sock: socket.socket | None = None
        try:
            sock = socket.socket(family, kind, proto)
            sock.settimeout(left)
            sock.connect(addr)
            return sock
        except OSError as exc:
            if sock is not None:
                sock.close()
            if isinstance(exc, TimeoutError):
                raise _late(url, timeout) from exc
            last = exc
    raise _failed(url, str(last or "no address"))


def _check_owner(url: str, sock: socket.socket, owners: Collection[int], end: float) -> None:
    """Refuse a server on this host whose socket is not the server's user's or root's."""
    local, server = _plain(sock.getsockname()), _plain(sock.getpeername())
    loopback = ipaddress.ip_address(server[0].split("%", 1)[0]).is_loopback
    at = f"[{server[0]}]:{server[1]}" if ":" in server[0] else f"{server[0]}:{server[1]}"
    wait_until = min(end, time.monotonic() + OWNER_WAIT_S)
    while True:
        try:
            found = sockdiag.tcp_socket(server, local)
        except OSError as exc:
            raise errors.HostError(
                f"not reading {url}: the kernel did not say who owns the socket at {at} "
                f"(sock_diag: {exc}); trial reads a server on this host only when its socket is "
                "the server's user's or root's",
                path=url,
            ) from exc
        if found is not None and found.uid is not None:
            break
        if found is None and not loopback:
            return  # not a socket of this host (and network namespace): another machine
        if time.monotonic() >= wait_until:
            state = "none found" if found is None else f"TCP state {found.state}, no owner"
            raise errors.HostError(
                f"not reading {url}: the kernel names no owner for the socket at {at} "
                f"({state}); trial reads a server on this host only when its socket is the "
                "server's user's or root's",
                path=url,
            )
        time.sleep(0.005)
    if found.uid == 0 or found.uid in owners:
        return
    whose = f"uid {', '.join(str(u) for u in sorted(owners))}" if owners else "none found"
    raise errors.HostError(
        f"not reading {url}: the socket at {at} belongs to uid {found.uid}, not to the user of "
        f"the server trial measures ({whose}) or root; another local user may have taken "
        "the port. Check who listens there (ss -ltnpe), or give the server's process with "
        "--pid",
        path=url,
    )


def _plain(addr: tuple[str, int] | tuple[str, int, int, int]) -> tuple[str, int]:
    """(host, port), an IPv4-mapped IPv6 address as the IPv4 address it is."""
    ip = ipaddress.ip_address(addr[0].split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped), addr[1]
    return addr[0], addr[1]


def _read(url: str, sock: socket.socket, end: float, timeout: float, cap: int) -> bytes:
    """Everything the server sends until it closes, or until the length its headers give,
    each read waiting at most the time left."""
    buf = bytearray()
    need: int | None = None
    head_seen = False
    while need is None or len(buf) < need:
        sock.settimeout(_left(url, end, timeout))
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > cap:
            raise errors.HostError(f"{url}: more than {cap - MAX_HEAD} bytes of metrics; refused")
        if not head_seen and (cut := buf.find(b"\r\n\r\n")) >= 0:
            head_seen = True
            length = _check_head(url, _parsed(url, bytes(buf[: cut + 4])))
            need = None if length is None else cut + 4 + length
    if time.monotonic() >= end:
        raise _late(url, timeout)
    if need is not None and len(buf) < need:
        raise _failed(url, f"the answer ended after {len(buf)} of its {need} bytes")
    return bytes(buf)


def _check_head(url: str, resp: http.client.HTTPResponse) -> int | None:
    """The body's length when the headers give one; HostError for a status other than 200."""
    if 300 <= resp.status < 400:
        where = printable((resp.getheader("Location") or "nowhere")[:500])
        raise errors.HostError(
            f"{url}: the server answered {resp.status}, redirecting to {where}; not followed "
            "(give trial the endpoint itself)",
            path=url,
        )
    if resp.status != 200:
        reason = printable(resp.reason[:200])
        raise errors.HostError(f"{url}: the server answered {resp.status} {reason}", path=url)
    if resp.getheader("Content-Encoding", "identity").strip().lower() != "identity":
        raise errors.HostError(f"{url}: the answer is compressed, though none was asked for")
    return resp.length if not resp.chunked else None


def _body(url: str, raw: bytes, max_bytes: int) -> bytes:
    resp = _parsed(url, raw)
    _check_head(url, resp)
    try:
        body = resp.read(max_bytes + 1)
    except http.client.HTTPException as exc:
        raise _failed(url, f"the answer was cut short or malformed ({exc!r})") from exc
    if len(body) > max_bytes:
        raise errors.HostError(f"{url}: more than {max_bytes} bytes of metrics; refused")
    return body


class _Canned:
    """Bytes already read, in the shape http.client reads a response from."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, *_args: object, **_kw: object) -> io.BytesIO:
        return io.BytesIO(self._data)


def _parsed(url: str, raw: bytes) -> http.client.HTTPResponse:
    resp = http.client.HTTPResponse(cast(socket.socket, _Canned(raw)))
    try:
        resp.begin()
    except http.client.HTTPException as exc:
        raise _failed(url, f"not an HTTP answer ({exc!r})") from exc
    return resp


def _left(url: str, end: float, timeout: float) -> float:
    left = end - time.monotonic()
    if left <= 0:
        raise _late(url, timeout)
    return left


def _late(url: str, timeout: float) -> errors.HostError:
    return errors.HostError(
        f"{url}: no complete answer within {timeout:g} s (a server that answers slowly, or one "
        "byte at a time, is not waited for); this reading is not used",
        path=url,
    )


def _failed(url: str, why: str) -> errors.HostError:
    return errors.HostError(
        f"could not read {url}: {printable(why)}; is the server up and its metrics endpoint at "
        "that address?",
        path=url,
    )
