"""Processes that bind themselves: when a placed process keeps setting its own CPUs back, the
daemon stops repairing them instead of fighting it every ``drift_interval_s`` (issue 17, item 3).

What counts as the process undoing gputuned's CPUs, as well as the kernel lets it be told:

- the affinity gputuned wrote to the threads of a placed process (a CPU list; "all its cgroup
  allows" is no binding and is not watched) no longer holds, read at a drift check on the
  process's own threads (``/proc/PID/task/TID/status``), with the process's identity (PID and
  start time) checked;
- and at the drift check before, the same process's CPUs had been undone as well, and gputuned
  put them back in between (that check's repair): twice in a row, the second time within one
  ``drift_interval_s`` of gputuned's repair.

Nothing in the kernel says *who* called sched_setaffinity(2): another root process (``taskset
-p``, a container runtime, irqbalance does not touch tasks) that rewrites the process's CPUs
twice in a row looks the same, and is treated the same. A person's ``taskset`` once is repaired
and counted no further: the count starts again at the first check that finds gputuned's CPUs
in place.

Then, with the rule's ``self_binding = "respect"`` (the default), the process's affinity leaves
the settings the daemon keeps: its journaled originals are dropped (revert would otherwise undo
the process's own binding), later plans leave its CPUs alone (``PlanContext.self_bound``), and
nice, policy, its cgroup and the IRQs stay as they were planned. With ``"override"`` the daemon
repairs as before and only reports it. Either way: one log line, ``status`` lists the process,
``verify`` shows its CPUs as "left to the process" (respect), and the metrics count it. A new
process (another PID, or the PID reused) starts with a clean slate; a reload or apply whose rule
no longer says "respect" for it ends the back-off.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from gputuned import errors
from gputuned.engine.verify import SELF_BOUND, Line
from gputuned.settings.base import Reused
from gputuned.settings.registry import expand, holds
from gputuned.settings.threads import DEFAULT_AFFINITY
from gputuned.textsafe import printable

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from gputuned.changes import Change
    from gputuned.engine.journal import Journal
    from gputuned.kernel import Kernel
    from gputuned.tuners.context import Claim

log = logging.getLogger("gputuned")


@dataclass
class SelfBound:
    """A process found binding itself: what it set, what gputuned had set, since when."""

    pid: int
    start: int
    rule: str
    mode: str  # the rule's self_binding: "respect" (left alone) or "override" (repaired)
    cpus: str  # what the process set (the thread read last)
    wanted: str  # what gputuned had written
    since: float  # wall-clock time of the back-off

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class BindWatch:
    """The count of undone CPUs per placed process across drift checks, and the processes
    found binding themselves (:mod:`gputuned.daemon.selfbind`)."""

    def __init__(self) -> None:
        self.tick = 0
        #: pid -> (start time, drift check at which its CPUs were last found undone).
        self.pending: dict[int, tuple[int, int]] = {}
        self.found: dict[int, SelfBound] = {}

    def self_bound(self) -> dict[int, int]:
        """pid -> start time of the processes whose CPUs the daemon leaves to them."""
        return {p: s.start for p, s in self.found.items() if s.mode == "respect"}

    def forget(self, pid: int) -> None:
        self.pending.pop(pid, None)
        self.found.pop(pid, None)

    def keep_rules(self, modes: Mapping[str, str]) -> None:
        """A new profile (apply, reload): a back-off whose rule is gone or no longer says the
        same ``self_binding`` ends (its process is planned like any other again)."""
        for pid, s in list(self.found.items()):
            if modes.get(s.rule) != s.mode:
                self.forget(pid)

    def check(
        self,
        kernel: Kernel,
        settings: Iterable[Change],
        claims: Mapping[int, Claim],
        modes: Mapping[str, str],
    ) -> tuple[set[str], set[int], list[SelfBound]]:
        """One drift check of every placed process's CPUs. Returns the keys of the settings
        read (the drift check need not read them again), the processes whose CPUs are undone
        now (to repair), and those found binding themselves at this check."""
        self.tick += 1
        read: set[str] = set()
        undone: dict[int, tuple[int, str, str]] = {}  # pid -> (start, seen, wanted)
        for ch in settings:
            pid = ch.data.get("pid")
            if ch.kind != "thread" or ch.data.get("attr") != "affinity" or not isinstance(pid, int):
                continue
            c = claims.get(pid)
            if c is None or c.role == "excluded" or c.start != ch.data.get("start"):
                continue
            read.add(ch.key)
            seen = _undone(kernel, ch)
            if seen is not None:
                undone[pid] = (c.start, *seen)
        self.pending = {p: v for p, v in self.pending.items() if p in undone}
        new: list[SelfBound] = []
        for pid, (start, seen_cpus, wanted) in undone.items():
            before = self.pending.get(pid)
            if pid in self.found:
                continue  # "override": repaired as before, reported once
            if before is not None and before == (start, self.tick - 1):
                c = claims[pid]
                mode = modes.get(c.rule, "respect")
                self.found[pid] = SelfBound(
                    pid, start, c.rule, mode, seen_cpus, wanted, time.time()
                )
                new.append(self.found[pid])
                self.pending.pop(pid, None)
            else:
                self.pending[pid] = (start, self.tick)
        return read, set(undone), new

    def lines(self) -> list[Line]:
        """verify's lines for the processes left alone: not drift, not failed."""
        return [
            Line(
                SELF_BOUND,
                "process",
                f"pid {s.pid} CPUs (rule {printable(s.rule)})",
                s.cpus,
                s.wanted,
                'left to the process: it binds itself (self_binding = "respect"; see '
                "gputunectl status)",
            )
            for s in self.found.values()
            if s.mode == "respect"
        ]


