"""One CPU a thread for a whole process tree in an isolated partition (``spread_threads``).

An isolated partition has no load balancing (Documentation/admin-guide/cgroup-v2.rst,
"cpuset.cpus.partition": "isolated"): a thread stays on the CPU it runs on, and a thread or
child created there stays there too (fork and clone copy the affinity: kernel/fork.c). So each
thread is pinned to one CPU, and the pinning is planned for all the processes a rule places in
the partition together, not one process at a time: vLLM's API server, EngineCore and one worker
per GPU each run their hot loop (the one that launches the GPU work) in their main thread, and
per-process planning put every one of those main threads on the same CPU.

The policy, in a stable order of the processes (matched processes first, then their
descendants by start time):

- each process's main thread gets a CPU no other thread holds, while one CPU is left over for
  the other threads; past that, main threads share those CPUs with each other, evenly;
- the other threads go to the CPUs holding no main thread, least loaded first, evenly (no CPU
  more than its share, rounded up);
- a thread already on one CPU that suits it stays there, so a re-plan (drift repair, a new
  process or thread, the daemon's periodic full plan) moves only what must move. A main thread
  suits a CPU no main thread earlier in the order holds, which a child that inherited its
  parent's CPU at fork does not: it gets a CPU of its own.

:func:`spread` is pure: the processes and their threads' CPUs in, a CPU per thread out. The
daemon places a new process against the CPUs the rest of the tree held when it placed them
(:class:`Held`, :func:`held_threads`), without reading every thread of the tree again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gputuned.cpulist import format_cpulist, parse_cpulist
from gputuned.tuners.context import Held

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel.proc import ProcInfo
    from gputuned.profile.tables.process import Config
    from gputuned.tuners.context import Claim, PlanContext


@dataclass(frozen=True)
class Member:
    """A process of the tree: ``threads`` maps each TID to the CPUs it may use now; the main
    thread's TID is ``pid``. ``order``: its place in the stable order (smaller first)."""

    pid: int
    order: tuple[int, ...]
    threads: dict[int, frozenset[int]]


@dataclass(frozen=True)
class Spread:
    """A CPU for every thread of every member, and how many main threads each CPU holds."""

    cpus: frozenset[int]
    cpu: dict[int, int] = field(default_factory=dict)  # TID -> CPU
    mains: Counter[int] = field(default_factory=Counter)

    def moves(self, m: Member) -> bool:
        """Does this plan move any thread of ``m``?"""
        return any(aff != frozenset({self.cpu.get(tid)}) for tid, aff in m.threads.items())

    def describe(self, pid: int, tids: Iterable[int]) -> str:
        """What the plan gives process ``pid`` (its threads ``tids``), for people."""
        parts = []
        main = self.cpu.get(pid)
        if main is not None:
            n = self.mains[main]
            share = f" with {n - 1} other main thread{'s' * (n > 2)}" if n > 1 else ""
            parts.append(f"main thread {'on' if share else 'alone on'} {main}{share}")
        others = {self.cpu[t] for t in tids if t != pid and t in self.cpu}
        if others:
            parts.append(f"other threads over {format_cpulist(others)}")
        over = format_cpulist(self.cpus)
        return "; ".join(parts) + f" (the tree's threads one CPU each over {over})"


def spread(cpus: frozenset[int], members: Iterable[Member]) -> Spread:
    """A CPU of ``cpus`` for every thread of ``members`` (see the module's docstring)."""
    ms = sorted(members, key=lambda m: m.order)
    out = Spread(cpus)
    if not cpus:
        return out
    workers = [(tid, aff) for m in ms for tid, aff in sorted(m.threads.items()) if tid != m.pid]
    _mains(out, ms, bool(workers))
    _others(out, workers)
    return out


def _one(aff: frozenset[int], cpus: frozenset[int]) -> int | None:
    """The CPU a thread is pinned to, when it is pinned to one CPU of ``cpus``."""
    return next(iter(aff)) if len(aff) == 1 and aff <= cpus else None


