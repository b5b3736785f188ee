"""Who owns the other end of a local TCP connection: one NETLINK_SOCK_DIAG look-up.

A TCP peer has no ``SO_PEERCRED``. For a connection from this machine the kernel still knows
the client's socket and the user that created it: ``ss -e`` shows it as ``uid:``. The metrics
port asks the same question to let only the users it names scrape (issue 14, finding 10); trial
asks it of the server's end of its own connection, to read a local metrics endpoint only from
the server's user or root (issue 30, item 5: gputuned/service/httpget.py).

One request, ``SOCK_DIAG_BY_FAMILY`` with the exact 4-tuple of the client's socket and no dump
flag, makes the kernel look that one socket up (net/ipv4/inet_diag.c,
``inet_diag_dump_one_icsk``) and answer with an ``inet_diag_msg`` whose ``idiag_uid`` is its
owner (``sock_i_uid``). Layouts from include/uapi/linux/{netlink,sock_diag,inet_diag}.h.
A socket in another network namespace is not found: such a peer is not treated as local.
"""

from __future__ import annotations

import errno as E
import ipaddress
import socket
import struct
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 2
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
# struct nlmsghdr: u32 len, u16 type, u16 flags, u32 seq, u32 pid
_NLMSGHDR = struct.Struct("=IHHII")
# struct inet_diag_req_v2: u8 family, protocol, ext, pad; u32 states; then inet_diag_sockid:
# be16 sport, be16 dport, be32 src[4], be32 dst[4], u32 if, u32 cookie[2]
_REQ = struct.Struct("=BBBBI")
_SOCKID = struct.Struct(">HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# struct inet_diag_msg: u8 family, state, timer, retrans; sockid (48 bytes); u32 expires,
# rqueue, wqueue, uid, inode
_UID_OFFSET = 4 + 48 + 12


def _packed(addr: str) -> tuple[int, bytes]:
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if ip.version == 4:
        return socket.AF_INET, ip.packed + bytes(12)
    return socket.AF_INET6, ip.packed


TCP_ESTABLISHED = 1
TCP_TIME_WAIT = 6
TCP_NEW_SYN_RECV = 12
# States the kernel answers with uid 0 whatever the owner: a connection in TIME-WAIT (also the
# orphaned FIN-WAIT-2 kept as a time-wait socket: inet_twsk_diag_fill) and a request not yet
# answered by the client's final ACK (inet_req_diag_fill). That 0 is not root.
_NO_OWNER = frozenset({TCP_TIME_WAIT, TCP_NEW_SYN_RECV})


@dataclass(frozen=True)
class TcpSocket:
    """The kernel's answer for one TCP socket: its state (include/net/tcp_states.h) and its
    owner, None where the kernel reports none for that state."""

    state: int
    uid: int | None


def tcp_owner(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid that owns the TCP socket at ``client`` connected to ``server``, or None when
    the kernel knows no such socket here (another host, another network namespace, gone)."""
    found = _ask(client, server)
    return None if found is None else found[1]


def tcp_socket(local: tuple[str, int], remote: tuple[str, int]) -> TcpSocket | None:
    """The TCP socket of this host at ``local`` connected to ``remote``: None when the kernel
    knows none here (another host, another network namespace).

    Asked with the server's address as ``local`` and a client's as ``remote``, it is the
    server's end of that connection: the kernel looks for the connection first and falls back
    on the listening socket at ``local`` (inet_lookup). Until the server accepts it, the
    connection's socket is a clone of the listener's, owner included (sk_clone_lock); once
    accepted, its owner is the accepting process's (sock_graft, include/net/sock.h)."""
    found = _ask(local, remote)
    if found is None:
        return None
    state, uid = found
    return TcpSocket(state, None if state in _NO_OWNER else uid)


def _ask(local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
    """(state, uid) of the socket at ``local`` connected to ``remote``; None: not found."""
    family, src = _packed(local[0])
    family2, dst = _packed(remote[0])
    if family != family2:
        return None
    sockid = _SOCKID.pack(local[1], remote[1], src, dst) + _SOCKID_TAIL.pack(
        0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE
    )
    body = _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, _ALL_STATES) + sockid
    msg = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)  # the answer is queued before sendto returns; this is a backstop
        nl.sendto(msg + body, (0, 0))
        data = nl.recv(8192)
    if len(data) < _NLMSGHDR.size:
        return None
    _length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data)
    if kind == NLMSG_ERROR:
        (err,) = struct.unpack_from("=i", data, _NLMSGHDR.size)
        if -err in (E.ENOENT, 0):
            return None
        raise OSError(-err, f"sock_diag look-up: {E.errorcode.get(-err, err)}")
    if kind != SOCK_DIAG_BY_FAMILY or len(data) < _NLMSGHDR.size + _UID_OFFSET + 4:
        return None
    state = data[_NLMSGHDR.size + 1]
    (uid,) = struct.unpack_from("=I", data, _NLMSGHDR.size + _UID_OFFSET)
    return state, int(uid)
