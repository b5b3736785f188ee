"""Other tools on this host that place CPUs or IRQs: TuneD's active profile and a running
irqbalance. ``plan`` and ``status`` say what they found and what to do (issue 19, item 5;
docs/coexistence.md has each case and its sources).

Only what the IRQ tuner does not already say: with an ``[irq]`` table it coordinates with a
running irqbalance, or reports it (tuners/irq.py), so a plan mentions irqbalance here only
for a profile without one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gputuned.kernel import Kernel, tuned
from gputuned.userdocs import cite

if TYPE_CHECKING:
    from gputuned.kernel.proc import ProcInfo
    from gputuned.profile.model import Profile


def _pids(processes: Iterable[ProcInfo], comm: str) -> list[int]:
    return sorted(p.pid for p in processes if p.comm == comm)


def tuned_notes(kernel: Kernel, processes: Iterable[ProcInfo]) -> list[str]:
    """What TuneD's active profile does to CPUs and IRQs, when anything."""
    active = tuned.read_active(kernel)
    if active is None:
        return []
    notes: list[str] = []
    names = " ".join(active.names)
    pids = _pids(processes, "tuned")
    running = (
        f"TuneD runs (PID {pids[0]})"
        if pids
        else "TuneD is not running now, and applies it when it starts"
    )
    if active.touches:
        notes.append(
            f"TuneD's active profile '{names}' places CPUs or IRQs too "
            f"({', '.join(active.touches)}); {running}. It and gputuned would undo each "
            "other's work: switch TuneD to a profile that leaves them alone (tuned-adm "
            "profile throughput-performance), or take those keys out of its profile "
            f"({cite('coexistence.md')}, TuneD)"
        )
    if active.missing:
        notes.append(
            f"TuneD's active profile names {', '.join(active.missing)}, found in none of "
            f"{', '.join(tuned.PROFILE_DIRS)}: what it does to CPUs and IRQs is not known; "
            "check with tuned-adm active"
        )
    return notes


def irqbalance_runs(processes: Iterable[ProcInfo]) -> bool:
    """Whether irqbalance is among ``processes``: without it, :func:`irqbalance_notes` says
    nothing whatever the profile (status then reads no profile)."""
    return bool(_pids(processes, "irqbalance"))


def irqbalance_notes(
    profile: Profile | None, processes: Iterable[ProcInfo], *, plan: bool
) -> list[str]:
    """What a running irqbalance means for ``profile`` (the active one, for status)."""
    pids = _pids(processes, "irqbalance")
    if not pids:
        return []
    notes: list[str] = []
    cfg = profile.irq if profile is not None else None
    if cfg is None:
        if profile is not None and profile.cpusets:
            notes.append(
                f"irqbalance runs (PID {pids[0]}) and this profile has no [irq] table: "
                "irqbalance may put device IRQs on the CPUs the profile keeps for the "
                "server; add [irq] (gputuned then tells irqbalance which CPUs to leave "
                "alone) or ban them in irqbalance's IRQBALANCE_BANNED_CPULIST"
            )
    elif not plan and cfg.irqbalance == "coordinate":
        notes.append(
            f"irqbalance runs (PID {pids[0]}); irq.irqbalance = 'coordinate' tells it through "
            "its socket which CPUs to leave alone, at apply and at every drift check"
        )
    elif not plan:
        notes.append(
            f"irqbalance runs (PID {pids[0]}) and irq.irqbalance = '{cfg.irqbalance}' leaves "
            "it be: it moves IRQs back onto the CPUs gputuned cleared; stop it (systemctl "
            "disable --now irqbalance) or set irq.irqbalance = 'coordinate'"
        )
    return notes


def coexistence_notes(
    kernel: Kernel, profile: Profile | None, processes: Iterable[ProcInfo], *, plan: bool
) -> list[str]:
    procs = list(processes)
    return tuned_notes(kernel, procs) + irqbalance_notes(profile, procs, plan=plan)