def _undone(kernel: Kernel, ch: Change) -> tuple[str, str] | None:
    """(what a thread shows, what gputuned wrote) for the first thread of ``ch`` whose CPUs
    are no longer gputuned's; None when every one holds (or the process is gone)."""
    for op in expand(ch):
        if op.value == DEFAULT_AFFINITY:
            continue  # "all its cgroup allows" binds nothing
        try:
            ok, seen = holds(kernel, op, op.value)
        except (errors.TargetGone, Reused):
            return None  # exited, or the PID is another process's: the watcher forgets it
        except errors.GputunedError:
            continue  # unreadable now; the drift check reports it
        if not ok:
            return seen, op.value
    return None


def without_cpus(settings: list[Change], pid: int) -> list[Change]:
    """``settings`` less the CPUs of ``pid`` (all its threads)."""
    return [
        c
        for c in settings
        if not (
            c.kind == "thread" and c.data.get("attr") == "affinity" and c.data.get("pid") == pid
        )
    ]


def drop_originals(journal: Journal, sb: SelfBound) -> int:
    """Forget the journaled original CPUs of a process left to itself: revert must not undo
    its own binding, nor a later apply put it back as a leftover. Returns how many."""
    keys = [
        e.op.key
        for e in journal.entries()
        if e.op.kind == "affinity"
        and e.op.data.get("pid") == sb.pid
        and e.op.data.get("start") == sb.start
    ]
    if keys:
        journal.drop_many(keys)
    return len(keys)


def report(sb: SelfBound, dropped: int) -> None:
    """The one log line for a process found binding itself."""
    if sb.mode != "respect":
        log.warning(
            "daemon: pid %d (rule %s) set its own CPUs back twice right after gputuned set "
            'them (now %s, gputuned\'s %s); self_binding = "override": repairing on',
            sb.pid, sb.rule, sb.cpus, sb.wanted,
        )  # fmt: skip
        return
    log.warning(
        "daemon: pid %d (rule %s) set its own CPUs back twice right after gputuned set them "
        '(now %s, gputuned\'s %s); leaving its CPUs to it (self_binding = "respect", %d '
        "journaled original(s) dropped); nice, policy and IRQs stay applied",
        sb.pid, sb.rule, sb.cpus, sb.wanted, dropped,
    )  # fmt: skip
