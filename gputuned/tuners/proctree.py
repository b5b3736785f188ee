"""Which processes a `[[process]]` rule claims: the ones it matches, and their descendants.

A server is a process tree. vLLM's API server (the process whose command line names vllm)
starts the process that drives the GPU through multiprocessing's *spawn* context
(vllm/v1/engine/core_client.py, vllm/utils/system_utils.py get_mp_context()), which starts one
worker per GPU the same way (vllm/v1/executor/multiproc_executor.py); each renames itself with
setproctitle (``VLLM::EngineCore``, ``VLLM::Worker_TP0``). A spawned child's command line is
``python3 -c from multiprocessing.spawn import spawn_main; ...``: no rule can match it by name,
and the GPU-driving process is such a child. So a rule claims the processes it matches and
everything they start (``children = "follow"``), found by parent PID (proc(5) stat field 4)
when the tree already exists and by fork events as it grows.

The kernel copies nice, scheduling policy, CPU affinity and cgroup at fork (kernel/fork.c
copy_process(), cgroup_post_fork()), and exec keeps them. A child of a placed process therefore
shows the placement without gputuned having written anything; what it had before gputuned is
what its parent had before gputuned. :func:`origins` works that out from the journal, so that
revert gives every such child its real original, and so that a child the rule leaves out
(``exclude``, ``children = "ignore"``) can be given back what it would have had.

This module only reads what the plan context already holds; it never touches the host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gputuned import errors
from gputuned.cpulist import parse_cpulist
from gputuned.kernel.proc import read_process, read_uids
from gputuned.kernel.procfs import cgroup_path
from gputuned.settings.threads import policy_value, thread_value
from gputuned.tuners.cmdmatch import SEARCHES
from gputuned.tuners.context import Claim
from gputuned.tuners.procmatch import (
    ClaimInput,
    another_user,
    cheap_keys_match,
    cmdline_matches,
    excluded,
    has_owner_key,
    matches,
    needs_more,
    owner_may,
)

if TYPE_CHECKING:
    from gputuned.kernel import Kernel
    from gputuned.kernel.proc import ProcInfo, ThreadInfo
    from gputuned.profile.tables.process import Config
    from gputuned.tuners.context import PlanContext

#: Processes of gputuned itself are never placed, whatever a rule says.
OWN_COMMS = ("gputunectl", "gputuned")
#: The attributes a placement passes on at fork, as they are keyed in the journal.
INHERITED = ("nice", "policy", "affinity", "cgroup")


def claim(procs: Iterable[ProcInfo], inp: ClaimInput) -> dict[int, Claim]:
    """Every process a rule claims, parents before their children.

    First the processes a rule's keys match, or registered by hand (the first rule wins);
    then, breadth first, every descendant of a claimed process (listed here or among the
    ``known`` claims) that no rule matches itself: "child", or "excluded" when the rule says
    ``children = "ignore"``, its ``exclude`` matches, or an ancestor was excluded already.
    Each ``cmdline`` search is stopped at its CPU budget (tuners/cmdmatch.py).
    """
    with SEARCHES.budgeted():
        return _claim(procs, inp)


def _claim(procs: Iterable[ProcInfo], inp: ClaimInput) -> dict[int, Claim]:
    listed = {p.pid: p for p in procs if p.comm not in OWN_COMMS and not p.kernel_thread}
    by_name = {r.name: r for r in inp.rules}
    out: dict[int, Claim] = {}
    for pid, seen in list(listed.items()):
        p = seen
        reg = inp.registered.get(pid)
        for rule in inp.rules:
            if reg is not None and reg == (p.start_time, rule.name):
                out[pid] = Claim(rule.name, "match", p.start_time)
                break
            if not cheap_keys_match(rule.match, p, inp.uses):
                continue
            searched = not has_owner_key(rule.match)  # cheap_keys_match searched it
            if not searched:
                # Its owner first (a read or two), then the command line its owner wrote.
                if not owner_may(rule.match, p, inp):
                    continue  # another's: its command line is not searched
                if rule.match.cmdline is not None and not cmdline_matches(rule.match.cmdline, p):
                    continue
                searched = True
            if p.brief and needs_more(rule.match):
                full = inp.load(pid)
                if full is None or full.start_time != p.start_time:
                    break  # exited, or its PID reused, since the scan
                p = listed[pid] = full
            uid = inp.uids.get(rule.match.user or "")
            where = inp.original_cgroup(p)
            if matches(rule.match, p, inp.uses, uid=uid, cgroup=where, searched=searched):
                out[pid] = Claim(rule.name, "match", p.start_time)
                break
    kids: dict[int, list[ProcInfo]] = {}
    for p in listed.values():
        kids.setdefault(p.ppid, []).append(p)
    queue = [pid for pid in out] + [
        pid for pid in kids if pid not in out and pid in inp.known and pid not in listed
    ]
    for parent in queue:  # grows as children are claimed: breadth first over every tree
        up = out.get(parent) or inp.known[parent]
        ruled = by_name.get(up.rule)
        if ruled is None:
            continue
        for child in kids.get(parent, ()):
            mine = out.get(child.pid)
            if mine is not None:
                if mine.role == "match" and mine.parent == 0:
                    out[child.pid] = Claim(mine.rule, "match", mine.start, parent)
                continue  # matched by a rule of its own, or already reached
            other = (
                not ruled.other_users
                and up.role != "excluded"
                and ruled.children != "ignore"
                and another_user(child, parent, inp)
            )
            leave_out = (
                up.role == "excluded"
                or ruled.children == "ignore"
                or other
                or excluded(ruled.exclude, child)
            )
            role = "excluded" if leave_out else "child"
            why = "another user" if other else ""
            out[child.pid] = Claim(ruled.name, role, child.start_time, parent, why)
            queue.append(child.pid)
    for pid, p in listed.items():
        # Claimed earlier and its parent is gone (a reparented orphan): it keeps its claim.
        was = inp.known.get(pid)
        if pid not in out and was is not None and was.start == p.start_time:
            out[pid] = was
    return _parents_first(out)


def _parents_first(claims: dict[int, Claim]) -> dict[int, Claim]:
    """``claims`` ordered by depth in the claimed trees: a child's original is worked out from
    its parent's (see :func:`origins`)."""
    depth: dict[int, int] = {}

    def level(pid: int) -> int:
        chain = []
        while pid in claims and pid not in depth and pid not in chain:
            chain.append(pid)
            pid = claims[pid].parent
        d = depth.get(pid, -1)
        for p in reversed(chain):
            d += 1
            depth[p] = d
        return depth.get(chain[0], d) if chain else d

    return dict(sorted(claims.items(), key=lambda kv: level(kv[0])))


