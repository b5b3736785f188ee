"""``gputuned``: the long-running service that keeps a profile applied.

Start: take the host lock for good, adopt or replay a journal left by an earlier run, load the
active profile (``gputunectl apply`` recorded it in /etc/gputuned/active.json), apply it, verify,
then tell systemd READY=1 with a STATUS= line. Then, in one single-threaded loop:

- process events (proc connector, or polling): a new process that matches a rule is placed at
  once, threads it creates later too; a process that exits is forgotten;
- udev events for PCI devices: the profile is re-planned (a GPU reset or re-bind can bring back
  the kernel's saved DevCtl, or new IRQ numbers);
- every ``[daemon] drift_interval_s``: everything applied is re-read and drift repaired;
- the control socket (gputunectl status, verify, top; apply, revert, register, unregister: root
  or [daemon] admin_group only; see gputuned/host/controlproto.py);
- WATCHDOG=1 at half of WatchdogSec=;
- SIGHUP re-reads the profile and applies only the difference; SIGTERM/SIGINT: STOPPING=1,
  revert everything, exit 0. SIGUSR2 stops the watchdog pings (to test watchdog recovery).
- SIGUSR1: hand over, for an upgrade (the Debian package's prerm sends it): exit 0 leaving
  everything applied and the journal in /run/gputuned, so the next daemon adopts it and a
  placed server's cgroup, nice level and CPUs never change. ``systemctl restart`` is a stop
  and a start: it reverts, then applies again.

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
from collections.abc import Callable, Sequence
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
from gputuned.daemon_access import (
    VERIFY_CACHE_S,
    metrics_allowed,
    profile_from_request,
    request_flag,
)
from gputuned.daemon_config import Config as DaemonConfig
from gputuned.engine import plan_processes, plan_profile, read_context
from gputuned.host import (
    Host,
    procctl,  # loaded now, not at the first placement
)
from gputuned.host.control import ControlServer, PeerCred
from gputuned.host.httpmetrics import MetricsServer
from gputuned.host.loop import Loop, now
from gputuned.host.notify import Notifier, setup_logging, system_stopping, watchdog_interval
from gputuned.host.proc import read_identity
from gputuned.host.procwatch import ProcWatcher, open_watcher
from gputuned.host.state import ACTIVE, HostLock
from gputuned.host.udevmon import UdevMonitor, open_monitor
from gputuned.journal import Journal
from gputuned.profile import Profile, load_profile, parse_profile
from gputuned.textsafe import printable
from gputuned.tuners.cmdmatch import SEARCHES
from gputuned.tuners.gpuplace import tree_roots
from gputuned.tuners.process import Claim, claim_processes
from gputuned.tuners.proctree import OWN_COMMS
from gputuned.tuners.spread import Held, held_threads
from gputuned.verify import verify_plan

log = logging.getLogger("gputuned")
#: New threads placed in one turn of the loop (each costs about a millisecond of CPU).
THREADS_A_TURN = 256


class Daemon:
    def __init__(
        self, host: Host, *, profile_path: Path | None = None, metrics_address: str | None = None
    ) -> None:
        self.host = host
        self.profile_path = profile_path
        #: --metrics-address: binds the metrics port there instead of [daemon] metrics_address
        #: (a pod's IP, known only when the pod starts: deploy/kubernetes).
        self.metrics_address = metrics_address
        self.notify = Notifier()
        self.profile: Profile | None = None
        self.source = ""
        #: The file SIGHUP re-reads the profile from; None: re-apply the stored copy.
        self.reload_path: str | None = None
        #: What could not be set up at start without stopping it (metrics), for status.
        self.setup_notes: list[str] = []
        self._verify_cache: tuple[float, bool, dict[str, Any]] | None = None
        self.ctx: PlanContext | None = None
        self._settings: list[Change] = []  # applied last, re-read by the drift check
        self._by_key: dict[str, Change] = {}
        # New threads of placed processes not placed yet: pid -> TIDs (see _place_threads).
        self._threads: dict[int, set[int]] = {}
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
        #: SIGUSR1: stop without reverting; the next daemon adopts the journal.
        self.handover = False
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

    @property
    def settings(self) -> list[Change]:
        return self._settings

    @settings.setter
    def settings(self, value: list[Change]) -> None:
        self._settings = value
        self._by_key = {c.key: c for c in value}

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
            self.journal = Journal(self.host)
            self.profile, self.source = self._load_profile()
            self._set_up()
            self._adopt_or_replay()
            if self.profile is not None:
                self._apply_full("start")
            else:
                self.status = "idle: no profile applied yet (gputunectl apply PROFILE)"
            self._schedule()
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
            self.host, self._handle, group=cfg.control_group, admin_group=cfg.admin_group
        )
        self.control.attach(self.loop)
        if cfg.metrics_port is not None:
            self._set_up_metrics(cfg)
        if cfg.realtime_priority and self.host.live:
            self._realtime(cfg.realtime_priority)
        self.watcher = open_watcher(self.host, poll_interval=1.0)
        if self.watcher.fileno() >= 0:
            # Priority: process events are taken before scrapes and control requests.
            self.loop.add_reader(
                self.watcher.fileno(), lambda _fd: self._on_proc_events(), priority=-10
            )
        self.udev = open_monitor(self.host)
        if self.udev is not None:
            self.loop.add_reader(self.udev.fileno(), lambda _fd: self._on_udev(), priority=-5)

    def _realtime(self, priority: int) -> None:
        """[daemon] realtime_priority: this (event) thread at SCHED_FIFO, so that a placement
        does not wait for a CPU behind the neighbours after each wakeup (issue 20)."""
        try:
            procctl.set_own_realtime(priority)
        except errors.GputunedError as exc:
            # Placing still works, only slower on a busy host: say why and run on.
            log.warning(
                "daemon: realtime_priority %d refused, staying SCHED_OTHER: %s", priority, exc
            )
            self.setup_notes.append(f"realtime_priority refused: {exc}")
        else:
            log.info("daemon: event thread at SCHED_FIFO %d", priority)

    def _set_up_metrics(self, cfg: DaemonConfig) -> None:
        from gputuned.metrics import daemon_metrics

        try:
            self.metrics = MetricsServer(
                lambda: daemon_metrics(self.host, self._status()),
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
                rep = revert_all(self.host, lock=False, journal=self.journal)
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
            if (self.control is not None and self.control.pending()) or self._threads:
                timeout = 0.0  # requests and new threads wait for their turn: no sleep
            self.loop.run_once(min(timeout, 1.0))
            if self.watcher is not None and self.watcher.fileno() < 0:
                self._guard("process scan", self._on_proc_events)
            if self._threads:
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
        self._close_sources()
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
        """The profile to keep applied: --profile, else the file active.json names as one root
        may read again (its ``path``), else the copy stored there. A file that no longer
        loads, for any reason, falls back to the copy (issue 14, finding 11)."""
        if self.profile_path is not None:
            self.reload_path = str(self.profile_path.absolute())
            return load_profile(self.profile_path), self.reload_path
        active = read_active(self.host)
        if active is None:
            return None, ""
        src = str(active.get("source", ""))
        path = active.get("path")
        self.reload_path = None
        if isinstance(path, str) and path and Path(path).is_file():
            try:
                profile = load_profile(path)
            except Exception as exc:
                log.error("daemon: %s no longer loads (%s); using the copy applied last", path, exc)
            else:
                self.reload_path = path
                return profile, src
        return parse_profile(active["profile"], ACTIVE), src

    def _apply_full(self, why: str) -> ApplyReport:
        assert self.profile is not None
        if why in ("start", "reload", "apply"):
            SEARCHES.reset()  # a pattern suspended for its CPU budget gets a new chance
        plan, report = apply_profile(
            self.host,
            self.profile,
            keep_going=True,
            source=self.source,
            lock=False,
            registered=self.registered,
            journal=self.journal,
            reload_path=self.reload_path,
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
        self._settle_gpu_use()
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

    def _place(self, pids: list[int], why: str, threads: dict[int, set[int]] | None = None) -> None:
        """Plan and apply ``pids`` (``threads``: only these new threads of each)."""
        if self.profile is None or self.ctx is None or not self.profile.process:
            return
        t0 = time.perf_counter()
        ctx = dataclasses.replace(
            self.ctx, claimed=self.claims, registered=self.registered, held=self.held
        )
        settings, claims = plan_processes(ctx, pids, threads)
        self.claims.update(claims)
        if not settings:
            return
        self._keep(settings, merge=threads is not None)
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

    def _settle_gpu_use(self) -> None:
        """After a full apply, place the ``by_gpu`` trees once more against this context's
        reading of their GPU use: a GPU opened between the apply's plan and now would
        otherwise look unchanged to every later scan (nothing is written where nothing
        changed)."""
        if self.profile is None or self.ctx is None or self.ctx.gpu_use is None:
            return
        rules = {r.name for r in self.profile.process if r.by_gpu}
        mine = sorted(pid for pid, c in self.claims.items() if c.rule in rules)
        if mine:
            self._place(mine, "GPU use at apply")

    def _gpu_scan(self) -> None:
        """``by_gpu`` rules: has a process placed by one, and without a GPU open then, opened
        one since? The kernel announces no open(2), so the device nodes of those processes are
        read again (tuners/gpuuse.py); a change re-plans the whole tree, since its processes
        that use no GPU go with the GPUs the tree uses. NVML's answers change with the full
        re-plan every nvml_interval_s."""
        if self.profile is None or self.ctx is None or self.ctx.gpu_use is None:
            return
        rules = {r.name for r in self.profile.process if r.by_gpu}
        use = self.ctx.gpu_use
        # Only processes that have not opened a GPU yet: one that has is placed on it, and
        # reading every descriptor of every worker each scan would cost the most on the
        # busiest processes (a CUDA process may later open its peers' nodes too).
        mine = [pid for pid, c in self.claims.items() if c.rule in rules and pid not in use.opened]
        if not mine:
            return
        before = {pid: use.of(pid) for pid in mine}
        use.forget(set(mine))
        changed = [pid for pid in mine if use.of(pid) != before[pid]]
        if not changed:
            return
        roots = tree_roots(self.claims)
        trees = {roots.get(pid, pid) for pid in changed}
        for pid in changed:
            log.info(
                "daemon: pid %d now uses GPU(s) %s (was %s)",
                pid,
                sorted(use.of(pid)) or "none",
                sorted(before[pid]) or "none",
            )
        self._place(sorted(p for p in mine if roots.get(p, p) in trees), "GPU use changed")

    def _keep(self, settings: list[Change], *, merge: bool = False) -> None:
        """A placement's settings join those the drift check re-reads, replacing the same
        settings planned earlier (a thread moved off the CPU a new main thread took).
        ``merge``: the settings of some new threads only; they join their process's."""
        mine = [c for c in settings if not c.report_only]
        if merge:
            mine = [c for c in mine if not self._merged(c)]
        keys = {c.key for c in mine}
        if keys:
            self.settings = [c for c in self.settings if c.key not in keys] + mine
        self.held.update(held_threads(mine))

    def _merged(self, ch: Change) -> bool:
        """Add the threads of ``ch`` to the same setting of their process (in place: a new
        thread costs the daemon its own values, not a copy of all the others)."""
        have = self._by_key.get(ch.key)
        if have is None or ch.kind != "thread":
            return False
        for k in ("threads", "old", "origin"):
            have.data.setdefault(k, {}).update(ch.data.get(k, {}))
        for pid, h in held_threads([ch]).items():
            was = self.held.get(pid)
            if was is not None and was.start == h.start:
                was.threads.update(h.threads)
            else:
                self.held[pid] = h
        return True

    # -- events -------------------------------------------------------------------------------

    def _on_proc_events(self) -> None:
        assert self.watcher is not None
        new: list[int] = []
        ended: list[str] = []  # journal keys of threads that ended
        try:
            self._read_proc_events(new, ended)
        finally:
            if ended:  # one append for all of them; then compact when grown
                assert self.journal is not None
                self.journal.drop_many(ended)
                self.journal.compact_if_grown()
        if new:
            for pid in new:
                self._threads.pop(pid, None)  # placed whole now
            self._place(sorted(set(new)), "new process")

    def _read_proc_events(self, new: list[int], ended: list[str]) -> None:
        assert self.watcher is not None
        for ev in self.watcher.read():
            if ev.kind == "overflow":
                log.warning(
                    "daemon: process events were lost (receive buffer overflow); rescanning"
                )
                if self.profile is not None:
                    self._reapply("rescan")
                return
            if ev.kind in ("exec", "fork", "comm"):
                # A fork: a new process, maybe a child of a claimed one (its parent's claim
                # carries over); exec and a new name: what it is may have changed (a spawned
                # child running its target, setproctitle).
                new.append(ev.pid)
            elif ev.kind == "thread" and ev.pid in self.claims and self._places(ev.pid):
                # A thread: placed like its process, that thread alone (issue 14, finding 6:
                # re-reading every thread at each new one made a thread storm quadratic),
                # a few hundred a turn of the loop (_place_threads).
                self._threads.setdefault(ev.pid, set()).add(ev.tid)
            elif ev.kind == "exit" and ev.pid == ev.tid and self._forget(ev.pid):
                n = forget_process(self.host, ev.pid, self.journal)
                log.info("daemon: pid %d exited; forgot %d journal entries", ev.pid, n)
                assert self.journal is not None
                self.journal.compact_if_grown()
            elif ev.kind == "exit" and ev.pid in self.claims:
                ended.extend(self._forget_thread(ev.pid, ev.tid))

    def _place_threads(self) -> None:
        """Place up to THREADS_A_TURN of the new threads, then give the loop back: a
        process's thousands of threads must not hold up a server's placement or root's
        status behind them (new processes and requests are served between turns)."""
        take: dict[int, set[int]] = {}
        n = 0
        for pid in list(self._threads):
            tids = self._threads[pid]
            while tids and n < THREADS_A_TURN:
                take.setdefault(pid, set()).add(tids.pop())
                n += 1
            if not tids:
                del self._threads[pid]
            if n >= THREADS_A_TURN:
                break
        take = {pid: t for pid, t in take.items() if pid in self.claims}
        if take:
            self._place(sorted(take), "new thread", threads=take)

    def _forget_thread(self, pid: int, tid: int) -> list[str]:
        """A thread of a placed process ended: its settings go, and the journal keys returned
        (dropped by the caller, all at once), so that the journal holds the threads alive, not
        every thread there ever was (issue 14, finding 6); compaction keeps the file within
        twice that plus 256 lines (Journal.compact_if_grown)."""
        start = self.claims[pid].start
        self._threads.get(pid, set()).discard(tid)
        keys = []
        for attr in ("nice", "policy", "affinity"):  # the per-thread settings
            keys.append(f"thread:{pid}:{start}:{tid}:{attr}")
            ch = self._by_key.get(f"thread:{pid}:{start}:{attr}")
            if ch is not None:
                for k in ("threads", "old", "origin"):
                    ch.data.get(k, {}).pop(tid, None)
        held = self.held.get(pid)
        if held is not None:
            held.threads.pop(tid, None)
        return keys

    def _places(self, pid: int) -> bool:
        return self.claims[pid].role != "excluded"

    def _forget(self, pid: int) -> bool:
        was_claimed = self._drop(pid)
        return self.registered.pop(pid, None) is not None or was_claimed

    def _drop(self, pid: int) -> bool:
        """Stop placing ``pid`` (gone, or unregistered): its claim and settings go."""
        self.held.pop(pid, None)
        self._threads.pop(pid, None)
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
        self.profile, self.source = prof, src
        self.counters["reloads"] += 1
        if self.profile is not None:
            try:
                self._apply_full("reload")
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

    # -- timers -------------------------------------------------------------------------------

    def _schedule(self) -> None:
        t = now()
        wd = watchdog_interval()
        if wd:
            self._next["watchdog"] = t + wd
        if self.profile is not None:
            self._next["drift"] = t + self.profile.daemon.drift_interval_s
            rules = self.profile.process
            if any(r.match.uses_gpu is not None or r.by_gpu for r in rules):
                self._next["nvml"] = t + self.profile.daemon.nvml_interval_s
            if any(r.by_gpu for r in rules):
                self._next["gpuscan"] = t + self.profile.daemon.gpu_scan_interval_s
        else:
            for timer in ("drift", "nvml", "gpuscan"):
                self._next.pop(timer, None)

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
        if self._next.get("gpuscan", float("inf")) <= t:
            self._gpu_scan()
            self._next["gpuscan"] = now() + self.profile.daemon.gpu_scan_interval_s

    # -- control socket -----------------------------------------------------------------------

    def _handle(self, req: dict[str, Any], peer: PeerCred) -> dict[str, Any]:
        """One control request. The server has parsed it and refused what this peer may not
        send (controlproto: read-only commands for the control group, changing ones for root
        and the admin group); each field is checked here before it is used."""
        cmd = req["cmd"]
        log.info("daemon: control: %s from pid %d uid %d", cmd, peer.pid, peer.uid)
        if cmd == "status":
            return self._status()
        if cmd == "top":
            return {k: v for k, v in self._status().items() if k in _TOP_KEYS}
        if cmd == "verify":
            return self._verify_for(peer, strict=request_flag(req, "strict"))
        if cmd == "apply":
            return self._apply_request(req, peer)
        if cmd == "revert":
            rep = revert_all(self.host, lock=False, journal=self.journal)
            self.profile, self.ctx, self.claims, self.registered = None, None, {}, {}
            self.reload_path, self._verify_cache, self.held = None, None, {}
            self.status = "idle: reverted (gputunectl apply PROFILE)"
            self._schedule()
            self.notify.send(f"STATUS={self.status}")
            return rep.to_json()
        if cmd in ("register", "unregister"):
            return self._register(cmd, req)
        raise errors.GputunedError(
            f"unknown command '{printable(cmd)[:40]}'; see gputunectl --help"
        )

    def _apply_request(self, req: dict[str, Any], peer: PeerCred) -> dict[str, Any]:
        profile, source, reload_path = profile_from_request(self.host, req, peer)
        old = self.profile, self.source, self.profile_path, self.reload_path
        self.profile, self.source, self.profile_path = profile, source, None
        self.reload_path, self._verify_cache = reload_path, None
        try:
            report = self._apply_full("apply")
        except Exception:
            self.profile, self.source, self.profile_path, self.reload_path = old
            raise  # the client gets the error
        self._schedule()
        self.notify.send(f"STATUS={self.status}")
        return {"profile": profile.name, **report.to_json()}

    def _verify_for(self, peer: PeerCred, *, strict: bool) -> dict[str, Any]:
        """A fresh verify for root; others get one at most VERIFY_CACHE_S old (each is a full
        plan, and a member of the control group must not keep the daemon busy with them)."""
        if self.profile is None:
            raise errors.GputunedError("no profile applied; gputunectl apply PROFILE first")
        t = time.monotonic()
        cached = self._verify_cache
        if peer.uid != 0 and cached and cached[1] == strict and t - cached[0] < VERIFY_CACHE_S:
            return cached[2]
        vrep = verify_plan(
            plan_profile(self.host, self.profile, registered=self.registered),
            read_state(self.host),
            strict=strict,
        )
        out = vrep.to_json()
        self._verify_cache = (t, strict, out)
        return out

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
            "notes": self.setup_notes + SEARCHES.notes(),
        }  # fmt: skip


