"""Whether a `[[process]]` rule's keys match a process (gputuned/tuners/proctree.py claims the
processes, and their descendants, by it): the cheap keys first, then the owner keys (one read
each), and only then the command line that its owner wrote, within its CPU budget
(tuners/cmdmatch.py). It only reads what it is given; it never touches the host."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gputuned.tuners.cmdmatch import SEARCHES

if TYPE_CHECKING:
    from gputuned.kernel.proc import ProcInfo
    from gputuned.profile.tables.process import Config
    from gputuned.profile.tables.processmatch import Exclude, Match
    from gputuned.tuners.context import Claim


def system_unit(cgroup: str) -> str | None:
    """The systemd *system* unit a cgroup v2 path belongs to, or None.

    As systemd's cg_path_get_unit() (src/basic/cgroup-util.c): skip the slices from the top;
    the next component is the unit. Paths under ``user.slice`` are users' sessions and their
    own service managers (``user@UID.service``): a user can name a unit there anything
    (``systemd-run --user --unit=vllm.service``), so they belong to no system unit here.
    """
    for part in (p for p in cgroup.split("/") if p):
        if part == "user.slice":
            return None
        if part.endswith(".slice"):
            continue
        return part if part.endswith((".service", ".scope")) else None
    return None


def cheap_keys_match(rule: Match, proc: ProcInfo, uses: Callable[[int], frozenset[int]]) -> bool:
    """The keys a brief read of /proc answers (stat and cmdline): most processes of a host
    fail these, and are never read further."""
    if proc.kernel_thread or (proc.exe is None and not proc.cmdline and not proc.brief):
        return False
    return (
        (rule.comm is None or proc.comm == rule.comm)
        # A rule with owner keys searches its pattern only in what passes them (_claim()).
        and (rule.cmdline is None or has_owner_key(rule) or cmdline_matches(rule.cmdline, proc))
        and (rule.uses_gpu is None or rule.uses_gpu in uses(proc.pid))
    )


def has_owner_key(rule: Match) -> bool:
    """The rule names who owns the process (user, uid, unit, cgroup)."""
    return any(v is not None for v in (rule.user, rule.uid, rule.unit, rule.cgroup))


def owner_may(rule: Match, proc: ProcInfo, inp: ClaimInput) -> bool:
    """Do ``rule``'s owner keys (user, uid, unit, cgroup) hold for ``proc``? From its user IDs
    and its cgroup, one read each where the scan read neither (a brief read), before its
    command line is searched or the rest of it is read."""
    if proc.brief:
        by_uid = rule.user is not None or rule.uid is not None
        ids = inp.owner(proc.pid) if by_uid else (None, None)
        where = inp.cgroup_of(proc.pid) if rule.unit or rule.cgroup else ""
        if ids is None or where is None:
            return False  # it has gone
        proc = replace(proc, uid=ids[0], euid=ids[1], cgroup=where)
    original = inp.original_cgroup(proc)
    cgroup = proc.cgroup if original is None else original
    return owner_holds(rule, proc, inp.uids.get(rule.user or ""), cgroup)


def another_user(child: ProcInfo, parent: int, inp: ClaimInput) -> bool:
    """Does ``child`` run as another user than its parent (real or effective user ID)? One
    that cannot be read (gone) is not taken for the parent's."""
    mine = (child.uid, child.euid) if child.uid is not None else inp.owner(child.pid)
    theirs = inp.owner(parent)
    return mine is None or theirs is None or mine != theirs


def needs_more(rule: Match) -> bool:
    return rule.exe is not None or has_owner_key(rule)


def matches(
    rule: Match,
    proc: ProcInfo,
    uses: Callable[[int], frozenset[int]],
    *,
    uid: int | None = None,
    cgroup: str | None = None,
    searched: bool = False,
) -> bool:
    """All keys the rule gives must match; kernel threads (no exe, no cmdline) never do.

    ``uid``: what ``match.user`` names on this host (None: no such account, nothing matches).
    ``cgroup``: the process's cgroup before gputuned moved it (journaled), else its own: a
    process matched by unit stays matched once it is in the partition. ``searched``: the
    caller has found the rule's ``cmdline`` in the process's command line already.
    """
    if proc.kernel_thread or (proc.exe is None and not proc.cmdline):
        return False
    where = proc.cgroup if cgroup is None else cgroup
    # Each only when those before it hold: the command line, which its owner writes, is
    # searched only in processes whose owner keys hold (issue 30).
    return (
        (rule.exe is None or proc.exe == rule.exe)
        and (rule.comm is None or proc.comm == rule.comm)
        and owner_holds(rule, proc, uid, where)
        and (rule.cmdline is None or searched or cmdline_matches(rule.cmdline, proc))
        and (rule.uses_gpu is None or rule.uses_gpu in uses(proc.pid))
    )


def owner_holds(rule: Match, proc: ProcInfo, uid: int | None, where: str) -> bool:
    """The rule's owner keys: ``user`` (``uid``: its UID here) or ``uid``, ``unit`` and
    ``cgroup`` (``where``: the process's cgroup, as matches() takes it)."""
    want_uid = rule.uid if rule.user is None else uid
    return (
        ((rule.user is None and rule.uid is None)
         or (want_uid is not None and proc.uid == want_uid and proc.euid == want_uid))
        and (rule.unit is None or system_unit(where) == rule.unit)
        and (
            rule.cgroup is None
            or where == rule.cgroup
            or where.startswith(rule.cgroup.rstrip("/") + "/")
        )
    )  # fmt: skip


def cmdline_matches(pattern: str, proc: ProcInfo) -> bool:
    """``match.cmdline``, searched within its CPU budget; no match when it cannot finish."""
    what = f"match.cmdline {pattern[:80]!r}"
    return SEARCHES.search(
        pattern, proc.cmdline, what=what, pid=proc.pid, start=proc.start_time, safe=False
    )


def excluded(ex: Exclude, proc: ProcInfo) -> bool:
    """``exclude`` leaves ``proc`` out; so does an ``exclude.cmdline`` that cannot finish
    within its CPU budget (the descendant gets back what its ancestor had: nothing gained)."""
    if proc.comm in ex.comm:
        return True
    if ex.cmdline is None:
        return False
    what = f"exclude.cmdline {ex.cmdline[:80]!r}"
    return SEARCHES.search(
        ex.cmdline, proc.cmdline, what=what, pid=proc.pid, start=proc.start_time, safe=True
    )


@dataclass(frozen=True)
class ClaimInput:
    """What claiming needs besides the processes: see :func:`claim`."""

    rules: tuple[Config, ...]
    #: PID -> the GPUs (indexes) it uses (tuners/gpuuse.py), asked only of processes whose
    #: other cheap keys match.
    uses: Callable[[int], frozenset[int]]
    uids: dict[str, int | None]  # match.user -> UID on this host
    registered: dict[int, tuple[int, str]]  # pid -> (start time, rule)
    known: dict[int, Claim]  # claims made earlier (the daemon's), for parents not listed
    original_cgroup: Callable[[ProcInfo], str | None]
    #: The whole of a briefly read process (exe, cgroup, user IDs); None once it is gone.
    load: Callable[[int], ProcInfo | None]
    #: A process's real and effective user IDs, and its cgroup (one read each); None once it
    #: is gone. (All three: :func:`readers`.)
    owner: Callable[[int], tuple[int | None, int | None] | None]
    cgroup_of: Callable[[int], str | None]