# ---- originals ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tuned:
    """What a rule sets, per inherited attribute, and how to tell a value it set."""

    nice: str | None
    policy: str | None
    cpus: frozenset[int] | None
    cgroup: str | None
    #: Every cgroup the rule may move a process into (by_gpu: each partition), "/"-prefixed.
    cgroups: frozenset[str] = frozenset()

    def shows(self, attr: str, value: str) -> bool:
        """Does ``value`` (as journaled) look like this rule's doing?"""
        if attr == "affinity":
            if self.cpus is None:
                return False
            got = parse_cpulist(value) if value and value[0].isdigit() else frozenset()
            return bool(got) and got <= self.cpus  # spread threads hold one CPU of the set
        if attr == "cgroup" and value in self.cgroups:
            return True
        want = {"nice": self.nice, "policy": self.policy, "cgroup": self.cgroup}[attr]
        return want is not None and value == want


def journal_key(pid: int, start: int, attr: str, tid: int | None = None) -> str:
    """The journal key of a process's setting: its op's key (a thread's: gputuned/settings/
    threads.py; a process's cgroup: the change's key, tuners/procwrite.py)."""
    if attr == "cgroup":
        return f"proc_cgroup:{pid}:{start}"
    return f"thread:{pid}:{start}:{pid if tid is None else tid}:{attr}"


def current(proc: ProcInfo, thread: ThreadInfo | None, attr: str) -> str:
    """A process's (main thread's) value of ``attr`` in the journal's form."""
    if attr == "cgroup":
        return proc.cgroup or "/"
    return "" if thread is None else thread_value(thread, attr)


def origins(
    proc: ProcInfo,
    claim_: Claim,
    tuned: Tuned,
    parent_origin: dict[str, str | None] | None,
    original: Callable[[str], str | None],
) -> dict[str, str | None]:
    """Per attribute, what ``proc`` had before gputuned; None: its value now is its own.

    Journaled: the value kept there. Else, when its parent was changed by gputuned (the
    parent's own origin is known) and ``proc`` shows the rule's value, it got that value at
    fork: its origin is the parent's. ``parent_origin`` is that of the claimed parent (None
    when there is none, or it was never changed).
    """
    main = next((t for t in proc.threads if t.tid == proc.pid), None)
    out: dict[str, str | None] = {}
    for attr in INHERITED:
        kept = original(journal_key(proc.pid, proc.start_time, attr))
        if kept is not None:
            out[attr] = kept
            continue
        up = (parent_origin or {}).get(attr) if claim_.parent else None
        now = current(proc, main, attr)
        out[attr] = up if up is not None and up != now and tuned.shows(attr, now) else None
    return out


