"""Partition conflicts: the CPUs a profile's cpuset partitions may not take, as the cpuset
tuner's refusals.

Two kinds, both found in plan so that apply writes nothing:

- two of the profile's own partitions on the same CPU (``partitions = "gpu"`` with a set
  that gives some GPUs the same cores): the kernel lets no two partitions share a CPU;
- a valid partition of another cgroup holding any of the set's CPUs: taking them would turn
  it ``root invalid`` for good (finding F1, docs/dev/reliability.md). gputuned's own cgroups,
  their ancestors and their descendants do not count. Blocking unless ``report_only``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputuned.changes import Refusal
from gputuned.cpulist import format_cpulist
from gputuned.kernel import Kernel
from gputuned.kernel.system import Partition, valid_partitions
from gputuned.profile.cpusets import PartitionSpec

if TYPE_CHECKING:
    from gputuned.profile.tables.cpuset import Config


def shared_refusal(
    tuner: str, cfg: Config, pairs: list[tuple[PartitionSpec, PartitionSpec]]
) -> Refusal:
    """The refusal of a layout whose partitions ``pairs`` share CPUs."""
    shown = "; ".join(
        f"{a.cgroup} and {b.cgroup} on {format_cpulist(a.cpus & b.cpus)}" for a, b in pairs
    )
    return Refusal(
        tuner,
        f"partitions {cfg.cgroup}.*",
        f"set {cfg.cpus!r} gives some GPUs the same CPUs ({shown}) and two partitions cannot "
        "share a CPU; use partitions = 'node', or give the set more cores per GPU",
        blocking=not cfg.report_only,
    )


def held_by_others(
    kernel: Kernel, mount: str, ours: set[str], cpus: frozenset[int]
) -> list[Partition]:
    """Valid partitions other than ours that hold any of ``cpus``.

    Our own cgroups, their ancestors (a nested partition takes its CPUs from them) and their
    descendants (partitions made inside ours) do not count.
    """

    def related(other: str) -> bool:
        return any(
            other == cg or cg.startswith(other + "/") or other.startswith(cg + "/") for cg in ours
        )

    return [p for p in valid_partitions(kernel, mount) if p.cpus & cpus and not related(p.cgroup)]


def held_refusal(
    tuner: str, cfg: Config, cpus: frozenset[int], mount: str, held: list[Partition]
) -> Refusal:
    """The refusal of ``cpus`` where the partitions ``held`` hold some of them."""
    taken = frozenset().union(*(p.cpus & cpus for p in held))
    who = "; ".join(f"{mount}/{p.cgroup} ({p.kind}, holds {format_cpulist(p.cpus)})" for p in held)
    first = f"{mount}/{held[0].cgroup}"
    reason = (
        f"CPUs {format_cpulist(taken)} of set {cfg.cpus!r} ({format_cpulist(cpus)}) are held by "
        f"another valid partition: {who}. Taking them would end that partition (the kernel "
        f"turns it 'root invalid' and it stays so). Give [cpusets.{cfg.cpus}] other CPUs "
        f"(leave out {format_cpulist(taken)}), or remove that partition first "
        f"(echo member > {first}/cpuset.cpus.partition)"
    )
    if cfg.report_only:
        return Refusal(tuner, f"partition {cfg.cgroup}", f"report only: {reason}")
    return Refusal(tuner, f"partition {cfg.cgroup}", reason, blocking=True)
