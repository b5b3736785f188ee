"""What the daemon knows and how it keeps a profile applied: load it, apply it in full,
check for drift, and the timers (watchdog, drift, NVML, GPU-use scan) that trigger these.
Placing new processes and threads between full applies is daemon/placing.py's. See
:mod:`gputuned.daemon`."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from gputuned import errors
from gputuned.changes import Change
from gputuned.daemon import placing
from gputuned.daemon.inplace import say_decision
from gputuned.daemon.selfbind import BindWatch, drop_originals, report, without_cpus
from gputuned.engine.apply import (
    ApplyReport,
    apply_profile,
    read_active,
    read_state,
    revert_all,
)
from gputuned.engine.journal import Journal
from gputuned.engine.plan import plan_profile, read_context
from gputuned.engine.verify import verify_plan
from gputuned.kernel import Kernel
from gputuned.profile.load import load_profile, parse_profile
from gputuned.profile.model import Profile
from gputuned.service.control import ControlServer
from gputuned.service.httpmetrics import MetricsServer
from gputuned.service.loop import Loop, now
from gputuned.service.notify import Notifier, watchdog_interval
from gputuned.service.procwatch import ProcWatcher
from gputuned.service.udevmon import UdevMonitor
from gputuned.settings.base import Reused
from gputuned.settings.registry import expand, holds
from gputuned.store.state import ACTIVE, HostLock
from gputuned.tuners import inplace
from gputuned.tuners.cmdmatch import SEARCHES
from gputuned.tuners.context import Claim, Held, PlanContext
from gputuned.tuners.spread import held_threads

log = logging.getLogger("gputuned")


class Keeper:
    """The daemon's state and its upkeep; :class:`~gputuned.daemon.core.Daemon` adds the life
    cycle and the event sources, and its :class:`~gputuned.daemon.control.Requests` answers
    control requests on this state."""

    def __init__(
        self,
        kernel: Kernel,
        *,
        profile_path: Path | None = None,
        metrics_address: str | None = None,
    ) -> None:
        self.kernel = kernel
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
        self.ctx: PlanContext | None = None
        self._settings: list[Change] = []  # applied last, re-read by the drift check
        self.by_key: dict[str, Change] = {}
        # New threads of placed processes not placed yet: pid -> TIDs (see _place_threads).
        self.new_threads: dict[int, set[int]] = {}
        self._drift_ticks = 0
        self.claims: dict[int, Claim] = {}  # processes the rules claim: placed or left out
        self.registered: dict[int, tuple[int, str]] = {}  # pid -> (start time, rule name)
        # The CPUs placed processes' threads were given: a new process of a tree spread over
        # a partition is planned against them (tuners/spread.py).
        self.held: dict[int, Held] = {}
        self.counters = {"repairs": 0, "replans": 0, "placements": 0, "reloads": 0}
        self.counters["self_binding"] = 0  # processes found binding themselves (selfbind.py)
        self.binds = BindWatch()
        #: The plan's warning for each matched process that will bind itself, by PID.
        self.binding_warnings: dict[int, str] = {}
        self.status = "starting"
        self.last_verify: dict[str, Any] = {}
        self.running = True
        #: SIGUSR1: stop without reverting; the next daemon adopts the journal.
        self.handover = False
        self.watchdog_on = True
        self.loop = Loop()
        self.lock = HostLock(kernel)
        self.journal: Journal | None = None  # opened under the lock; the daemon's only copy
        self.watcher: ProcWatcher | None = None
        self.udev: UdevMonitor | None = None
        self.control: ControlServer | None = None
        self.metrics: MetricsServer | None = None
        self.last_verify_at: float | None = None
        self._next: dict[str, float] = {}
        self.replanning = False  # a full apply for the partition in place is under way
        self.inplace_said: str | None = None  # the plan's line on it, logged last

    @property
    def settings(self) -> list[Change]:
        return self._settings

    @settings.setter
    def settings(self, value: list[Change]) -> None:
        self._settings = value
        self.by_key = {c.key: c for c in value}

    def _adopt_or_replay(self) -> None:
        journal = self.journal
        assert journal is not None
        if not len(journal):
            return
        if read_active(self.kernel) is None and self.profile_path is None:
            rep = revert_all(self.kernel, lock=False, journal=journal)
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
        active = read_active(self.kernel)
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

    def apply_full(self, why: str) -> ApplyReport:
        assert self.profile is not None
        if why in ("start", "reload", "apply"):
            SEARCHES.reset()  # a pattern suspended for its CPU budget gets a new chance
        self.binds.keep_rules({r.name: r.self_binding for r in self.profile.process})
        plan, report = apply_profile(
            self.kernel,
            self.profile,
            keep_going=True,
            source=self.source,
            lock=False,
            registered=self.registered,
            journal=self.journal,
            reload_path=self.reload_path,
            self_bound=self.binds.self_bound(),
        )
        self._keep_alive()
        self.ctx = read_context(
            self.kernel,
            self.profile,
            registered=self.registered,
            journal=self.journal,
            self_bound=self.binds.self_bound(),
        )
        inplace.decision(self.ctx)  # what this apply made, before its processes change
        say_decision(self, plan.notes)
        self.settings = [
            c for c in plan.settings if not c.report_only and c.key not in report.not_possible
        ]
        self.held = held_threads(self.settings)
        self._drift_ticks = 0
        for w in report.written:
            log.info("daemon: %s: set %s: %s -> %s", why, w["target"], w["old"], w["new"])
        for rs in report.restored:
            log.info("daemon: %s: restored %s to %s (not in this profile)", why, rs["target"],
                     rs["value"])  # fmt: skip
        for f in report.failed:
            log.error("daemon: %s: %s failed: %s", why, f["target"], f["error"])
        log.info(
            "daemon: %s: applied %s: %d write(s), %d restored, %d already right, %d not possible "
            "here, %d failed, in %.1f ms",
            why,
            self.profile.name,
            len(report.written),
            len(report.restored),
            len(plan.settings) - len(plan.changes),
            len(report.not_possible),
            len(report.failed),
            report.seconds * 1e3,
        )
        self._keep_alive()
        placing.refresh_placed(self)
        self.binding_warnings = {}
        placing.warn_binding(self, sorted(self.claims))
        placing.settle_gpu_use(self)
        self._verify()
        self._keep_alive()
        return report

    def reapply(self, why: str) -> ApplyReport | None:
        """``apply_full`` for the daemon's own triggers (drift, udev, NVML, rescan): a profile
        that cannot be planned now (a CPU set gone empty, a neighbour's partition taking its
        CPUs) leaves what is applied in place and the daemon running, degraded."""
        try:
            return self.apply_full(why)
        except errors.GputunedError as exc:
            log.error("daemon: %s: %s; keeping what is applied", why, exc)
            self.status = f"degraded: {why}: {exc}"
            self.notify.send(f"STATUS={self.status}")
            return None

    def _drifted(self, skip: set[str] | frozenset[str] = frozenset()) -> bool:
        """Does any applied setting no longer hold? Reads only those settings' files (not those
        of ``skip``: read already)."""
        for ch in self.settings:
            if ch.key in skip:
                continue
            for op in expand(ch):
                try:
                    if not holds(self.kernel, op, op.value)[0]:
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

    def place(self, pids: list[int], why: str, threads: dict[int, set[int]] | None = None) -> None:
        """Plan and apply ``pids`` (``threads``: only these new threads of each): every
        placement comes through here, into daemon/placing.py."""
        placing.place(self, pids, why, threads)

    def _verify(self) -> None:
        assert self.profile is not None
        rep = verify_plan(
            plan_profile(
                self.kernel,
                self.profile,
                registered=self.registered,
                journal=self.journal,
                self_bound=self.binds.self_bound(),
            ),
            read_state(self.kernel),
        )
        rep.lines += self.binds.lines()
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

    def _check_self_binding(self) -> tuple[set[str], set[int]]:
        """The drift check of placed processes' CPUs (daemon/selfbind.py): the settings read,
        and the processes whose CPUs are undone now and still to be repaired. One found
        binding itself under "respect" leaves the settings kept, with its journaled original
        CPUs (revert must not undo its binding)."""
        assert self.profile is not None and self.journal is not None
        modes = {r.name: r.self_binding for r in self.profile.process}
        read, undone, found = self.binds.check(self.kernel, self.settings, self.claims, modes)
        for sb in found:
            self.counters["self_binding"] += 1
            if sb.mode == "respect":
                self.settings = without_cpus(self.settings, sb.pid)
                self.held.pop(sb.pid, None)
            report(sb, drop_originals(self.journal, sb) if sb.mode == "respect" else 0)
        if any(sb.mode == "respect" for sb in found):
            self._verify()  # status, metrics: its CPUs are "left to the process" from now on
        return read, {pid for pid in undone if pid not in self.binds.self_bound()}

    def schedule(self) -> None:
        t = now()
        wd = watchdog_interval()
        if wd:
            # Only the first time: a ping that is due stays due. Pushing it on at every apply
            # (as this once did) let an apply and a verify that took 17 s and 13 s in a slow
            # guest go 30 s without a ping, and systemd killed the daemon mid-request.
            self._next.setdefault("watchdog", t + wd)
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

    def _keep_alive(self) -> None:
        """WATCHDOG=1 when one is due. The loop's timers call it, and so do the long steps of an
        apply: one apply longer than WatchdogSec= on a slow host must not get the daemon killed
        half-way through its writes."""
        t = now()
        if self._next.get("watchdog", float("inf")) <= t:
            if self.watchdog_on:
                self.notify.send("WATCHDOG=1")
            self._next["watchdog"] = t + (watchdog_interval() or 1.0)

    def _timers(self) -> None:
        t = now()
        self._keep_alive()
        if self.profile is None:
            return
        if self._next.get("drift", float("inf")) <= t:
            self._drift_ticks += 1
            # Cheap check first: re-read only what was applied, placed processes' CPUs first
            # (one that keeps setting its own back is left to it: daemon/selfbind.py). A full
            # re-plan (every process, device and IRQ read again) runs when something drifted,
            # and every 10th tick to catch what no event announced.
            read, undone = self._check_self_binding()
            if undone or self._drifted(skip=read) or self._drift_ticks >= 10:
                report = self.reapply("drift repair")
                if report is not None:
                    self.counters["repairs"] += len(report.written)
                    self.notify.send(f"STATUS={self.status}")
            self._next["drift"] = t + self.profile.daemon.drift_interval_s
        if self._next.get("nvml", float("inf")) <= t:
            self.reapply("nvml")
            self._next["nvml"] = t + self.profile.daemon.nvml_interval_s
        if self._next.get("gpuscan", float("inf")) <= t:
            placing.gpu_scan(self)
            self._next["gpuscan"] = now() + self.profile.daemon.gpu_scan_interval_s
