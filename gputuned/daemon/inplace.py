"""The daemon's side of a partition made in place (tuners/inplace.py): when the server's own
cgroup changes (a unit started, stopped or restarted), the profile is applied in full again."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gputuned.tuners import inplace

if TYPE_CHECKING:
    from gputuned.daemon.state import DaemonState

log = logging.getLogger("gputuned")


def replan_if_moved(k: DaemonState) -> bool:
    """Has the server's own cgroup, as the partition made in place, changed since the last
    full plan (a unit started, stopped or restarted: tuners/inplace.py)? Then apply in
    full, and say so: the placeholder lets its CPUs go to the unit's cgroup, or takes back
    what a stopped unit's cgroup gave back."""
    ctx = k.ctx
    if ctx is None or k.replanning or not inplace.applies(ctx):
        return False
    have = inplace.decision(ctx).place
    want = inplace.decide(ctx, k.claims).place
    if want == have and not (have is not None and inplace.lost(ctx, have)):
        return False
    log.info(
        "daemon: the partition in place moves: %s -> %s",
        have.cgroup if have else "gputuned's own cgroup",
        want.cgroup if want else "gputuned's own cgroup",
    )
    k.replanning = True
    try:
        k.reapply("partition in place")
    finally:
        k.replanning = False
    return True


def say_decision(k: DaemonState, notes: list[str]) -> None:
    """Log the plan's line on the partition in place whenever it changes: why a server's
    processes were moved out of their unit shows in the journal, with the process that was
    in the way."""
    said = next((n for n in notes if n.startswith(_SAID)), None)
    if said is not None and said != k.inplace_said:
        log.info("daemon: %s", said)
    k.inplace_said = said


_SAID = ("cpuset: partition in place: ", "cpuset: not partitioned in place: ")