def _mains(out: Spread, ms: list[Member], workers: bool) -> None:
    """Main threads: a CPU each while ``slots`` CPUs last, then shared evenly among those."""
    order = sorted(out.cpus)
    mains = [m for m in ms if m.pid in m.threads]
    slots = len(order) - 1 if workers and len(order) > 1 else len(order)
    cap = -(-len(mains) // slots)  # ceiling: main threads per CPU
    loads = out.mains
    todo = []
    for m in mains:
        c = _one(m.threads[m.pid], out.cpus)
        # Stays unless an earlier main thread holds its CPU (a child that inherited its
        # parent's CPU at fork) while other CPUs are left, or every slot is taken already.
        if c is not None and loads[c] < cap and (loads[c] > 0 or len(loads) < slots):
            out.cpu[m.pid] = c
            loads[c] += 1
        else:
            todo.append(m)
    # A new main thread's CPU: the one holding the fewest other threads now (they move off it).
    busy = Counter(
        c
        for m in ms
        for tid, aff in m.threads.items()
        if tid != m.pid and (c := _one(aff, out.cpus)) is not None
    )
    for m in todo:
        if len(loads) < slots:
            c = min((c for c in order if c not in loads), key=lambda c: (busy[c], c))
        else:
            c = min(loads, key=lambda c: (loads[c], c))
        out.cpu[m.pid] = c
        loads[c] += 1


def _others(out: Spread, workers: list[tuple[int, frozenset[int]]]) -> None:
    """Every other thread: on a CPU holding no main thread, evenly, least loaded first."""
    pool = [c for c in sorted(out.cpus) if c not in out.mains] or sorted(out.cpus)
    inside = frozenset(pool)
    cap = -(-len(workers) // len(pool))  # ceiling: the even share
    loads: Counter[int] = Counter()
    todo = []
    for tid, aff in workers:  # those that suit their CPU stay, in the stable order
        c = _one(aff, inside)
        if c is not None and loads[c] < cap:
            out.cpu[tid] = c
            loads[c] += 1
        else:
            todo.append(tid)
    for tid in todo:
        c = min(pool, key=lambda c: (loads[c], c))
        out.cpu[tid] = c
        loads[c] += 1


# ---- the trees of a plan ----------------------------------------------------------------


def spreading(ctx: PlanContext, rule: Config) -> frozenset[int] | None:
    """The CPUs ``rule`` spreads its trees' threads over, None when it does not spread them
    (the profile checks that spread_threads comes with an isolated partition)."""
    cs = ctx.profile.cpuset
    if not rule.spread_threads or rule.cpus == "keep" or cs is None or cs.mode != "isolated":
        return None
    cpus = ctx.sets.sets[rule.cpus]
    return cpus if len(cpus) > 1 else None


def tree_spreads(
    ctx: PlanContext,
    placing: dict[int, tuple[Config, Claim, ProcInfo]],
    load: Callable[[int], ProcInfo | None],
) -> dict[int, Spread]:
    """The spread each process of ``placing`` gets, planned over every process placed on the
    same CPUs: those of this plan and those placed earlier (``ctx.claimed``, their threads'
    CPUs from ``ctx.held``: the daemon places one new process at a time). A process placed
    earlier whose threads must move (a new main thread takes the CPU they are on) is read
    again by ``load`` and planned with the rest; it joins the result."""
    rules = {r.name: r for r in ctx.profile.process}
    groups: dict[frozenset[int], list[Member]] = {}
    for pid, (rule, c, proc) in placing.items():
        cpus = spreading(ctx, rule)
        if cpus is not None:
            threads = {t.tid: t.affinity for t in proc.threads}
            groups.setdefault(cpus, []).append(Member(pid, _order(pid, c), threads))
    out: dict[int, Spread] = {}
    for cpus, planned in groups.items():
        earlier = {m.pid: m for m in _placed_earlier(ctx, rules, cpus, placing)}
        while True:  # each round reads at least one process placed earlier: it ends
            got = spread(cpus, [*planned, *earlier.values()])
            moving = [m for m in earlier.values() if got.moves(m)]
            if not moving:
                break
            for m in moving:
                del earlier[m.pid]
                again = load(m.pid)
                if again is not None:
                    threads = {t.tid: t.affinity for t in again.threads}
                    planned.append(Member(m.pid, m.order, threads))
        out.update((m.pid, got) for m in planned)
    return out


def _order(pid: int, c: Claim) -> tuple[int, ...]:
    """Matched (or registered) processes first, then descendants by start time."""
    return (1 if c.parent else 0, c.start, pid)


def _placed_earlier(
    ctx: PlanContext, rules: dict[str, Config], cpus: frozenset[int], planned: Iterable[int]
) -> Iterator[Member]:
    skip = set(planned)
    for pid, c in ctx.claimed.items():
        rule = rules.get(c.rule)
        held = ctx.held.get(pid)
        if pid in skip or c.role == "excluded" or rule is None or held is None:
            continue
        if held.start == c.start and spreading(ctx, rule) == cpus:
            yield Member(pid, _order(pid, c), held.threads)


# ---- what the daemon placed --------------------------------------------------------------


def held_threads(settings: Iterable[Change]) -> dict[int, Held]:
    """By PID, the CPUs the affinity settings among ``settings`` give each thread."""
    out: dict[int, Held] = {}
    for ch in settings:
        d = ch.data
        if ch.kind != "thread" or d.get("attr") != "affinity" or ch.report_only:
            continue
        threads = {int(tid): parse_cpulist(v) for tid, v in d["threads"].items() if v[:1].isdigit()}
        out[int(d["pid"])] = Held(int(d["start"]), threads)
    return out
