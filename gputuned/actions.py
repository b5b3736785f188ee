"""One write at a time: expand settings into operations, read old values, write, read back.

An :class:`Op` is a single write to the host. A setting (:class:`~gputuned.changes.Change`)
expands into one op, or one per thread for process settings. For each op this module knows how
to read the value to journal (``read_old``), how to write a value (``write``), and how to tell
whether the host now holds it (``holds``), with the same normalisation for both directions.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gputuned import errors
from gputuned.changes import Change
from gputuned.cpulist import parse_cpulist, parse_mask
from gputuned.host import irqbalance, mounts, state
from gputuned.host.proc import read_thread
from gputuned.host.system import cgroup_cpus
from gputuned.kernel import Kernel
from gputuned.kernel.procfs import cgroup_path, parse_stat
from gputuned.tuners.process import DEFAULT_AFFINITY

ABSENT = "\0absent"  # journal value of something that did not exist (a cgroup, a file)


@dataclass(frozen=True)
class Op:
    """A single write: identity ``key``, how (``kind``), where (``path``/``data``), what (``value``)."""

    key: str
    tuner: str
    target: str
    kind: str
    path: str
    value: str
    compare: str = "text"
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Op:
        return Op(**d)


def expand(ch: Change) -> list[Op]:
    """The ops that make ``ch`` true, in the order they must run."""
    if ch.kind == "thread":
        d = ch.data
        return [
            Op(
                f"thread:{d['pid']}:{d['start']}:{tid}:{d['attr']}",
                ch.tuner,
                f"{ch.target} (thread {tid})",
                d["attr"],
                "",
                str(value),
                data={
                    "pid": d["pid"],
                    "start": d["start"],
                    "tid": int(tid),
                    "ppid": d.get("ppid", 0),
                    # The value plan read, before this apply moved the process anywhere: a
                    # move into a partition changes the affinity by itself (cpuset_attach).
                    "planned_old": d.get("old", {}).get(tid),
                    # What the thread had before gputuned, where it shows what a placement
                    # passed on at fork (tuners/proctree.py origins()): journaled instead of
                    # the value read.
                    "origin": d.get("origin", {}).get(tid),
                    "cgmount": d.get("cgmount"),
                },
            )
            for tid, value in sorted(d["threads"].items(), key=lambda kv: int(kv[0]))
        ]
    if ch.kind in ("proc_cgroup", "irqbalance"):
        return [Op(ch.key, ch.tuner, ch.target, ch.kind, "", ch.wanted, data=dict(ch.data))]
    if ch.kind == "pcie":
        return [
            Op(
                ch.key,
                ch.tuner,
                ch.target,
                ch.kind,
                ch.path,
                str(ch.data["value"]),
                data=dict(ch.data),
            )
        ]
    if ch.kind == "controller":  # wanted reads "+cpuset" for people; the op's value is a state
        return [Op(ch.key, ch.tuner, ch.target, ch.kind, ch.path, "present", data=dict(ch.data))]
    if ch.kind in ("cgroup", "file"):
        return [Op(ch.key, ch.tuner, ch.target, ch.kind, ch.path, ch.wanted, data=dict(ch.data))]
    if ch.kind == "mount":
        return [
            Op(ch.key, ch.tuner, ch.target, ch.kind, ch.path, ch.wanted, "options", dict(ch.data))
        ]
    return [Op(ch.key, ch.tuner, ch.target, "sysfs", ch.path, ch.wanted, ch.compare)]


# -- process identity ---------------------------------------------------------------------------


class Reused(errors.GputunedError):
    """The PID now belongs to another process: never touch it."""


def check_identity(kernel: Kernel, op: Op) -> None:
    """(pid, start time) must still match; a PID can be reused (proc(5) field 22, starttime)."""
    pid, start = op.data["pid"], op.data["start"]
    now = parse_stat(kernel.read_text(f"/proc/{pid}/stat")).start_time
    if now != start:
        raise Reused(f"PID {pid} was reused by another process (start time {now}, not {start})")


def _thread(kernel: Kernel, op: Op) -> tuple[int, int]:
    return int(op.data["pid"]), int(op.data["tid"])


# -- reading ------------------------------------------------------------------------------------


def read_old(kernel: Kernel, op: Op) -> str:
    """The current value, in the form that ``write`` takes to put it back exactly."""
    k = op.kind
    if k == "sysfs":
        raw = kernel.read_text(op.path)
        return writable_form(op.compare, raw)
    if k == "pcie":
        return str(_read_field(kernel, op))
    if k == "cgroup":
        return "present" if kernel.is_dir(op.path) else ABSENT
    if k == "controller":
        have = (kernel.read_optional(op.path) or "").split()
        return "present" if op.data["controller"] in have else ABSENT
    if k == "file":
        return kernel.read_text(op.path) if kernel.exists(op.path) else ABSENT
    if k == "mount":
        return mounts.find(kernel, op.path, op.data["fstype"]).super_options
    if k in ("nice", "affinity", "policy"):
        check_identity(kernel, op)
        pid, tid = _thread(kernel, op)
        t = read_thread(kernel, f"/proc/{pid}/task/{tid}", tid)
        if k == "nice":
            return str(t.nice)
        if k == "policy":
            return f"{t.policy}:{t.rt_priority}" if t.policy in ("fifo", "rr") else t.policy
        return _fmt(t.affinity)
    if k == "irqbalance":
        check_identity(kernel, op)
        cpus, irqs = irqbalance.read_settings(kernel, int(op.data["pid"]))
        return _fmt(cpus) if op.data["attr"] == "cpus" else " ".join(map(str, irqs))
    if k == "proc_cgroup":
        check_identity(kernel, op)
        return cgroup_path(kernel.read_text(f"/proc/{op.data['pid']}/cgroup")) or "/"
    raise ValueError(f"unknown op kind {k!r}")


def writable_form(compare: str, raw: str) -> str:
    """What to write to a sysfs file so that it reads ``raw`` again."""
    text = raw.strip()
    if compare == "policy":
        m = re.search(r"\[(\w+)\]", text)
        return m.group(1) if m else text
    if compare == "partition":
        return text.split()[0] if text else "member"
    return text


def _fmt(cpus: frozenset[int]) -> str:
    from gputuned.cpulist import format_cpulist

    return format_cpulist(cpus)


def _read_field(kernel: Kernel, op: Op) -> int:
    reg = int(struct.unpack("<H", kernel.read_bytes(op.path, op.data["offset"], 2))[0])
    return int((reg & op.data["mask"]) >> op.data["shift"])


# -- writing ------------------------------------------------------------------------------------


def write(kernel: Kernel, op: Op, value: str) -> None:
    """Put ``value`` in place. Process ops check identity first."""
    k = op.kind
    if k == "sysfs":
        kernel.write_text(op.path, value if value else "\n")
    elif k == "pcie":
        off, mask, shift = op.data["offset"], op.data["mask"], op.data["shift"]
        reg = int(struct.unpack("<H", kernel.read_bytes(op.path, off, 2))[0])
        new = (reg & ~mask) | ((int(value) << shift) & mask)
        if new != reg:
            kernel.write_bytes(op.path, struct.pack("<H", new), offset=off)
    elif k == "cgroup":
        if value == ABSENT:
            if kernel.is_dir(op.path):
                kernel.rmdir(op.path)
        elif not kernel.is_dir(op.path):
            kernel.mkdir(op.path)
    elif k == "controller":
        sign = "-" if value == ABSENT else "+"
        kernel.write_text(op.path, f"{sign}{op.data['controller']}")
    elif k == "file":
        if value == ABSENT:
            state.remove(kernel, op.path)
        else:
            state.replace_durable(kernel, op.path, value.encode(), mode=0o644)
    elif k == "mount":
        kernel.remount(op.path, op.data["fstype"], value)
    elif k in ("nice", "affinity", "policy"):
        check_identity(kernel, op)
        _, tid = _thread(kernel, op)
        if k == "nice":
            kernel.set_nice(tid, int(value))
        elif k == "affinity":
            # DEFAULT_AFFINITY: allow every CPU; the kernel narrows it to what the cgroup allows
            # and widens it again when the cgroup gets CPUs back (the user mask is kept).
            cpus = _online(kernel) if value == DEFAULT_AFFINITY else parse_cpulist(value)
            kernel.set_affinity(tid, cpus)
        else:
            pol, _, prio = value.partition(":")
            kernel.set_scheduler(tid, pol, int(prio or 0))
    elif k == "irqbalance":
        check_identity(kernel, op)
        pid = int(op.data["pid"])
        if op.data["attr"] == "cpus":
            irqbalance.ban_cpus(kernel, pid, parse_cpulist(value))
        else:
            irqbalance.ban_irqs(kernel, pid, tuple(int(n) for n in value.split()))
    elif k == "proc_cgroup":
        check_identity(kernel, op)
        kernel.move_to_cgroup(int(op.data["pid"]), f"{op.data['mount']}{value}".rstrip("/") or "/")
    else:
        raise ValueError(f"unknown op kind {k!r}")


def start_write(kernel: Kernel, op: Op, value: str) -> Callable[[], None]:
    """:func:`write`, started: returns the function that finishes it (raising its error).

    A remount runs in a thread (see :meth:`Kernel.start_remount`); every other kind is written
    at once and the function returned does nothing.
    """
    if op.kind == "mount":
        return kernel.start_remount(op.path, op.data["fstype"], value)
    write(kernel, op, value)
    return lambda: None


def holds(kernel: Kernel, op: Op, value: str, *, just_written: bool = False) -> tuple[bool, str]:
    """Read back: does the host hold ``value``? Returns (yes, what was read)."""
    if op.kind == "sysfs":
        raw = kernel.read_text(op.path).strip()
        if op.compare == "partition" and "invalid" in raw:
            return False, raw  # e.g. "isolated invalid (Cpu list in cpuset.cpus not exclusive)"
        return same(op.compare, writable_form(op.compare, raw), value), raw
    if op.kind == "affinity" and value == DEFAULT_AFFINITY:
        # The thread restricts nothing its cgroup allows. The kernel shows the intersection
        # of the thread's own mask with its cpuset (sched_getaffinity()), so a thread that
        # allows every CPU reads back exactly what the cgroup allows; a tree keeps the mask
        # as written, a superset.
        now = read_old(kernel, op)
        return parse_cpulist(now) >= _cgroup_allows(kernel, op), now
    if op.kind == "mount":
        now = read_old(kernel, op)
        return same(op.compare, now, value), now
    if op.kind == "irqbalance" and just_written:
        # irqbalance takes new settings at its next rescan (its sleep interval, 10 s by
        # default), so an immediate "setup" still shows the old ones; verify checks later.
        return True, value
    now = read_old(kernel, op)
    return now == value, now


def _online(kernel: Kernel) -> frozenset[int]:
    return parse_cpulist(kernel.read_value("/sys/devices/system/cpu/online"))


def _cgroup_allows(kernel: Kernel, op: Op) -> frozenset[int]:
    """CPUs the thread's current cgroup allows (cgroup v2 cpuset), else all online CPUs."""
    mount = op.data.get("cgmount")
    if mount:
        cgroup = cgroup_path(kernel.read_text(f"/proc/{op.data['pid']}/cgroup"))
        cpus = cgroup_cpus(kernel, str(mount), cgroup) if cgroup is not None else None
        if cpus is not None:
            return cpus
    return _online(kernel)


def same(compare: str, have: str, want: str) -> bool:
    if compare in ("cpulist", "cpulist_subset"):
        h, w = parse_cpulist(have), parse_cpulist(want)
        return h <= w if compare == "cpulist_subset" else h == w
    if compare == "mask":
        return parse_mask(have) == parse_mask(want)
    if compare == "options":  # mount options: the kernel prints them in an order of its own
        return set(have.split(",")) == set(want.split(","))
    return have == want
