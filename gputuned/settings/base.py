"""A setting: one kind of value gputuned writes, and everything it knows about that kind.

An :class:`Op` is a single write to the machine: its identity (``key``), the kind of setting
it is (``kind``), where (``path``, ``data``) and what (``value``). A plan's
:class:`~gputuned.changes.Change` becomes one op, or one per thread for a process's threads.

Each kind is one subclass of :class:`Setting` (one module of this package each), holding for
its ops, as TuneD keeps a plugin's get and set together:

- :meth:`Setting.ops`: the ops that make a change true, in the order they must run;
- :meth:`Setting.read`: the value now, in the form :meth:`Setting.write` takes to put it back
  exactly (what the journal keeps);
- :meth:`Setting.write` (and :meth:`Setting.start`, for a write that runs in a thread);
- :meth:`Setting.holds`: does the machine hold a value? With the same normalisation both ways;
- :meth:`Setting.not_possible`: why a failed write is a limit of this machine rather than a
  failure of gputuned (skip it and say so), or None;
- :meth:`Setting.impossible`: the same, known before writing (a read-only mount holds the
  file): plan lists it as not possible here, apply does not try it and verify does not call
  it drift;
- :meth:`Setting.refusal`: why an op read back from the journal is not one gputuned writes
  (its JSON form checked field by field), or None.

:mod:`gputuned.settings.registry` finds the classes; the engine asks it for an op's setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gputuned import errors
from gputuned.kernel.procfs import parse_stat

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel import Kernel
    from gputuned.kernel.mounts import MountTable

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


class Reused(errors.GputunedError):
    """The PID now belongs to another process: never touch it."""


class ReadBackMismatch(errors.HostError):
    """The write returned success but the machine reads back something else."""


class SetBack(ReadBackMismatch):
    """Read back right after the write, the value is the one before it: the process set its
    own back at once (an engine that binds its own CPUs, as it starts a worker)."""


def check_identity(kernel: Kernel, op: Op) -> None:
    """(pid, start time) must still match; a PID can be reused (proc(5) field 22, starttime)."""
    pid, start = op.data["pid"], op.data["start"]
    now = parse_stat(kernel.read_text(f"/proc/{pid}/stat")).start_time
    if now != start:
        raise Reused(f"PID {pid} was reused by another process (start time {now}, not {start})")


def process_ids_refusal(op: Op, *, thread: bool) -> str | None:
    """Why an op of a process does not name one: integer pid (not 0), start time and, for a
    thread's setting, thread id."""
    d = op.data
    ids = [d.get("pid"), d.get("start")] + ([d.get("tid")] if thread else [])
    if not all(type(i) is int and i >= 0 for i in ids) or not d.get("pid"):
        return "a process entry without a pid, start time and thread id"
    return None


def read_only_reason(point: str) -> str:
    """A write the kernel refuses with EROFS: the mount holding it refuses writes."""
    return f"read-only here (EROFS): {point} is mounted read-only (a container?)"


