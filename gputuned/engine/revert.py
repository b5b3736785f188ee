"""revert: put back every journaled value, and what gputuned's placements passed on at fork.

In this order, each step trying everything even after an error:

1. Process settings, newest first (two passes: see :func:`restore_entries`).
2. Processes gputuned never journaled that got a placement from one it did: a server's
   children started after a one-shot ``gputunectl apply`` (no daemon watched them start), or
   between the daemon's last event and its stop. The kernel copies nice, policy, affinity and
   cgroup at fork (kernel/fork.c). Found by parent PID below every placed process still
   running; each gets back its placed ancestor's originals wherever it shows what the
   ancestor was given.
3. Anything still inside a cgroup gputuned made (a process whose ancestry was lost, one moved
   there by hand): moved to where its placed ancestor came from, else to the cgroup's parent.
   While a process is inside, the partition's ``cpuset.cpus`` cannot be emptied (ENOSPC,
   kernel/cgroup/cpuset.c validate_change()) and the cgroup cannot be removed (EBUSY).
4. Every other setting, newest first.

A process whose original cgroup no longer exists goes to the nearest existing ancestor, and
the report's notes say so. Whatever could not be put back is in ``failed``, names what is
left, and stays in the journal for the next try.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gputuned import errors
from gputuned.engine.applied import read_active
from gputuned.engine.applyreport import RevertReport
from gputuned.engine.journal import Entry, Journal
from gputuned.kernel import Kernel
from gputuned.kernel.proc import ancestor_in, iter_processes, read_identity, read_process
from gputuned.kernel.system import nearest_cgroup, read_cgroup_layout
from gputuned.settings.base import ABSENT, Op, Reused
from gputuned.settings.registry import placement_kinds, setting
from gputuned.settings.threads import thread_value
from gputuned.store.state import ACTIVE, STATE, HostLock, remove

log = logging.getLogger(__name__)


def revert_all(
    kernel: Kernel,
    *,
    forget_profile: bool = True,
    lock: bool = True,
    journal: Journal | None = None,
    boot_config: bool = False,
) -> RevertReport:
    """Restore every journaled value and what placements passed on (see the module).

    ``boot_config``: also put back the GRUB drop-in of ``bootargs --write-grub``
    (engine/grub.py), for a revert a user asked for; a daemon that stops leaves it, as it is
    meant for the next boot."""
    t0 = time.monotonic()
    report = RevertReport()
    with HostLock(kernel) if lock else contextlib.nullcontext():
        journal = journal if journal is not None else Journal(kernel)
        restore(kernel, journal, list(journal.newest_first()), report)
        if boot_config:
            from gputuned.engine.grub import revert_dropin

            revert_dropin(kernel, report)
        report.failed += journal.rejected_report()  # refused on load: never written
        journal.compact()
        if not report.failed:
            remove(kernel, STATE)
            if forget_profile:
                try:
                    active = read_active(kernel)
                    report.deactivated = None if active is None else str(active["profile"]["name"])
                except (ValueError, KeyError, TypeError):  # damaged: it goes all the same
                    report.deactivated = "(unreadable active.json)"
                remove(kernel, ACTIVE)
    report.seconds = time.monotonic() - t0
    return report


def restore(kernel: Kernel, journal: Journal, entries: list[Entry], report: RevertReport) -> None:
    """Steps 1-4 of the module docstring for ``entries`` (newest first).

    Steps 2 and 3 run once, in the first pass, just before the first entry that changes a
    cgroup gputuned made (gputuned places processes after it made their cgroup, so their
    settings come first, newest first), or at the pass's end.
    """
    placed = _placements([e for e in entries if e.op.kind in placement_kinds()])
    made = [e.op.path for e in entries if e.op.kind == "cgroup" and e.old == ABSENT]

    def inherited() -> None:
        if not (placed or made):
            return
        mount = read_cgroup_layout(kernel).v2_mount
        if placed:
            _sweep(kernel, placed, mount, report)
        if made and mount is not None:
            _evacuate(kernel, made, placed, mount, report)

    restore_entries(kernel, journal, entries, report, before=(made, inherited))


def restore_processes(
    kernel: Kernel, pids: set[int], journal: Journal | None = None
) -> RevertReport:
    """Put processes' journaled values back, and their unjournaled descendants' (unregister)."""
    report = RevertReport()
    journal = journal if journal is not None else Journal(kernel)
    mine = [
        e
        for e in journal.newest_first()
        if e.op.kind in placement_kinds() and e.op.data.get("pid") in pids
    ]
    restore(kernel, journal, mine, report)
    return report


def forget_process(kernel: Kernel, pid: int, journal: Journal | None = None) -> int:
    """Drop the journal entries of a process that exited (nothing to restore). Returns count."""
    journal = journal if journal is not None else Journal(kernel)
    gone = [
        e.op.key
        for e in journal.entries()
        if e.op.kind in placement_kinds() and e.op.data.get("pid") == pid
    ]
    for key in gone:
        journal.drop(key)
    return len(gone)


# ---- journaled settings -----------------------------------------------------------------------


def restore_entries(
    kernel: Kernel,
    journal: Journal,
    entries: list[Entry],
    report: Any,
    *,
    before: tuple[list[str], Callable[[], None]] | None = None,
) -> None:
    """Restore newest first, every entry even after errors; then one more pass for the rest.

    The second pass catches values that depend on an older entry restored later in the first
    pass: a thread's affinity reads back narrowed while its process is still in the partition
    (the kernel intersects it with the cpuset) and holds once the process is back outside.
    ``report``: anything with ``restored`` and ``failed`` lists (and ``notes``, if kept).
    ``before`` = (cgroup directories, hook): the hook runs once in the first pass, before the
    first entry on or below one of those directories (or at the pass's end).
    """
    errs: dict[str, str] = {}
    notes: list[str] = getattr(report, "notes", [])
    dirs, hook = before if before is not None else ([], None)
    for attempt in (1, 2):
        left = []
        for entry in entries:
            path = entry.op.path
            if hook is not None and any(path == d or path.startswith(d + "/") for d in dirs):
                run, hook = hook, None
                run()
            err = _restore(kernel, entry.op, entry.old, notes)
            if err is None:
                journal.drop(entry.op.key)
                report.restored.append({"target": entry.op.target, "value": entry.old})
            else:
                errs[entry.op.key] = err
                left.append(entry)
        if hook is not None:
            run, hook = hook, None
            run()
        entries = left
        if not entries:
            break
        log.info("revert: pass %d left %d value(s) to retry", attempt, len(entries))
    report.failed += [{"target": e.op.target, "error": errs[e.op.key]} for e in entries]


def _restore(kernel: Kernel, op: Op, old: str, notes: list[str]) -> str | None:
    """Put ``old`` back; None on success (or when the process is gone), else the error."""
    kind = setting(op.kind)
    journaled = old
    try:
        gone = kind.gone(kernel, op)
        if gone is not None:
            notes.append(f"{op.target}: not restored: {gone}")
            return None
        check, old = kind.restoring(kernel, op, old)
        if kind.holds_already(kernel, check, old):
            return None  # already the original (the write never happened, or was undone)
        kind.write(kernel, check, old)
        ok, seen = kind.holds(kernel, check, old, just_written=True)
    except (errors.TargetGone, Reused) as exc:
        if kind.placement or kind.borrowed:  # gone with its process, or its unit's cgroup
            log.info("%s: %s: not restored: %s", op.tuner, op.target, exc)
            return None
        return str(exc)
    except errors.Busy as exc:
        if op.kind == "cgroup":
            return f"{exc}; still inside: {_inside(kernel, op.path) or 'child cgroups'}"
        return str(exc)
    except errors.GputunedError as exc:
        return str(exc)
    if ok and old != journaled:
        notes.append(
            f"{op.target}: its cgroup {journaled} no longer exists; moved to {old}, the nearest "
            "existing ancestor"
        )
    return None if ok else f"wrote {old!r}, reads back {seen!r}"


# ---- what placements passed on ----------------------------------------------------------------


@dataclass
class _Placed:
    """A journaled process: per attribute, the values gputuned gave its threads and its main
    thread's original (what a child that inherited from it had before gputuned)."""

    pid: int
    start: int
    given: dict[str, set[str]] = field(default_factory=dict)
    original: dict[str, str] = field(default_factory=dict)
    mount: str | None = None


def _placements(entries: list[Entry]) -> dict[int, _Placed]:
    out: dict[int, _Placed] = {}
    for e in entries:
        d = e.op.data
        try:
            pid, start = int(d["pid"]), int(d["start"])
        except (KeyError, TypeError, ValueError):
            continue
        pl = out.setdefault(pid, _Placed(pid, start))
        attr = "cgroup" if e.op.kind == "proc_cgroup" else e.op.kind
        pl.given.setdefault(attr, set()).add(e.op.value)
        if attr == "cgroup":
            pl.mount = str(d.get("mount") or "") or None
        if attr == "cgroup" or d.get("tid") == pid or attr not in pl.original:
            pl.original[attr] = e.old
    return out


def _sweep(
    kernel: Kernel, placed: dict[int, _Placed], mount: str | None, report: RevertReport
) -> None:
    """Step 2: unjournaled descendants of placed processes get their ancestor's originals."""
    try:
        procs = {p.pid: p for p in iter_processes(kernel, brief=True)}
    except errors.GputunedError as exc:
        report.failed.append({"target": "processes started by placed ones", "error": str(exc)})
        return
    kids: dict[int, list[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    # A kernel thread passes nothing on ([workqueues] kthreads moves them): kthreadd's children
    # reset their CPUs as they start (kernel/kthread.c kthread()), some may not be set at all
    # (PF_NO_SETAFFINITY), and the user-mode helpers it parents are forked by a kworker.
    queue = [
        (pid, pl)
        for pid, pl in placed.items()
        if pid in procs and procs[pid].start_time == pl.start and not procs[pid].kernel_thread
    ]
    seen = {pid for pid, _ in queue}
    while queue:
        parent, source = queue.pop(0)
        for pid in kids.get(parent, ()):
            if pid in seen:
                continue
            seen.add(pid)
            own = placed.get(pid)
            if own is not None and own.start == procs[pid].start_time:
                queue.append((pid, own))  # journaled itself: restored in step 1
                continue
            _give_back(kernel, pid, procs[pid].start_time, source, mount, None, report)
            queue.append((pid, source))


def _evacuate(
    kernel: Kernel, made: list[str], placed: dict[int, _Placed], mount: str, report: RevertReport
) -> None:
    """Step 3: nothing may stay in the cgroups gputuned made when they are taken apart."""
    for path in made:
        if not kernel.is_dir(path) or not path.startswith(mount + "/"):
            continue
        rel = "/" + path[len(mount) :].strip("/")
        parent = rel.rsplit("/", 1)[0] or "/"
        for pid in _procs_below(kernel, path):
            try:
                start, _ppid, comm, _k = read_identity(kernel, pid)
            except errors.TargetGone:
                continue
            own = placed.get(pid)
            source = own if own is not None and own.start == start else None
            source = source or _placed_ancestor(kernel, pid, placed)
            fallback = nearest_cgroup(kernel, mount, parent)
            _give_back(kernel, pid, start, source, mount, (fallback, rel), report)
            if source is None:
                report.notes.append(
                    f"pid {pid} ({comm}) was still in {rel}, not placed by gputuned and started "
                    f"by no process it placed: moved to {fallback}, the parent of that cgroup"
                )


def _give_back(
    kernel: Kernel,
    pid: int,
    start: int,
    source: _Placed | None,
    mount: str | None,
    evacuate: tuple[str, str] | None,
    report: RevertReport,
) -> None:
    """Give process ``pid`` back what ``source`` had before gputuned, where it shows what
    ``source`` was given. ``evacuate`` = (fallback cgroup, gputuned's cgroup): it must leave
    that cgroup whatever it shows. ``mount``: the cgroup v2 mount."""
    try:
        proc = read_process(kernel, pid)
    except errors.GputunedError:
        return  # exited, or not ours to read
    if proc.start_time != start:
        return
    label = f"pid {pid} ({proc.comm}"
    label += f", started by placed pid {source.pid})" if source is not None else ")"
    ops: list[Op] = []
    dest = None
    cg = source.original.get("cgroup") if source is not None else None
    if source is not None and cg is not None and proc.cgroup in source.given["cgroup"]:
        dest = nearest_cgroup(kernel, source.mount or mount or "", cg)
    if evacuate is not None and (dest is None or dest == evacuate[1]):
        dest = evacuate[0]
    if dest is not None and dest != proc.cgroup and mount is not None:
        ops.append(_op(f"{label} cgroup", "proc_cgroup", pid, start, dest, mount=mount))
    for attr in ("nice", "policy", "affinity"):
        if source is None or attr not in source.original:
            continue
        for t in proc.threads:
            now = thread_value(t, attr)
            if _shows(attr, now, source.given[attr]) and now != source.original[attr]:
                target = f"{label} thread {t.tid} {attr}"
                ops.append(
                    _op(target, attr, pid, start, source.original[attr], tid=t.tid, mount=mount)
                )
    for op in ops:
        err = _restore(kernel, op, op.value, report.notes)
        if err is None:
            report.restored.append({"target": op.target, "value": op.value})
        else:
            report.failed.append({"target": op.target, "error": err})


def _op(
    target: str,
    kind: str,
    pid: int,
    start: int,
    value: str,
    *,
    tid: int | None = None,
    mount: str | None = None,
) -> Op:
    data: dict[str, Any] = {"pid": pid, "start": start, "mount": mount or "", "cgmount": mount}
    if tid is not None:
        data["tid"] = tid
    return Op(f"{kind}:{pid}:{start}:{tid}", "process", target, kind, "", value, data=data)


def _shows(attr: str, now: str, given: set[str]) -> bool:
    """Does ``now`` look like one of the values gputuned gave (a CPU list: within their union;
    a thread of a spread process holds one of its CPUs)?"""
    if attr != "affinity":
        return now in given
    from gputuned.cpulist import parse_cpulist

    union: set[int] = set()
    for g in given:
        if g and g[0].isdigit():
            union |= parse_cpulist(g)
    got = parse_cpulist(now) if now else frozenset()
    return bool(got) and got <= union


def _placed_ancestor(kernel: Kernel, pid: int, placed: dict[int, _Placed]) -> _Placed | None:
    """The nearest ancestor of ``pid`` that gputuned journaled (by parent PID and start time)."""
    found = ancestor_in(kernel, pid, {p: pl.start for p, pl in placed.items()})
    return None if found is None else placed[found]


def _procs_below(kernel: Kernel, path: str) -> list[int]:
    """PIDs in cgroup ``path`` and every cgroup below it."""
    out: list[int] = []
    todo = [path]
    while todo:
        cg = todo.pop()
        text = kernel.read_optional(f"{cg}/cgroup.procs") or ""
        out += [int(p) for p in text.split() if p.isdigit()]
        with contextlib.suppress(errors.GputunedError):
            todo += [f"{cg}/{n}" for n in kernel.listdir(cg) if kernel.is_dir(f"{cg}/{n}")]
    return out


def _inside(kernel: Kernel, path: str) -> str:
    """What keeps cgroup ``path`` busy, for the error message: its processes by PID and name."""
    names = []
    for pid in _procs_below(kernel, path)[:8]:
        try:
            names.append(f"pid {pid} ({read_identity(kernel, pid)[2]})")
        except errors.GputunedError:
            names.append(f"pid {pid}")
    return ", ".join(names)
