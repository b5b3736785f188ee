"""The daemon: its life cycle (start, the loop, stop) and its event sources (process
events, udev, signals). See :mod:`gputuned.daemon` for what it does."""

from __future__ import annotations

import functools
import logging
import signal
import time
from collections.abc import Callable

from gputuned import errors
from gputuned.daemon import placing
from gputuned.daemon.access import metrics_allowed
from gputuned.daemon.control import Requests, _pid
from gputuned.daemon.inplace import replan_if_moved
from gputuned.daemon.keeper import Keeper
from gputuned.engine.apply import forget_process, revert_all
from gputuned.engine.journal import Journal
from gputuned.kernel.live import set_own_realtime
from gputuned.profile.model import Profile
from gputuned.profile.tables.daemon import Config as DaemonConfig
from gputuned.service.control import ControlServer
from gputuned.service.httpmetrics import MetricsServer
from gputuned.service.loop import now
from gputuned.service.notify import system_stopping
from gputuned.service.procwatch import open_watcher
from gputuned.service.udevmon import open_monitor

log = logging.getLogger("gputuned")
#: New threads placed in one turn of the loop (each costs about a millisecond of CPU).
THREADS_A_TURN = 256


class Daemon(Keeper):
    """``gputuned``: start, run the loop until SIGTERM, stop (and revert). What it keeps is
    the keeper's (daemon/keeper.py); the control requests are answered by its ``requests``
    (daemon/control.py), which the control socket and the metrics port are given."""

    @functools.cached_property
    def requests(self) -> Requests:
        return Requests(self)

    def start(self) -> None:
        """Set up everything, then apply: the lock, journal and profile, the control socket,
        metrics port and event sources, and only then the profile's writes. A start that fails
        after the lock is taken puts back every journaled value before it raises, so a daemon
        that cannot run never leaves the host tuned with nobody to revert it (issue 14,
        findings 2, 4 and 11)."""
        # Handlers first: a SIGHUP (default action: terminate) or SIGTERM that arrives during the
        # start apply must wait for the loop, not kill the daemon half-way through its writes.
        for sig, h in (
            (signal.SIGHUP, self._on_hup),
            (signal.SIGTERM, self._on_term),
            (signal.SIGINT, self._on_term),
            (signal.SIGUSR1, self._on_usr1),
            (signal.SIGUSR2, self._on_usr2),
        ):
            self.loop.on_signal(sig, h)
        self.lock.__enter__()
        try:
            self.journal = Journal(self.kernel)
            self.profile, self.source = self._load_profile()
            self._set_up()
            self._adopt_or_replay()
            if self.profile is not None:
                self.apply_full("start")
            else:
                self.status = "idle: no profile applied yet (gputunectl apply PROFILE)"
            self.schedule()
        except BaseException as exc:
            self._abort_start(exc)
            raise
        self.notify.send("READY=1", f"STATUS={self.status}", f"MAINPID={_pid()}")
        assert self.watcher is not None
        log.info("daemon: ready (%s); process events by %s", self.status, self.watcher.mode)

    def _set_up(self) -> None:
        """The control socket, metrics port, process watcher and udev monitor: nothing here
        writes a setting, and anything that cannot be set up stops the start before any does."""
        cfg = self.profile.daemon if self.profile is not None else DaemonConfig()
        self.control = ControlServer(
            self.kernel, self.requests.handle, group=cfg.control_group, admin_group=cfg.admin_group
        )
        self.control.attach(self.loop)
        if cfg.metrics_port is not None:
            self._set_up_metrics(cfg)
        if cfg.realtime_priority and self.kernel.runs_gputuned:
            self._realtime(cfg.realtime_priority)
        self.watcher = open_watcher(self.kernel, poll_interval=1.0)
        if self.watcher.fileno() >= 0:
            # Priority: process events are taken before scrapes and control requests.
            self.loop.add_reader(
                self.watcher.fileno(), lambda _fd: self._on_proc_events(), priority=-10
            )
        self.udev = open_monitor(self.kernel)
        if self.udev is not None:
            self.loop.add_reader(self.udev.fileno(), lambda _fd: self._on_udev(), priority=-5)

    def _realtime(self, priority: int) -> None:
        """[daemon] realtime_priority: this (event) thread at SCHED_FIFO, so that a placement
        does not wait for a CPU behind the neighbours after each wakeup (issue 20)."""
        try:
            set_own_realtime(priority)
        except errors.GputunedError as exc:
            # Placing still works, only slower on a busy host: say why and run on.
            log.warning(
                "daemon: realtime_priority %d refused, staying SCHED_OTHER: %s", priority, exc
            )
            self.setup_notes.append(f"realtime_priority refused: {exc}")
        else:
            log.info("daemon: event thread at SCHED_FIFO %d", priority)

    def _set_up_metrics(self, cfg: DaemonConfig) -> None:
        from gputuned.watch.exposition import daemon_metrics

        try:
            self.metrics = MetricsServer(
                lambda: daemon_metrics(self.kernel, self.requests.status()),
                port=cfg.metrics_port or 0,
                address=self.metrics_address or cfg.metrics_address,
                allowed=metrics_allowed(cfg.metrics_allow),
            )
        except errors.GputunedError as exc:
            # Metrics are a view, not the job: the host is still tuned, and status says so.
            log.error("daemon: metrics off: %s", exc)
            self.setup_notes.append(f"metrics off: {exc}")
        else:
            self.metrics.attach(self.loop, priority=10)

    def _abort_start(self, exc: BaseException) -> None:
        if not isinstance(exc, errors.GputunedError | KeyboardInterrupt):
            log.error("daemon: start failed", exc_info=exc)
        if self.journal is not None and len(self.journal):
            log.error(
                "daemon: start failed; putting back the %d journaled value(s)", len(self.journal)
            )
            try:
                rep = revert_all(self.kernel, lock=False, journal=self.journal)
                log.info(
                    "daemon: reverted %d value(s), %d failed", len(rep.restored), len(rep.failed)
                )
            except Exception:
                log.exception("daemon: revert after a failed start failed; run gputunectl revert")
        self._close_sources()
        self.lock.__exit__(None, None, None)

    def _close_sources(self) -> None:
        for closer in (self.control, self.watcher, self.metrics):
            if closer is not None:
                try:
                    closer.close()
                except Exception:
                    log.exception("daemon: closing %s failed", type(closer).__name__)
        self.control = self.metrics = None
        self.watcher = None

    def run(self) -> int:
        while self.running:
            timeout = min(self._next.values(), default=now() + 1.0) - now()
            if self.watcher is not None and self.watcher.fileno() < 0:
                timeout = min(timeout, self.watcher.timeout or 1.0)
            if (self.control is not None and self.control.pending()) or self.new_threads:
                timeout = 0.0  # requests and new threads wait for their turn: no sleep
            self.loop.run_once(min(timeout, 1.0))
            if self.watcher is not None and self.watcher.fileno() < 0:
                self._guard("process scan", self._on_proc_events)
            if self.new_threads:
                self._guard("new threads", self._place_threads)
            if self.control is not None:
                self._guard("control requests", self.control.serve)
                self.control.expire(time.monotonic())
            if self.metrics is not None:
                self.metrics.expire(time.monotonic())
            self._guard("timers", self._timers)
        return self.stop()

    @staticmethod
    def _guard(what: str, fn: Callable[[], object]) -> None:
        """No input may end the daemon: what a task raises is logged and the loop goes on."""
        try:
            fn()
        except Exception:
            log.exception("daemon: %s failed; the daemon goes on", what)

    def stop(self) -> int:
        if self.handover:
            self.notify.send("STOPPING=1", "STATUS=handing over to the next gputuned")
        else:
            self.notify.send("STOPPING=1", "STATUS=reverting")
        skip = (
            self.profile is not None
            and not self.profile.daemon.revert_on_shutdown
            and system_stopping()
        )
        failed = 0
        if self.handover:
            log.info(
                "daemon: handing over: %d journaled value(s) stay applied; the next gputuned "
                "adopts them (gputunectl revert puts them back if none starts)",
                len(self.journal) if self.journal is not None else 0,
            )
        elif skip:
            log.info("daemon: system shutdown and revert_on_shutdown = false: not reverting")
        else:
            rep = revert_all(self.kernel, forget_profile=False, lock=False, journal=self.journal)
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
        self._close_sources()
        self.loop.close()
        self.lock.__exit__(None, None, None)
        return errors.GputunedError.exit_code if failed else 0

    def _on_proc_events(self) -> None:
        assert self.watcher is not None
        new: list[int] = []
        ended: list[str] = []  # journal keys of threads that ended
        forgot = len(self.claims)
        try:
            self._read_proc_events(new, ended)
        finally:
            if ended:  # one append for all of them; then compact when grown
                assert self.journal is not None
                self.journal.drop_many(ended)
                self.journal.compact_if_grown()
        if len(self.claims) < forgot:
            replan_if_moved(self)  # the last of a unit's server processes ended
        if new:
            for pid in new:
                self.new_threads.pop(pid, None)  # placed whole now
            self.place(sorted(set(new)), "new process")

    def _read_proc_events(self, new: list[int], ended: list[str]) -> None:
        assert self.watcher is not None
        for ev in self.watcher.read():
            if ev.kind == "overflow":
                log.warning(
                    "daemon: process events were lost (receive buffer overflow); rescanning"
                )
                if self.profile is not None:
                    self.reapply("rescan")
                return
            if ev.kind in ("exec", "fork", "comm"):
                # A fork: a new process, maybe a child of a claimed one (its parent's claim
                # carries over); exec and a new name: what it is may have changed (a spawned
                # child running its target, setproctitle).
                new.append(ev.pid)
            elif ev.kind == "thread" and ev.pid in self.claims and placing.places(self, ev.pid):
                # A thread: placed like its process, that thread alone (issue 14, finding 6:
                # re-reading every thread at each new one made a thread storm quadratic),
                # a few hundred a turn of the loop (_place_threads).
                self.new_threads.setdefault(ev.pid, set()).add(ev.tid)
            elif ev.kind == "exit" and ev.pid == ev.tid and placing.forget(self, ev.pid):
                n = forget_process(self.kernel, ev.pid, self.journal)
                log.info("daemon: pid %d exited; forgot %d journal entries", ev.pid, n)
                assert self.journal is not None
                self.journal.compact_if_grown()
            elif ev.kind == "exit" and ev.pid in self.claims:
                ended.extend(placing.forget_thread(self, ev.pid, ev.tid))

    def _place_threads(self) -> None:
        """Place up to THREADS_A_TURN of the new threads, then give the loop back: a
        process's thousands of threads must not hold up a server's placement or root's
        status behind them (new processes and requests are served between turns)."""
        take: dict[int, set[int]] = {}
        n = 0
        for pid in list(self.new_threads):
            tids = self.new_threads[pid]
            while tids and n < THREADS_A_TURN:
                take.setdefault(pid, set()).add(tids.pop())
                n += 1
            if not tids:
                del self.new_threads[pid]
            if n >= THREADS_A_TURN:
                break
        take = {pid: t for pid, t in take.items() if pid in self.claims}
        if take:
            self.place(sorted(take), "new thread", threads=take)

    def _on_udev(self) -> None:
        assert self.udev is not None
        events = self.udev.read()
        if events and self.profile is not None:
            self.counters["replans"] += 1
            log.info(
                "daemon: PCI %s; re-planning", ", ".join(f"{e.action} {e.bdf}" for e in events)
            )
            self.reapply("udev")

    def _on_hup(self, _sig: int) -> None:
        """Re-read the profile (see :meth:`_load_profile`) and apply the difference. Whatever
        fails, the profile in place stays and the daemon runs on."""
        self.notify.send("RELOADING=1", f"MONOTONIC_USEC={int(time.monotonic() * 1e6)}")
        old = self.profile, self.source, self.reload_path
        try:
            prof, src = self._load_profile()
        except Exception as exc:
            self._reload_failed(exc, old)
            return
        was = old[0].name if old[0] is not None else "none"
        log.info("daemon: reload: %s from %s (was %s)", prof.name if prof else "none", src, was)
        self.profile, self.source = prof, src
        self.counters["reloads"] += 1
        if self.profile is not None:
            try:
                self.apply_full("reload")
            except Exception as exc:
                self.counters["reloads"] -= 1
                self._reload_failed(exc, old)
                return
        self.notify.send("READY=1", f"STATUS={self.status}")

    def _reload_failed(self, exc: Exception, old: tuple[Profile | None, str, str | None]) -> None:
        if not isinstance(exc, errors.GputunedError):
            log.error("daemon: reload failed", exc_info=exc)
            exc = errors.GputunedError(f"internal error ({type(exc).__name__}); see the log")
        log.error("daemon: reload: %s; keeping the profile in place", exc)
        self.profile, self.source, self.reload_path = old
        self.notify.send("READY=1", f"STATUS={self.status} (reload failed: {exc})")

    def _on_term(self, sig: int) -> None:
        log.info("daemon: %s: stopping", signal.Signals(sig).name)
        self.running = False

    def _on_usr1(self, _sig: int) -> None:
        log.info("daemon: SIGUSR1: handing over to the next gputuned (an upgrade)")
        self.handover = True
        self.running = False

    def _on_usr2(self, _sig: int) -> None:
        log.warning("daemon: SIGUSR2: no more watchdog pings; systemd will restart this daemon")
        self.watchdog_on = False
