"""The control socket's requests as the daemon answers them: status, top, verify,
apply, revert, register and unregister (gputuned/service/controlproto.py says who may
send which; each field is checked here before it is used)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gputuned import __version__, errors
from gputuned.daemon import placing
from gputuned.daemon.access import VERIFY_CACHE_S, profile_from_request, request_flag
from gputuned.daemon.keeper import Keeper
from gputuned.daemon.selfbind import BindWatch
from gputuned.engine.apply import read_state, restore_processes, revert_all
from gputuned.engine.plan import plan_profile, read_context
from gputuned.engine.verify import verify_plan
from gputuned.kernel import Kernel
from gputuned.kernel.proc import read_identity
from gputuned.service.control import PeerCred
from gputuned.service.controlproto import BY_NAME
from gputuned.service.peerlog import PEER_LOG
from gputuned.textsafe import printable
from gputuned.tuners.cmdmatch import SEARCHES
from gputuned.tuners.context import Claim
from gputuned.tuners.proctree import OWN_COMMS

log = logging.getLogger("gputuned")


class Requests:
    """The daemon's answers to control requests, on the keeper's state (it owns none but
    the verify cache)."""

    def __init__(self, keeper: Keeper) -> None:
        self.k = keeper
        self._verify_cache: tuple[float, bool, dict[str, Any]] | None = None

    def handle(self, req: dict[str, Any], peer: PeerCred) -> dict[str, Any]:
        """One control request. The server has parsed it and refused what this peer may not
        send (controlproto: read-only commands for the control group, changing ones for root
        and the admin group); each field is checked here before it is used."""
        cmd = req["cmd"]
        if cmd not in BY_NAME:
            raise errors.GputunedError(
                f"unknown command '{printable(cmd)[:40]}'; see gputunectl --help"
            )
        # A request that changes the host is news; a read (status every few seconds from a
        # dashboard) is not.
        level = logging.INFO if BY_NAME[cmd].changes else logging.DEBUG
        if log.isEnabledFor(level) and PEER_LOG.allow(peer.uid):
            log.log(level, "daemon: control: %s from pid %d uid %d", cmd, peer.pid, peer.uid)
        handler: Callable[[dict[str, Any], PeerCred], dict[str, Any]] = getattr(self, f"_cmd_{cmd}")
        try:
            return handler(req, peer)
        except errors.GputunedError as exc:
            # One line that it failed (the client has the whole message), bounded like the
            # line above: a member may send failing requests as fast as it likes.
            if PEER_LOG.allow(peer.uid):
                log.warning(
                    "daemon: control: %s from pid %d uid %d failed (%s, exit %d): %s",
                    cmd, peer.pid, peer.uid, errors.class_name(exc), exc.exit_code,
                    _one_line(str(exc)),
                )  # fmt: skip
            raise

    def _cmd_status(self, _req: dict[str, Any], _peer: PeerCred) -> dict[str, Any]:
        return self.status()

    def _cmd_top(self, _req: dict[str, Any], _peer: PeerCred) -> dict[str, Any]:
        return {k: v for k, v in self.status().items() if k in _TOP_KEYS}

    def _cmd_verify(self, req: dict[str, Any], peer: PeerCred) -> dict[str, Any]:
        return self._verify_for(peer, strict=request_flag(req, "strict"))

    def _cmd_revert(self, _req: dict[str, Any], _peer: PeerCred) -> dict[str, Any]:
        rep = revert_all(self.k.kernel, lock=False, journal=self.k.journal, boot_config=True)
        self.k.profile, self.k.ctx, self.k.claims, self.k.registered = None, None, {}, {}
        self.k.reload_path, self._verify_cache, self.k.held = None, None, {}
        self.k.binds = BindWatch()
        self.k.status = "idle: reverted (gputunectl apply PROFILE)"
        self.k.schedule()
        self.k.notify.send(f"STATUS={self.k.status}")
        return rep.to_json()

    def _cmd_register(self, req: dict[str, Any], _peer: PeerCred) -> dict[str, Any]:
        return self._register("register", req)

    def _cmd_unregister(self, req: dict[str, Any], _peer: PeerCred) -> dict[str, Any]:
        return self._register("unregister", req)

    def _cmd_apply(self, req: dict[str, Any], peer: PeerCred) -> dict[str, Any]:
        profile, source, reload_path = profile_from_request(self.k.kernel, req, peer)
        old = self.k.profile, self.k.source, self.k.profile_path, self.k.reload_path
        self.k.profile, self.k.source, self.k.profile_path = profile, source, None
        self.k.reload_path, self._verify_cache = reload_path, None
        try:
            report = self.k.apply_full("apply")
        except Exception:
            self.k.profile, self.k.source, self.k.profile_path, self.k.reload_path = old
            raise  # the client gets the error
        self.k.schedule()
        self.k.notify.send(f"STATUS={self.k.status}")
        return {"profile": profile.name, **report.to_json()}

    def _verify_for(self, peer: PeerCred, *, strict: bool) -> dict[str, Any]:
        """A fresh verify for root; others get one at most VERIFY_CACHE_S old (each is a full
        plan, and a member of the control group must not keep the daemon busy with them)."""
        if self.k.profile is None:
            raise errors.GputunedError("no profile applied; gputunectl apply PROFILE first")
        t = time.monotonic()
        cached = self._verify_cache
        if peer.uid != 0 and cached and cached[1] == strict and t - cached[0] < VERIFY_CACHE_S:
            return cached[2]
        vrep = verify_plan(
            plan_profile(
                self.k.kernel,
                self.k.profile,
                registered=self.k.registered,
                self_bound=self.k.binds.self_bound(),
            ),
            read_state(self.k.kernel),
            strict=strict,
        )
        vrep.lines += self.k.binds.lines()
        out = vrep.to_json()
        self._verify_cache = (t, strict, out)
        return out

    def _register(self, cmd: str, req: dict[str, Any]) -> dict[str, Any]:
        """Place a process by a rule (or stop placing it), identified by PID *and* start time:
        a PID alone may name another process by the time it arrives. The registration ends
        with the process (an exit event, or a full plan that no longer finds it)."""
        pid, start = _process_id(req)
        if cmd == "unregister":
            known = self.k.claims.get(pid)
            if start is not None and known is not None and known.start != start:
                raise errors.GputunedError(
                    f"unregister {pid}: PID {pid} now belongs to another process than the one "
                    "placed; nothing was changed"
                )
            tree = {pid} | _descendants(self.k.claims, pid)
            for p in tree:
                placing.drop(self.k, p)
            self.k.registered.pop(pid, None)
            return restore_processes(self.k.kernel, tree, self.k.journal).to_json()
        if self.k.profile is None or not self.k.profile.process:
            raise errors.GputunedError("the active profile has no [[process]] rule to place it by")
        names = [r.name for r in self.k.profile.process]
        rule = req.get("rule")
        if rule is not None and not isinstance(rule, str):
            raise errors.GputunedError("rule must be the name of a [[process]] rule (a string)")
        name = rule or names[0]
        if name not in names:
            raise errors.GputunedError(f"no rule {name!r}; the profile has: {', '.join(names)}")
        self.k.registered[pid] = (_check_registrable(self.k.kernel, pid, start), name)
        if self.k.ctx is not None:
            self.k.ctx = read_context(
                self.k.kernel, self.k.profile, registered=self.k.registered, journal=self.k.journal
            )
        self.k.place([pid], f"registered for rule {name}")
        return {
            "pid": pid,
            "start": self.k.registered[pid][0],
            "rule": name,
            "placed": pid in self.k.placed,
        }

    def status(self) -> dict[str, Any]:
        state = read_state(self.k.kernel)
        return {
            "daemon": {"pid": _pid(), "version": __version__, "status": self.k.status,
                       "watcher": self.k.watcher.mode if self.k.watcher else None,
                       "udev": self.k.udev is not None, **self.k.counters},
            "active_profile": self.k.profile.name if self.k.profile else None,
            "source": self.k.source or None,
            "applied_at": state.get("applied_at"),
            "journal_entries": len(self.k.journal) if self.k.journal is not None else 0,
            "not_possible": state.get("not_possible", {}),
            "refused": state.get("refused", []),
            "placed": sorted(self.k.placed),
            "registered": {str(k): v[1] for k, v in self.k.registered.items()},
            "verify": self.k.last_verify,
            "verified_at": self.k.last_verify_at,
            "notes": self.k.setup_notes + SEARCHES.notes(),
            # Placed processes that bind themselves (daemon/selfbind.py), and the plan's
            # warnings for matched processes that will (tuners/selfbind.py).
            "self_binding": [sb.to_json() for sb in self.k.binds.found.values()],
            "binding_warnings": list(self.k.binding_warnings.values()),
        }  # fmt: skip


#: What ``top`` needs of the status: the processes to watch.
_TOP_KEYS = ("active_profile", "placed", "registered")


def _one_line(text: str, limit: int = 500) -> str:
    """A message of several lines (a profile's problems) on one, cut at ``limit``; the log's
    formatter escapes what is left (service/notify.py)."""
    one = " / ".join(ln.strip() for ln in text.splitlines() if ln.strip())
    return one if len(one) <= limit else one[: limit - 3] + "..."


def _pid() -> int:
    from gputuned.service.notify import own_pid

    return own_pid()


def _process_id(req: dict[str, Any]) -> tuple[int, int | None]:
    """The request's ``pid`` and ``start``: positive and non-negative JSON integers."""
    pid, start = req.get("pid"), req.get("start")
    if type(pid) is not int or pid <= 0:  # bool is an int to isinstance: not a PID
        raise errors.GputunedError(f"pid must be a positive integer, not {pid!r}")
    if start is not None and (type(start) is not int or start < 0):
        raise errors.GputunedError(
            f"start must be the process's start time (/proc/PID/stat field 22), not {start!r}"
        )
    return pid, start


def _check_registrable(kernel: Kernel, pid: int, start: int | None) -> int:
    """Refuse what must never be placed by hand: a PID that does not exist or now names
    another process, PID 1, kernel threads, gputuned itself. Returns the start time."""
    if start is None:
        raise errors.GputunedError(
            f"register {pid}: the request has no start time; PIDs are reused, so the daemon "
            "places a process only by PID and start time (use gputunectl register, which sends "
            "both)"
        )
    try:
        now, _ppid, comm, kthread = read_identity(kernel, pid)
    except errors.HostError:
        raise errors.GputunedError(f"register {pid}: there is no process {pid}") from None
    if now != start:
        raise errors.GputunedError(
            f"register {pid}: PID {pid} now belongs to another process (started at tick {now}, "
            f"not {start}); nothing was placed"
        )
    if pid == 1:
        raise errors.GputunedError("register 1: PID 1 is the system's init; it is never placed")
    if kthread:
        raise errors.GputunedError(f"register {pid}: {comm} is a kernel thread; never placed")
    if pid == _pid() or comm in OWN_COMMS:
        raise errors.GputunedError(f"register {pid}: that is gputuned itself; never placed")
    return now


def _descendants(claims: dict[int, Claim], pid: int) -> set[int]:
    """PIDs claimed through ``pid`` (its children, theirs, ...)."""
    out: set[int] = set()
    grew = True
    while grew:
        more = {p for p, c in claims.items() if c.parent in out | {pid} and p not in out}
        out |= more
        grew = bool(more)
    return out