# ---- from the plan context -------------------------------------------------------------


def claim_input(ctx: PlanContext, notes: list[str]) -> ClaimInput:
    """What :func:`proctree.claim` needs from the plan context; notes what cannot match here."""
    use = ctx.gpu_use
    uids: dict[str, int | None] = {}
    for rule in ctx.profile.process:
        if rule.match.uses_gpu is not None and ctx.snap.nvml is None:
            notes.append(
                f"process[{rule.name}]: NVML is not available here: match.uses_gpu sees the "
                "GPU device nodes a process has open and its CUDA_VISIBLE_DEVICES / "
                "NVIDIA_VISIBLE_DEVICES only"
            )
        name = rule.match.user
        if name is not None and name not in uids:
            uids[name] = ctx.kernel.user_id(name)
            if uids[name] is None:
                notes.append(
                    f"process[{rule.name}]: this host has no account {name!r} (match.user); "
                    "the rule matches nothing here"
                )
    original = ctx.original
    owner = any(r.match.user is not None or r.match.uid is not None for r in ctx.profile.process)

    return ClaimInput(
        rules=ctx.profile.process,
        uses=(lambda _pid: frozenset()) if use is None else use.of,
        uids=uids,
        registered=ctx.registered,
        known=ctx.claimed,
        original_cgroup=lambda p: original(journal_key(p.pid, p.start_time, "cgroup")),
        **readers(ctx.kernel, owner=owner),
    )


def readers(kernel: Kernel, *, owner: bool) -> dict[str, Callable[[int], Any]]:
    """ClaimInput's readers of a briefly read process, each None once it has gone: the whole
    of it (``owner``: with its user IDs), its user IDs, its cgroup. Asked again of the same
    PID within one claim, the last two answer from memory."""

    def load(pid: int) -> ProcInfo | None:
        try:
            return read_process(kernel, pid, threads=False, owner=owner)
        except (errors.TargetGone, errors.PermissionDenied):
            return None

    @functools.cache
    def ids(pid: int) -> tuple[int | None, int | None] | None:
        try:
            return read_uids(kernel, pid)
        except (errors.TargetGone, errors.PermissionDenied):
            return None

    @functools.cache
    def cgroup_of(pid: int) -> str | None:
        try:
            return cgroup_path(kernel.read_text(f"/proc/{pid}/cgroup")) or ""
        except (errors.TargetGone, errors.PermissionDenied):
            return None

    return {"load": load, "owner": ids, "cgroup_of": cgroup_of}


def claim_processes(ctx: PlanContext) -> dict[int, Claim]:
    """Every process the profile's rules claim in ``ctx`` (no thread is read)."""
    return claim(ctx.processes, claim_input(ctx, []))


def tuned_by(ctx: PlanContext, rule: Config) -> Tuned:
    """What ``rule`` sets on this host, per attribute a child inherits."""
    cs = ctx.profile.cpuset
    moves = (
        rule.move_to_partition
        and cs is not None
        and cs.mode in ("root", "isolated")
        and ctx.cgroup.partitions_possible
        and ctx.cgroup.v2_mount is not None
    )
    tuned = Tuned(
        nice=None if rule.nice is None else str(rule.nice),
        policy=None if rule.policy == "keep" else policy_value(rule.policy, rule.priority or 0),
        cpus=None if rule.cpus == "keep" else ctx.sets.sets.get(rule.cpus),
        cgroup="/" + cs.cgroup if moves and cs is not None else None,
    )
    if not rule.by_gpu or rule.cpus == "keep":
        return tuned
    # Each process to the partition and CPUs of its GPU (tuners/gpuplace.py).
    from gputuned.tuners.gpuplace import partitions, reach

    parts = partitions(ctx, rule)
    return replace(
        tuned,
        cpus=reach(ctx, rule),
        cgroup=None,
        cgroups=frozenset("/" + p.cgroup for p in parts),
    )


def parent_origin(
    ctx: PlanContext, c: Claim, origin_of: dict[int, dict[str, str | None]]
) -> dict[str, str | None] | None:
    """The origins of ``c``'s claimed parent: worked out in this plan, else (a parent the
    daemon placed earlier) what the journal keeps for it."""
    if not c.parent:
        return None
    if c.parent in origin_of:
        return origin_of[c.parent]
    known = ctx.claimed.get(c.parent)
    if known is None:
        return None
    return {a: ctx.original(journal_key(c.parent, known.start, a)) for a in INHERITED}