class Setting:
    """One kind of setting. Subclasses set :attr:`kind` and implement read, write and refusal."""

    #: The op kind, as the journal names it.
    kind: ClassVar[str] = ""
    #: The change kind (tuners' :class:`~gputuned.changes.Change`) whose ops are this kind.
    change_kind: ClassVar[str] = ""
    #: A setting of a process gputuned placed: skipped when the process has gone, and what a
    #: child shows after fork was passed on by its parent (tuners/proctree.py origins()).
    placement: ClassVar[bool] = False
    #: A setting of something gputuned borrows rather than owns (a unit's or container's
    #: cgroup made a partition in place, its ancestors, the unit's AllowedCPUs=): it goes
    #: with its owner (a stopped unit's cgroup is removed, and the kernel takes back what it
    #: held), so a target that is gone has nothing to put back; and when a plan no longer
    #: manages it, it is given back before anything else is written (tuners/inplace.py).
    borrowed: ClassVar[bool] = False
    #: Its write runs in a thread and apply goes on beside it (:meth:`start` returns before
    #: the write is done); apply waits for it before it moves a process, and at its end.
    in_background: ClassVar[bool] = False
    #: Another party may undo it between plan and apply (systemd writes "-cpuset" into
    #: subtree_control when it realizes a unit's parents): apply asks again, just before its
    #: writes, whether the host still holds what the plan found in sync.
    undone_by_others: ClassVar[bool] = False
    #: Its ops write the file or make the folder ``op.path`` names: a mount that refuses
    #: writes above it makes them impossible here (:meth:`impossible`).
    writes_path: ClassVar[bool] = False
    #: One sentence for docs and errors: what an op of this kind writes.
    what: ClassVar[str] = ""

    def ops(self, ch: Change) -> list[Op]:
        """The ops that make ``ch`` true, in the order they must run: one by default."""
        return [
            Op(
                ch.key,
                ch.tuner,
                ch.target,
                self.kind,
                ch.path,
                ch.wanted,
                ch.compare,
                dict(ch.data),
            )
        ]

    def read(self, kernel: Kernel, op: Op) -> str:
        """The current value, in the form :meth:`write` takes to put it back exactly."""
        raise NotImplementedError

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        """Put ``value`` in place."""
        raise NotImplementedError

    def start(self, kernel: Kernel, op: Op, value: str) -> Callable[[], None]:
        """:meth:`write`, started: returns the function that finishes it (raising its error).
        Written at once here; a kind whose write runs in a thread overrides it."""
        self.write(kernel, op, value)
        return lambda: None

    def batched(self, op: Op) -> bool:
        """May a run of such ops be journaled with one fsync and then written one by one (each
        its own file, none reading another's)? IRQ affinities say yes."""
        return False

    def holds(
        self, kernel: Kernel, op: Op, value: str, *, just_written: bool = False
    ) -> tuple[bool, str]:
        """Read back: does the machine hold ``value``? Returns (yes, what was read)."""
        now = self.read(kernel, op)
        return now == value, now

    def holds_already(self, kernel: Kernel, op: Op, value: str) -> bool:
        """Before writing ``value`` (apply's, or revert's original): is there nothing to do?
        (:meth:`holds`, unless a kind says otherwise.)"""
        return self.holds(kernel, op, value)[0]

    def restoring(self, kernel: Kernel, op: Op, old: str) -> tuple[Op, str]:
        """The op and value that put journaled ``old`` back (as they are, unless a kind must
        put it back otherwise)."""
        return op, old

    def gone(self, kernel: Kernel, op: Op) -> str | None:
        """Revert: has what held ``op``'s value gone with its owner (a removed cgroup takes
        its files along), so that there is nothing to put back? Then why, else None."""
        return None

    def original(self, kernel: Kernel, op: Op) -> str:
        """What to journal before the first write: the value now (:meth:`read`)."""
        return self.read(kernel, op)

    def not_possible(self, op: Op, exc: errors.GputunedError) -> str | None:
        """Why ``exc`` (a failed write of ``op``) is a limit of this machine, or None."""
        return None

    def impossible(self, op: Op, mounts: MountTable) -> str | None:
        """Why a write of ``op`` cannot succeed here, known without writing, or None: the
        reason :meth:`not_possible` gives for the write's error, said by plan before it."""
        if not self.writes_path:
            return None
        held = mounts.covering(op.path)
        if held is None or not held.refuses_writes:
            return None
        return read_only_reason(held.point)

    def set_back(self, kernel: Kernel, op: Op, old: str) -> bool:
        """After a write that does not read back: does the machine hold ``old`` again, because
        the target set its own value back at once? Only a kind a process sets on itself says
        so; for the rest a wrong read-back is the write's own failure."""
        return False

    def refusal(self, op: Op, value: str) -> str | None:
        """Why revert must not write ``value`` through ``op`` (None: one gputuned writes)."""
        raise NotImplementedError
