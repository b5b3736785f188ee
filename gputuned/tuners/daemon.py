"""Plans the `[daemon]` table (its keys and manual: gputuned/profile/tables/daemon.py): it
writes nothing, but the groups and users it names must exist on this machine. Plan says so (a
blocking refusal, so that apply refuses the profile too) rather than the daemon failing at its
next start (issue 14, finding 10)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.changes import Change, Refusal, TunerPlan
from gputuned.kernel.users import group_gid, user_uid
from gputuned.profile.tables.daemon import Config as DaemonConfig

if TYPE_CHECKING:
    from gputuned.tuners.context import PlanContext

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def resolve_metrics_allow(
    entries: tuple[str, ...],
) -> tuple[list[int], list[int], list[Network]]:
    """``[daemon] metrics_allow`` resolved on this machine: (UIDs, GIDs, networks);
    InvalidValue names what is missing."""
    uids: list[int] = []
    gids: list[int] = []
    nets: list[Network] = []
    missing: list[str] = []
    for entry in entries:
        if entry.startswith("@"):
            gid = group_gid(entry[1:])
            gids.append(gid) if gid is not None else missing.append(f"group {entry[1:]!r}")
        elif (uid := user_uid(entry)) is not None:
            uids.append(uid)
        else:
            try:
                nets.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                missing.append(f"user {entry!r}")
    if missing:
        raise errors.InvalidValue(
            f"[daemon] metrics_allow names {', '.join(missing)}, not on this machine; create "
            "it or remove the entry"
        )
    return uids, gids, nets


class DaemonTuner:
    """The `[daemon]` table's tuner: refusals only, planned last."""

    name = "daemon"

    def plan(self, ctx: PlanContext, planned: Sequence[Change] = ()) -> TunerPlan:
        return TunerPlan(refused=daemon_refusals(ctx.profile.daemon))


def daemon_refusals(cfg: DaemonConfig) -> list[Refusal]:
    """Blocking refusals for ``[daemon]`` settings the daemon could not start with here."""
    out = []
    for key in ("control_group", "admin_group"):
        name = getattr(cfg, key)
        if name is not None and group_gid(name) is None:
            why = (
                f"group {name!r} does not exist on this machine, and the daemon would not start "
                f"with it: groupadd {name}, or leave {key} out"
            )
            out.append(Refusal("daemon", key, why, blocking=True))
    try:
        resolve_metrics_allow(cfg.metrics_allow)
    except errors.InvalidValue as exc:
        out.append(Refusal("daemon", "metrics_allow", str(exc), blocking=True))
    return out