#: What ``top`` needs of the status: the processes to watch.
_TOP_KEYS = ("active_profile", "placed", "registered")


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


def build_parser() -> argparse.ArgumentParser:
    from gputuned.cli import host_root

    p = argparse.ArgumentParser(
        prog="gputuned", description=__doc__.split("\n\n")[0].replace("``", "")
    )
    p.add_argument("--version", action="version", version=f"gputuned {__version__}")
    p.add_argument(
        "--root", type=host_root, default=Path("/"), help="run against a host tree (absolute path)"
    )
    p.add_argument("--profile", type=Path, help="apply this profile instead of the active one")
    p.add_argument(
        "--metrics-address",
        type=_ip_address,
        metavar="ADDRESS",
        help="bind [daemon] metrics_port to this IP address instead of metrics_address (a "
        "Kubernetes pod's IP, from the downward API)",
    )
    p.add_argument("--foreground", action="store_true", help="accepted; gputuned never forks")
    p.add_argument("--debug", action="store_true", help="debug logging")
    return p


def _ip_address(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an IP address; give one such as 10.1.2.3"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    where = setup_logging(debug=args.debug, to_journal=Notifier().enabled)
    log.info("daemon: gputuned %s starting on %s, logging to %s", __version__, args.root, where)
    d = Daemon(Host(args.root), profile_path=args.profile, metrics_address=args.metrics_address)
    try:
        d.start()
    except errors.GputunedError as exc:
        log.error("daemon: cannot start: %s", exc)
        d.notify.send(f"STATUS=failed: {exc}", f"ERRNO={getattr(exc, 'errno', 0) or 0}")
        return exc.exit_code
    except Exception as exc:  # a bug: start() logged its traceback and put the host back
        d.notify.send(f"STATUS=failed: internal error ({type(exc).__name__}); see the log")
        return 1
    return d.run()


if __name__ == "__main__":
    sys.exit(main())
