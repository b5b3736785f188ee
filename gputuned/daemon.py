"""``gputuned``: the long-running service that keeps a profile applied.

Start: take the host lock for good, adopt or replay a journal left by an earlier run, load the
active profile (``gputunectl apply`` recorded it in /etc/gputuned/active.json), apply it, verify,
then tell systemd READY=1 with a STATUS= line. Then, in one single-threaded loop:

- process events (proc connector, or polling): a new process that matches a rule is placed at
  once, threads it creates later too; a process that exits is forgotten;
- udev events for PCI devices: the profile is re-planned (a GPU reset or re-bind can bring back
  the kernel's saved DevCtl, or new IRQ numbers);
- every ``[daemon] drift_interval_s``: everything applied is re-read and drift repaired;
- the control socket (gputunectl apply, revert, status, verify, register, unregister);
- WATCHDOG=1 at half of WatchdogSec=;
- SIGHUP re-reads the profile and applies only the difference; SIGTERM/SIGINT: STOPPING=1,
  revert everything, exit 0. SIGUSR2 stops the watchdog pings (to test watchdog recovery).

A journal left by a killed daemon is adopted when a profile is active: its entries keep the
original values, the profile is applied on top (no untuned window), and the final revert
restores them. With no active profile the journal is replayed (reverted) at start.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gputuned import __version__, errors
from gputuned.actions import Reused, expand, holds
from gputuned.apply import (
    ApplyReport,
    apply_profile,
    apply_settings,
    forget_process,
    read_active,
    read_state,
    restore_processes,
    revert_all,
)
from gputuned.changes import Change, PlanContext
from gputuned.engine import plan_processes, plan_profile, read_context
from gputuned.host import (
    Host,
    procctl,  # noqa: F401  (loaded now, not at the first placement)
)
from gputuned.host.control import ControlServer, PeerCred
from gputuned.host.httpmetrics import MetricsServer
from gputuned.host.loop import Loop, now
from gputuned.host.notify import Notifier, setup_logging, system_stopping, watchdog_interval
from gputuned.host.proc import read_identity
from gputuned.host.procwatch import ProcWatcher, open_watcher
from gputuned.host.state import HostLock
from gputuned.host.udevmon import UdevMonitor, open_monitor
from gputuned.journal import Journal
from gputuned.profile import Profile, load_profile, parse_profile
from gputuned.tuners.process import Claim, claim_processes
from gputuned.tuners.proctree import OWN_COMMS
from gputuned.tuners.spread import Held, held_threads
from gputuned.verify import verify_plan

log = logging.getLogger("gputuned")


class Daemon:
    def __init__(self, host: Host, *, profile_path: Path | None = None) -> None:
        self.host = host
        self.profile_path = profile_path
        self.notify = Notifier()
        self.profile: Profile | None = None
        self.source = ""
        self.ctx: PlanContext | None = None
        self.settings: list[Change] = []  # applied last, re-read by the drift check
        self._drift_ticks = 0
        self.claims: dict[int, Claim] = {}  # processes the rules claim: placed or left out
        self.registered: dict[int, tuple[int, str]] = {}  # pid -> (start time, rule name)
        # The CPUs placed processes' threads were given: a new process of a tree spread over
        # a partition is planned against them (tuners/spread.py).
        self.held: dict[int, Held] = {}
        self.counters = {"repairs": 0, "replans": 0, "placements": 0, "reloads": 0}
        self.status = "starting"
        self.last_verify: dict[str, Any] = {}
        self.running = True
        self.watchdog_on = True
        self.loop = Loop()
        self.lock = HostLock(host)
        self.journal: Journal | None = None  # opened under the lock; the daemon's only copy
        self.watcher: ProcWatcher | None = None
        self.udev: UdevMonitor | None = None
        self.control: ControlServer | None = None
        self.metrics: MetricsServer | None = None
        self.last_verify_at: float | None = None
        self._next: dict[str, float] = {}

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        # Handlers first: a SIGHUP (default action: terminate) or SIGTERM that arrives during the
        # start apply must wait for the loop, not kill the daemon half-way through its writes.
        for sig, h in (
            (signal.SIGHUP, self._on_hup),
            (signal.SIGTERM, self._on_term),
            (signal.SIGINT, self._on_term),
            (signal.SIGUSR2, self._on_usr2),
        ):
            self.loop.on_signal(sig, h)
        self.lock.__enter__()
        self.journal = Journal(self.host)
        self._adopt_or_replay()
        self.profile, self.source = self._load_profile()
        if self.profile is not None:
            self._apply_full("start")
        else:
            self.status = "idle: no profile applied yet (gputunectl apply PROFILE)"
        daemon_cfg = self.profile.daemon if self.profile else None
        group = daemon_cfg.control_group if daemon_cfg else None
        self.control = ControlServer(self.host, self._handle, group=group)
        self.loop.add_reader(self.control.fileno(), self._on_control)
        if daemon_cfg is not None and daemon_cfg.metrics_port is not None:
            from gputuned.metrics import daemon_metrics

            try:
                self.metrics = MetricsServer(
                    lambda: daemon_metrics(self.host, self._status()), port=daemon_cfg.metrics_port
                )
            except errors.GputunedError as exc:
                log.error("daemon: metrics off: %s", exc)
            else:
                self.metrics.attach(self.loop)
        self.watcher = open_watcher(self.host, poll_interval=1.0)
        if self.watcher.fileno() >= 0:
            self.loop.add_reader(self.watcher.fileno(), lambda _fd: self._on_proc_events())
        self.udev = open_monitor(self.host)
        if self.udev is not None:
            self.loop.add_reader(self.udev.fileno(), lambda _fd: self._on_udev())
        self._schedule()
        self.notify.send("READY=1", f"STATUS={self.status}", f"MAINPID={_pid()}")
        log.info("daemon: ready (%s); process events by %s", self.status, self.watcher.mode)

    def run(self) -> int:
        while self.running:
            timeout = min(self._next.values(), default=now() + 1.0) - now()
            if self.watcher is not None and self.watcher.fileno() < 0:
                timeout = min(timeout, self.watcher.timeout or 1.0)
            self.loop.run_once(min(timeout, 1.0))
            if self.watcher is not None and self.watcher.fileno() < 0:
                self._on_proc_events()
            if self.control is not None:
                before = set(self.control.client_fds())
                self.control.expire(time.monotonic())
                self._sync_control(before)
            if self.metrics is not None:
                self.metrics.expire(time.monotonic())
            self._timers()
        return self.stop()

    def stop(self) -> int:
        self.notify.send("STOPPING=1", "STATUS=reverting")
        skip = (
            self.profile is not None
            and not self.profile.daemon.revert_on_shutdown
            and system_stopping()
        )
        failed = 0
        if skip:
            log.info("daemon: system shutdown and revert_on_shutdown = false: not reverting")
        else:
            rep = revert_all(self.host, forget_profile=False, lock=False, journal=self.journal)
            log.info("daemon: reverted %d value(s), %d failed", len(rep.restored), len(rep.failed))
            for note in rep.notes:
                log.info("daemon: revert: %s", note)
            for f in rep.failed:
                log.error("daemon: revert %s failed: %s", f["target"], f["error"])
            failed = len(rep.failed)
            if failed:
                # Left behind: a stop that says it succeeded would hide it (systemd marks the
                # unit failed on a non-zero exit). The journal keeps it for gputunectl revert.
                log.error(
                    "daemon: stopping with %d value(s) not put back (left in the journal for "
                    "gputunectl revert): %s",
                    len(rep.failed),
                    "; ".join(f["target"] for f in rep.failed),
                )
        for closer in (self.control, self.watcher, self.metrics):
            if closer is not None:
                closer.close()
        self.loop.close()
        self.lock.__exit__(None, None, None)
        return errors.GputunedError.exit_code if failed else 0

    # -- applying -----------------------------------------------------------------------------

    def _adopt_or_replay(self) -> None:
        journal = self.journal
        assert journal is not None
        if not len(journal):
            return
        if read_active(self.host) is None and self.profile_path is None:
            rep = revert_all(self.host, lock=False, journal=journal)
            log.warning(
                "daemon: replayed a journal left by an earlier run: %d value(s) restored, %d failed",
                len(rep.restored),
                len(rep.failed),
            )
        else:
            log.warning(
                "daemon: adopting a journal of %d original value(s) left by an earlier run",
                len(journal),
            )

    def _load_profile(self) -> tuple[Profile | None, str]:
        if self.profile_path is not None:
            return load_profile(self.profile_path), str(self.profile_path.absolute())
        active = read_active(self.host)
        if active is None:
            return None, ""
        src = str(active.get("source", ""))
        if src and Path(src).is_file():
            try:
                return load_profile(src), src
            except errors.ProfileError as exc:
                log.error("daemon: %s no longer loads (%s); using the copy applied last", src, exc)
        return parse_profile(active["profile"], "/etc/gputuned/active.json"), src

    def _apply_full(self, why: str) -> ApplyReport:
        assert self.profile is not None
        plan, report = apply_profile(
            self.host,
            self.profile,
            keep_going=True,
            source=self.source,
            lock=False,
            registered=self.registered,
            journal=self.journal,
        )
        self.ctx = read_context(
            self.host, self.profile, registered=self.registered, journal=self.journal
        )
        self.settings = [
            c for c in plan.settings if not c.report_only and c.key not in report.not_possible
        ]
        self.held = held_threads(self.settings)
        self._drift_ticks = 0
        for w in report.written:
            log.info("daemon: %s: set %s: %s -> %s", why, w["target"], w["old"], w["new"])
        for f in report.failed:
            log.error("daemon: %s: %s failed: %s", why, f["target"], f["error"])
        self._refresh_placed()
        self._verify()
        return report

    def _reapply(self, why: str) -> ApplyReport | None:
        """``_apply_full`` for the daemon's own triggers (drift, udev, NVML, rescan): a profile
        that cannot be planned now (a CPU set gone empty, a neighbour's partition taking its
        CPUs) leaves what is applied in place and the daemon running, degraded."""
        try:
            return self._apply_full(why)
        except errors.GputunedError as exc:
            log.error("daemon: %s: %s; keeping what is applied", why, exc)
            self.status = f"degraded: {why}: {exc}"
            self.notify.send(f"STATUS={self.status}")
            return None

    def _drifted(self) -> bool:
        """Does any applied setting no longer hold? Reads only those settings' files."""
        for ch in self.settings:
            for op in expand(ch):
                try:
                    if not holds(self.host, op, op.value)[0]:
                        log.info("daemon: drift: %s %s", op.tuner, op.target)
                        return True
                except (errors.TargetGone, Reused):
                    continue  # a process that exited; the watcher forgets it
                except errors.GputunedError as exc:
                    log.info("daemon: drift check of %s failed (%s); re-planning", op.target, exc)
                    return True
        return False

    @property
    def placed(self) -> dict[int, int]:
        """Processes placed by a rule (matched or descendants): pid -> start time."""
        return {pid: c.start for pid, c in self.claims.items() if c.role != "excluded"}

    def _refresh_placed(self) -> None:
        """The claims of a full plan; a registration whose process is gone goes with it."""
        assert self.ctx is not None
        self.claims = claim_processes(self.ctx)
        self.registered = {
            pid: reg
            for pid, reg in self.registered.items()
            if pid in self.claims and self.claims[pid].start == reg[0]
        }

    def _verify(self) -> None:
        assert self.profile is not None
        rep = verify_plan(
            plan_profile(self.host, self.profile, registered=self.registered, journal=self.journal),
            read_state(self.host),
        )
        self.last_verify = rep.to_json()["counts"]
        self.last_verify_at = time.time()
        failed = self.last_verify["drifted"]
        np = self.last_verify["not possible here"]
        name = self.profile.name
        self.status = (
            f"applied {name}: {self.last_verify['passed']} in place, {np} not possible here"
            if not failed
            else f"degraded {name}: {failed} setting(s) not in place (gputunectl verify)"
        )

    def _place(self, pids: list[int], why: str) -> None:
        if self.profile is None or self.ctx is None or not self.profile.process:
            return
        t0 = time.perf_counter()
        ctx = dataclasses.replace(
            self.ctx, claimed=self.claims, registered=self.registered, held=self.held
        )
        settings, claims = plan_processes(ctx, pids)
        self.claims.update(claims)
        if not settings:
            return
        self._keep(settings)
        report = ApplyReport()
        assert self.journal is not None
        apply_settings(self.host, self.journal, settings, report, keep_going=True, batch=True)
        if report.written:
            self.counters["placements"] += 1
            log.info(
                "daemon: placed %s (%s): %d write(s) in %.1f ms",
                pids,
                why,
                len(report.written),
                (time.perf_counter() - t0) * 1e3,
            )

    def _keep(self, settings: list[Change]) -> None:
        """A placement's settings join those the drift check re-reads, replacing the same
        settings planned earlier (a thread moved off the CPU a new main thread took)."""
        mine = [c for c in settings if not c.report_only]
        keys = {c.key for c in mine}
        self.settings = [c for c in self.settings if c.key not in keys] + mine
        self.held.update(held_threads(mine))

    # -- events -------------------------------------------------------------------------------

    def _on_proc_events(self) -> None:
        assert self.watcher is not None
        new: list[int] = []
        for ev in self.watcher.read():
            if ev.kind == "overflow":
                log.warning(
                    "daemon: process events were lost (receive buffer overflow); rescanning"
                )
                if self.profile is not None:
                    self._reapply("rescan")
                return
            if ev.kind in ("exec", "fork", "comm") or (
                ev.kind == "thread" and ev.pid in self.claims and self._places(ev.pid)
            ):
                # A fork: a new process, maybe a child of a claimed one (its parent's claim
                # carries over); exec and a new name: what it is may have changed (a spawned
                # child running its target, setproctitle); a thread: placed like its process.
                new.append(ev.pid)
            elif ev.kind == "exit" and ev.pid == ev.tid and self._forget(ev.pid):
                n = forget_process(self.host, ev.pid, self.journal)
                log.info("daemon: pid %d exited; forgot %d journal entries", ev.pid, n)
                assert self.journal is not None
                self.journal.compact_if_grown()
        if new:
            self._place(sorted(set(new)), "new process or thread")

    def _places(self, pid: int) -> bool:
        return self.claims[pid].role != "excluded"

    def _forget(self, pid: int) -> bool:
        was_claimed = self._drop(pid)
        return self.registered.pop(pid, None) is not None or was_claimed

    def _drop(self, pid: int) -> bool:
        """Stop placing ``pid`` (gone, or unregistered): its claim and settings go."""
        self.held.pop(pid, None)
        if self.claims.pop(pid, None) is None:
            return False
        self.settings = [
            c for c in self.settings if c.tuner != "process" or c.data.get("pid") != pid
        ]
        return True

    def _on_udev(self) -> None:
        assert self.udev is not None
        events = self.udev.read()
        if events and self.profile is not None:
            self.counters["replans"] += 1
            log.info(
                "daemon: PCI %s; re-planning", ", ".join(f"{e.action} {e.bdf}" for e in events)
            )
            self._reapply("udev")

    def _on_control(self, fd: int) -> None:
        if self.control is not None:
            before = set(self.control.client_fds())
            self.control.on_readable(fd)
            self._sync_control(before)

    def _sync_control(self, before: set[int]) -> None:
        """Watch the clients the server has now, and only those: a closed client's fd number
        is reused by the next accept, so a stale registration would hide the new client."""
        assert self.control is not None
        after = set(self.control.client_fds())
        for fd in before - after:
            self.loop.remove_reader(fd)
        for fd in after - before:
            self.loop.add_reader(fd, self._on_control)

    def _on_hup(self, _sig: int) -> None:
        self.notify.send("RELOADING=1", f"MONOTONIC_USEC={int(time.monotonic() * 1e6)}")
        try:
            prof, src = self._load_profile()
        except errors.GputunedError as exc:
            log.error("daemon: reload: %s; keeping the profile in place", exc)
            self.notify.send("READY=1", f"STATUS={self.status} (reload failed: {exc})")
            return
        old = self.profile, self.source
        self.profile, self.source = prof, src
        self.counters["reloads"] += 1
        if self.profile is not None:
            try:
                self._apply_full("reload")
            except errors.GputunedError as exc:
                log.error("daemon: reload: %s; keeping the profile in place", exc)
                self.profile, self.source = old
                self.notify.send("READY=1", f"STATUS={self.status} (reload failed: {exc})")
                return
        self.notify.send("READY=1", f"STATUS={self.status}")

    def _on_term(self, sig: int) -> None:
        log.info("daemon: %s: stopping", signal.Signals(sig).name)
        self.running = False

    def _on_usr2(self, _sig: int) -> None:
        log.warning("daemon: SIGUSR2: no more watchdog pings; systemd will restart this daemon")
        self.watchdog_on = False

    # -- timers -------------------------------------------------------------------------------

    def _schedule(self) -> None:
        t = now()
        wd = watchdog_interval()
        if wd:
            self._next["watchdog"] = t + wd
        if self.profile is not None:
            self._next["drift"] = t + self.profile.daemon.drift_interval_s
            if any(r.match.uses_gpu is not None for r in self.profile.process):
                self._next["nvml"] = t + self.profile.daemon.nvml_interval_s
        else:
            self._next.pop("drift", None)
            self._next.pop("nvml", None)

    def _timers(self) -> None:
        t = now()
        if self._next.get("watchdog", float("inf")) <= t:
            if self.watchdog_on:
                self.notify.send("WATCHDOG=1")
            self._next["watchdog"] = t + (watchdog_interval() or 1.0)
        if self.profile is None:
            return
        if self._next.get("drift", float("inf")) <= t:
            self._drift_ticks += 1
            # Cheap check first: re-read only what was applied. A full re-plan (every process,
            # device and IRQ read again) runs when something drifted, and every 10th tick to
            # catch what no event announced.
            if self._drifted() or self._drift_ticks >= 10:
                report = self._reapply("drift repair")
                if report is not None:
                    self.counters["repairs"] += len(report.written)
                    self.notify.send(f"STATUS={self.status}")
            self._next["drift"] = t + self.profile.daemon.drift_interval_s
        if self._next.get("nvml", float("inf")) <= t:
            self._reapply("nvml")
            self._next["nvml"] = t + self.profile.daemon.nvml_interval_s

    # -- control socket -----------------------------------------------------------------------

    def _handle(self, req: dict[str, Any], peer: PeerCred) -> dict[str, Any]:
        cmd = req.get("cmd")
        log.info("daemon: control: %s from pid %d uid %d", cmd, peer.pid, peer.uid)
        if cmd == "status":
            return self._status()
        if cmd == "apply":
            path = Path(str(req["profile"]))
            profile = load_profile(path)
            old = self.profile, self.source, self.profile_path
            self.profile, self.source, self.profile_path = profile, str(path), None
            try:
                report = self._apply_full("apply")
            except errors.GputunedError:
                self.profile, self.source, self.profile_path = old  # the client gets the error
                raise
            self._schedule()
            self.notify.send(f"STATUS={self.status}")
            return {"profile": profile.name, **report.to_json()}
        if cmd == "revert":
            rep = revert_all(self.host, lock=False, journal=self.journal)
            self.profile, self.ctx, self.claims, self.registered = None, None, {}, {}
            self.held = {}
            self.status = "idle: reverted (gputunectl apply PROFILE)"
            self._schedule()
            self.notify.send(f"STATUS={self.status}")
            return rep.to_json()
        if cmd == "verify":
            if self.profile is None:
                raise errors.GputunedError("no profile applied; gputunectl apply PROFILE first")
            vrep = verify_plan(
                plan_profile(self.host, self.profile, registered=self.registered),
                read_state(self.host),
                strict=bool(req.get("strict")),
            )
            return vrep.to_json()
        if cmd in ("register", "unregister"):
            return self._register(cmd, req)
        raise errors.GputunedError(f"unknown command {cmd!r}; see gputunectl --help")

    def _register(self, cmd: str, req: dict[str, Any]) -> dict[str, Any]:
        """Place a process by a rule (or stop placing it), identified by PID *and* start time:
        a PID alone may name another process by the time it arrives. The registration ends
        with the process (an exit event, or a full plan that no longer finds it)."""
        pid, start = _process_id(req)
        if cmd == "unregister":
            known = self.claims.get(pid)
            if start is not None and known is not None and known.start != start:
                raise errors.GputunedError(
                    f"unregister {pid}: PID {pid} now belongs to another process than the one "
                    "placed; nothing was changed"
                )
            tree = {pid} | _descendants(self.claims, pid)
            for p in tree:
                self._drop(p)
            self.registered.pop(pid, None)
            return restore_processes(self.host, tree, self.journal).to_json()
        if self.profile is None or not self.profile.process:
            raise errors.GputunedError("the active profile has no [[process]] rule to place it by")
        names = [r.name for r in self.profile.process]
        rule = req.get("rule")
        if rule is not None and not isinstance(rule, str):
            raise errors.GputunedError("rule must be the name of a [[process]] rule (a string)")
        name = rule or names[0]
        if name not in names:
            raise errors.GputunedError(f"no rule {name!r}; the profile has: {', '.join(names)}")
        self.registered[pid] = (_check_registrable(self.host, pid, start), name)
        if self.ctx is not None:
            self.ctx = read_context(
                self.host, self.profile, registered=self.registered, journal=self.journal
            )
        self._place([pid], f"registered for rule {name}")
        return {
            "pid": pid,
            "start": self.registered[pid][0],
            "rule": name,
            "placed": pid in self.placed,
        }

    def _status(self) -> dict[str, Any]:
        state = read_state(self.host)
        return {
            "daemon": {"pid": _pid(), "version": __version__, "status": self.status,
                       "watcher": self.watcher.mode if self.watcher else None,
                       "udev": self.udev is not None, **self.counters},
            "active_profile": self.profile.name if self.profile else None,
            "source": self.source or None,
            "applied_at": state.get("applied_at"),
            "journal_entries": len(self.journal) if self.journal is not None else 0,
            "not_possible": state.get("not_possible", {}),
            "placed": sorted(self.placed),
            "registered": {str(k): v[1] for k, v in self.registered.items()},
            "verify": self.last_verify,
            "verified_at": self.last_verify_at,
        }  # fmt: skip


