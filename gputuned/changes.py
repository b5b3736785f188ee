"""What tuners plan and the engine applies: changes, refusals, notes. Data only, at the bottom
of the package: settings, tuners, the planner and the daemon all speak it.

A :class:`Change` is (tuner, target, current value, wanted value, why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Change:
    """One setting a profile manages: what it is now, what the profile wants, and why.

    ``in_sync`` settings are already right; plan lists only the others, but apply and verify
    need both (a setting that is right is still managed: switching profiles must not revert it).
    Tuners never set it: the planner asks each change's setting (gputuned/settings/registry.py
    ``held``), the question apply asks before a write and answers with its read-back; nor
    ``not_possible``.
    """

    tuner: str
    target: str
    current: str
    wanted: str
    why: str
    path: str = ""  # the host file written, where there is one
    report_only: bool = False  # listed, never applied (the tuner's report_only switch)
    key: str = ""  # identity of the setting across plans and in the journal
    #: How it is read and written: the change kind of one class of gputuned/settings/ (the
    #: module says what ``path``, ``compare`` and ``data`` hold for it).
    kind: str = "sysfs"
    compare: str = "text"  # sysfs: text | cpulist | mask | policy | partition; mount: options
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    in_sync: bool = False
    #: Why apply cannot make it here, known without writing (a read-only mount holds its
    #: file): plan lists it apart, apply does not try it, verify does not call it drift.
    #: Set by the planner, from the setting (registry ``impossible``), as ``in_sync`` is.
    not_possible: str = ""

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", f"{self.kind}:{self.path or self.target}")


@dataclass(frozen=True)
class Refusal:
    """Something the profile asks for that gputuned will not or cannot do here, and why.

    Most refusals leave the rest of the profile to be applied. A ``blocking`` one means that
    applying any of it would do harm here (another cgroup's partition already holds the
    profile's CPUs): ``plan_profile`` then raises PlanError and apply writes nothing.
    """

    tuner: str
    target: str
    reason: str
    blocking: bool = False


@dataclass
class TunerPlan:
    changes: list[Change] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pending_boot: list[str] = field(default_factory=list)


def labelled(tuner: str, target: str) -> str:
    """A change's tuner and target as one says them: ``irq 24 (ACPI:Ged)``, not ``irq irq 24``
    where the target already starts with the tuner's name."""
    return target if target.startswith(f"{tuner} ") else f"{tuner} {target}"
