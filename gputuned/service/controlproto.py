"""The control protocol (version 1): requests, responses, and who may send which.

Requests and responses
----------------------
- JSON lines. A request is one UTF-8 JSON object ending in ``"\\n"``, with ``"v": 1`` and
  ``"cmd"`` (a non-empty string) beside the command's own fields. Each request gets one response,
  in order: a JSON object ending in ``"\\n"`` with ``"v": 1`` and ``"ok"``; ``true`` comes with
  the command's result fields, ``false`` with ``"error"``: a message that says what to do. A
  client may send several requests on one connection. Blank lines are ignored.
- An error a command raised also carries ``"error_class"`` (its class in gputuned/errors.py)
  and ``"exit_code"`` (gputuned/exitcodes.py), and a profile's ``"problems"``: gputunectl
  exits with that code, as it does without the daemon.
- Errors that leave the connection usable: invalid UTF-8 or JSON (an integer of more digits than
  Python converts, nesting deeper than it parses, included), a value other than an object, a
  missing ``"cmd"``, an unsupported ``"v"`` (``unsupported protocol version X; this daemon
  speaks 1``), a command the peer may not run, and any error the command raises. No request,
  however malformed, ends the daemon: what the parser or a command raises becomes an error
  response, and an internal error names no value (it may come from a file the peer cannot read).

Who may send what (issue 14, finding 7)
---------------------------------------
Checked on every connection from ``SO_PEERCRED`` (unix(7): the peer's pid, euid and egid at
connect time), not only by the file mode. Root (uid 0) may connect; so may members of
``[daemon] control_group`` and of ``[daemon] admin_group`` (primary group, or the supplementary
groups on the ``Groups:`` line of ``/proc/<pid>/status``, read through the kernel port). The
commands are declared once, in :data:`COMMANDS`, and come in two kinds:

- read-only (:data:`READ_ONLY`): every peer allowed to connect;
- changing (:data:`CHANGING`): root, and members of ``admin_group`` when one is named. A member
  of ``control_group`` alone may not renice or pin a process, revert the host or apply a
  profile.

``apply`` carries the profile itself (``"profile"``: the merged profile as ``gputunectl``
loaded it, includes resolved on the client's side) or the name of one in the daemon's profile
directories (``"name"``): the daemon opens no path a client names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gputuned import errors
from gputuned.kernel import Kernel
from gputuned.kernel.procfs import parse_status

PROTOCOL_VERSION = 1
#: Longest request line, without its newline.
MAX_LINE = 65536


@dataclass(frozen=True)
class Command:
    """One command of the control socket. The server refuses a ``changes`` command to a peer
    that may only read; the daemon answers each with its method ``_cmd_<name>``
    (gputuned/daemon/control.py); docs/usage.md lists them."""

    name: str
    #: It changes the host: root's, and the admin group's when there is one.
    changes: bool
    #: What it does, and the request's fields besides "cmd".
    does: str
    #: What the reply holds besides "v" and "ok".
    reply: str


COMMANDS: tuple[Command, ...] = (
    Command("status", False, "the daemon's state", "the daemon, the profile kept, counters"),
    Command("top", False, "what gputunectl top draws", "the status fields top shows"),
    Command("verify", False, "verify the profile kept (`strict`)", "the verify report"),
    Command(
        "apply",
        True,
        "apply a profile and keep it (`profile` and `source`, or a profile's `name`)",
        "the apply report",
    ),
    Command("revert", True, "put back everything gputuned changed", "the revert report"),
    Command(
        "register",
        True,
        "place a process by a rule and keep it placed (`pid`, `start`, `rule`)",
        "the process and its rule",
    ),
    Command(
        "unregister",
        True,
        "put a process and its children back (`pid`, `start`)",
        "the revert report of its values",
    ),
)
BY_NAME = {c.name: c for c in COMMANDS}
READ_ONLY = frozenset(c.name for c in COMMANDS if not c.changes)
CHANGING = frozenset(c.name for c in COMMANDS if c.changes)

_EXAMPLE = 'like {"v": 1, "cmd": "status"}'


@dataclass(frozen=True)
class PeerCred:
    """Who is on the other end of a connection (``SO_PEERCRED``: effective ids at connect)."""

    pid: int
    uid: int
    gid: int

    def __str__(self) -> str:
        return f"pid {self.pid} uid {self.uid} gid {self.gid}"


#: The supplementary group ids of a peer (injectable: unit tests must not read the real /proc).
GroupsOf = Callable[[PeerCred], Iterable[int]]


class BadRequest(errors.GputunedError):
    """A request line that is not a request; the message says what to send instead."""


def proc_groups(kernel: Kernel, cred: PeerCred) -> frozenset[int]:
    """The peer's supplementary groups from ``/proc/<pid>/status``, read through ``kernel``.

    Empty when the process is gone, or when its effective uid is no longer the one it connected
    with: its PID may have been reused by another process, whose groups prove nothing.
    """
    try:
        status = kernel.read_text(f"/proc/{cred.pid}/status")
    except errors.HostError:
        return frozenset()
    fields = parse_status(status)
    uids = fields.get("Uid", "").split()  # real, effective, saved, filesystem
    if len(uids) < 2 or uids[1] != str(cred.uid):
        return frozenset()
    return frozenset(int(g) for g in fields.get("Groups", "").split() if g.isdigit())


def in_group(cred: PeerCred, gid: int | None, groups_of: GroupsOf) -> bool:
    return gid is not None and (cred.gid == gid or gid in set(groups_of(cred)))


def peer_allowed(cred: PeerCred, group_gid: int | None, groups_of: GroupsOf) -> bool:
    """Root always; with a control group, also its members (primary or supplementary)."""
    return cred.uid == 0 or in_group(cred, group_gid, groups_of)


@dataclass(frozen=True)
class Access:
    """The groups that open the socket to other users, and what each may do."""

    control_gid: int | None = None
    admin_gid: int | None = None
    control_group: str | None = None
    admin_group: str | None = None

    def may_connect(self, cred: PeerCred, groups_of: GroupsOf) -> bool:
        return cred.uid == 0 or any(
            in_group(cred, gid, groups_of) for gid in (self.control_gid, self.admin_gid)
        )

    def may_change(self, cred: PeerCred, groups_of: GroupsOf) -> bool:
        return cred.uid == 0 or in_group(cred, self.admin_gid, groups_of)

    def who_connects(self) -> str:
        groups = [g for g in (self.control_group, self.admin_group) if g]
        return "root" + (f" (or group {' or '.join(groups)})" if groups else "")

    def who_changes(self) -> str:
        return "root" + (f" (or group {self.admin_group})" if self.admin_group else "")


def parse_request(line: bytes) -> dict[str, Any]:
    """The request on ``line``, checked up to its ``"cmd"``; BadRequest says what is wrong."""
    try:
        req = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("request is not UTF-8; send one UTF-8 JSON object per line") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"request is not valid JSON ({exc.msg} at column {exc.colno}); "
            f"send one JSON object per line, {_EXAMPLE}"
        ) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        # ValueError: an integer longer than sys.get_int_max_str_digits(); RecursionError:
        # "[[[[..." within the line limit. json gives up, never the daemon.
        what = "nests too deeply" if isinstance(exc, RecursionError) else "has a value too large"
        raise BadRequest(
            f"request is not valid JSON (it {what}); send one JSON object per line, {_EXAMPLE}"
        ) from None
    if not isinstance(req, dict):
        raise BadRequest(
            f"request must be a JSON object, not {type(req).__name__}; send one per line, "
            + _EXAMPLE
        )
    if "v" not in req:
        raise BadRequest(
            f'request has no "v"; this daemon speaks protocol version {PROTOCOL_VERSION}: '
            f'send "v": {PROTOCOL_VERSION}'
        )
    v = req["v"]
    if type(v) is not int or v != PROTOCOL_VERSION:
        raise BadRequest(
            f"unsupported protocol version {_shown(v)}; this daemon speaks {PROTOCOL_VERSION}"
        )
    cmd = req.get("cmd")
    if not isinstance(cmd, str) or not cmd:
        raise BadRequest('request has no "cmd"; send "cmd": the name of a command, like "status"')
    return req


def _shown(v: object) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def error(message: str) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "ok": False, "error": message}


def failed(exc: errors.GputunedError) -> dict[str, Any]:
    """The reply to a request a command raised ``exc`` on: its message, and its class and exit
    status, so that gputunectl ends as it would have without the daemon (an invalid profile
    exits 4 both ways: issue 31, item 3); a profile's problems as key paths too."""
    resp = error(str(exc))
    resp.update(error_class=errors.class_name(exc), exit_code=exc.exit_code)
    if isinstance(exc, errors.ProfileError):
        resp["problems"] = [{"key": k, "message": m} for k, m in exc.problems]
    return resp


def internal(cmd: str, what: str) -> dict[str, Any]:
    return error(
        f"internal error in gputuned while running {cmd[:40]!r} ({what}); the daemon's log has "
        "the traceback: please report it"
    )


def encode(resp: dict[str, Any]) -> bytes:
    return json.dumps(resp, separators=(",", ":")).encode() + b"\n"