def _pid() -> int:
    from gputuned.host.notify import own_pid

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


def _check_registrable(host: Host, pid: int, start: int | None) -> int:
    """Refuse what must never be placed by hand: a PID that does not exist or now names
    another process, PID 1, kernel threads, gputuned itself. Returns the start time."""
    if start is None:
        raise errors.GputunedError(
            f"register {pid}: the request has no start time; PIDs are reused, so the daemon "
            "places a process only by PID and start time (use gputunectl register, which sends "
            "both)"
        )
    try:
        now, _ppid, comm, kernel = read_identity(host, pid)
    except errors.HostError:
        raise errors.GputunedError(f"register {pid}: there is no process {pid}") from None
    if now != start:
        raise errors.GputunedError(
            f"register {pid}: PID {pid} now belongs to another process (started at tick {now}, "
            f"not {start}); nothing was placed"
        )
    if pid == 1:
        raise errors.GputunedError("register 1: PID 1 is the system's init; it is never placed")
    if kernel:
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gputuned", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"gputuned {__version__}")
    p.add_argument("--root", type=Path, default=Path("/"), help="run against a host tree")
    p.add_argument("--profile", type=Path, help="apply this profile instead of the active one")
    p.add_argument("--foreground", action="store_true", help="accepted; gputuned never forks")
    p.add_argument("--debug", action="store_true", help="debug logging")
    args = p.parse_args(argv)
    where = setup_logging(debug=args.debug, to_journal=Notifier().enabled)
    log.info("daemon: gputuned %s starting on %s, logging to %s", __version__, args.root, where)
    d = Daemon(Host(args.root), profile_path=args.profile)
    try:
        d.start()
    except errors.GputunedError as exc:
        log.error("daemon: cannot start: %s", exc)
        d.notify.send(f"STATUS=failed: {exc}", f"ERRNO={getattr(exc, 'errno', 0) or 0}")
        return exc.exit_code
    return d.run()


if __name__ == "__main__":
    sys.exit(main())
