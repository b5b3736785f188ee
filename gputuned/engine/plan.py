"""The engine: read the host once, ask each tuner what it would change, collect the answers.

A :class:`Change` is data: (tuner, target, current value, wanted value, why). ``plan`` is pure:
it lists only real differences and writes nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gputuned import errors
from gputuned.changes import Change, Refusal, labelled
from gputuned.engine.coexist import coexistence_notes
from gputuned.engine.journal import Journal
from gputuned.engine.layout import gpu_node_warnings, plan_layout
from gputuned.kernel import Kernel
from gputuned.kernel.mounts import MountTable
from gputuned.kernel.proc import iter_processes, read_process
from gputuned.kernel.snapshot import snapshot
from gputuned.kernel.system import (
    read_cgroup_layout,
    read_default_affinity,
    read_host_cpus,
    read_interrupts,
    read_irq_nodes,
)
from gputuned.profile import tables as declared
from gputuned.profile.cpuresolve import housekeeping_guard, resolve_cpusets
from gputuned.profile.model import Profile
from gputuned.profile.tables.gpus import TABLE as GPUS_TABLE
from gputuned.profile.tables.gpus import Config as GpusConfig
from gputuned.settings.registry import held, impossible
from gputuned.tuners.context import Claim, PlanContext, Tuner
from gputuned.tuners.gpuuse import gpu_use

log = logging.getLogger(__name__)


@dataclass
class PlanResult:
    profile: str
    root: str
    settings: list[Change] = field(default_factory=list)  # every managed setting
    refused: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What the host's own description leaves to a guess, and the guess the plan made.
    warnings: list[str] = field(default_factory=list)
    pending_boot: list[str] = field(default_factory=list)
    sets: dict[str, str] = field(default_factory=dict)
    #: Sets per GPU and per node, partitions and GPU vectors (gputuned.engine.layout.plan_layout).
    layout: dict[str, Any] = field(default_factory=dict)

    @property
    def changes(self) -> list[Change]:
        """The settings that differ from the host: what apply would write."""
        return [c for c in self.settings if not c.in_sync]

    @property
    def report_only(self) -> list[Change]:
        """The changes listed and never applied (a tuner's ``report_only``)."""
        return [c for c in self.changes if c.report_only]

    @property
    def not_possible_here(self) -> list[Change]:
        """The changes apply cannot make here, known without writing (``Change.not_possible``):
        listed with the reason, never tried."""
        return [c for c in self.changes if c.not_possible]

    @property
    def to_make(self) -> list[Change]:
        """What apply writes: the changes neither report only nor not possible here."""
        return [c for c in self.changes if not (c.report_only or c.not_possible)]

    @property
    def blocked(self) -> list[Refusal]:
        """Refusals that stop the whole profile: apply writes nothing while there is one."""
        return [r for r in self.refused if r.blocking]

    def blocked_error(self) -> errors.PlanError:
        lines = [f"profile {self.profile!r} cannot be applied on this host; nothing was changed."]
        lines += [f"  {labelled(r.tuner, r.target)}: {r.reason}" for r in self.blocked]
        return errors.PlanError("\n".join(lines))

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "root": self.root,
            "cpusets": self.sets,
            "layout": self.layout,
            "changes": [_change_json(c) for c in self.changes],
            "in_sync": len(self.settings) - len(self.changes),
            "report_only": len(self.report_only),
            "not_possible": len(self.not_possible_here),
            "refused": [asdict(r) for r in self.refused],
            "blocked": bool(self.blocked),
            "notes": self.notes,
            "warnings": self.warnings,
            "pending_boot": self.pending_boot,
        }


def _change_json(c: Change) -> dict[str, Any]:
    d = asdict(c)
    del d["data"], d["in_sync"]
    return d


def read_context(
    kernel: Kernel,
    profile: Profile,
    *,
    registered: dict[int, tuple[int, str]] | None = None,
    journal: Journal | None = None,
    self_bound: Mapping[int, int] | None = None,
) -> PlanContext:
    """The host read once for ``profile``. ``journal``: the caller's open journal, whose
    originals the process rules need (a child's original is its parent's; a process matched
    by unit is matched by the cgroup it came from); without one it is read here."""
    pp = profile.pcie_payload
    rules = profile.process
    gpu_rules = any(r.match.uses_gpu is not None or r.by_gpu for r in rules)
    need_nvml = gpu_rules or (pp is not None and pp.mps != "keep")
    snap = snapshot(kernel, nvml=need_nvml, gpu_trees_only=True)
    skip: GpusConfig | None = GPUS_TABLE.present(profile)
    if skip is not None and skip.skip:  # a skipped GPU is no GPU to any tuner
        topo = dataclasses.replace(snap.topo, skip=frozenset(skip.skip))
        snap = dataclasses.replace(snap, topo=topo)
    cpus = read_host_cpus(kernel, snap.topo, snap.nvml)
    # Which node each IRQ's device sits on matters only where there are several nodes.
    irq_nodes = read_irq_nodes(kernel) if profile.irq and len(cpus.nodes) > 1 else {}
    return PlanContext(
        kernel=kernel,
        profile=profile,
        snap=snap,
        cpus=cpus,
        sets=resolve_cpusets(profile, cpus),
        irqs=read_interrupts(kernel),
        default_affinity=read_default_affinity(kernel),
        cgroup=read_cgroup_layout(kernel),
        # stat and cmdline only: exe, cgroup and the owner cost three more reads a process, so
        # they are read for the few processes whose comm and cmdline a rule matches
        # (tuners/proctree.py claim()).
        processes=iter_processes(kernel, brief=True),
        registered=dict(registered or {}),
        irq_nodes=irq_nodes,
        original=journal_originals(kernel, journal),
        gpu_use=gpu_use(kernel, cpus.gpus, snap.nvml) if gpu_rules else None,
        self_bound=dict(self_bound or {}),
    )


def journal_originals(kernel: Kernel, journal: Journal | None) -> Callable[[str], str | None]:
    """Look-up of journaled originals by key. Without ``journal`` the host's is read; one that
    cannot be read (not root, or damaged: apply and revert say so) counts as empty here."""
    if journal is None:
        try:
            journal = Journal(kernel)
        except errors.GputunedError as exc:
            log.debug("plan: journal not read (%s); no originals known", exc)
            return lambda _key: None
    entries = journal

    def original(key: str) -> str | None:
        entry = entries.get(key)
        return None if entry is None else entry.old

    return original


def all_tuners() -> Sequence[Tuner]:
    """The tables' tuners, in the order their declarations give (gputuned/profile/tables/)."""
    out = []
    for table in sorted(declared.tables(), key=lambda t: t.plan_rank):
        module, _, name = table.tuner.partition(":")
        out.append(getattr(importlib.import_module(module), name)())
    return out


def plan_profile(
    kernel: Kernel,
    profile: Profile,
    *,
    registered: dict[int, tuple[int, str]] | None = None,
    allow_blocked: bool = False,
    journal: Journal | None = None,
    self_bound: Mapping[int, int] | None = None,
) -> PlanResult:
    """Every change ``profile`` would make through ``kernel``, and what it refuses. Writes nothing.

    A blocking refusal (:class:`Refusal`) raises PlanError, so that apply, which plans first,
    writes nothing. ``allow_blocked`` returns such a plan instead, for commands that only show
    it (``gputunectl plan``, ``verify``).
    """
    from gputuned.cpulist import format_cpulist

    ctx = read_context(
        kernel, profile, registered=registered, journal=journal, self_bound=self_bound
    )
    result = PlanResult(
        profile=profile.name,
        root=str(kernel.root),
        sets={k: format_cpulist(v) for k, v in ctx.sets.sets.items()},
    )
    result.notes += ctx.sets.notes
    result.warnings += gpu_node_warnings(ctx.cpus, ctx.sets.per_gpu)
    result.refused += housekeeping_guard(profile, ctx.sets, ctx.cpus)
    if not ctx.snap.topo.gpus():
        result.notes.append(
            "no GPU found on this host: PCIe tuning has nothing to do; CPU and IRQ work is still planned"
        )
    for tuner in all_tuners():
        try:
            tp = tuner.plan(ctx, tuple(result.settings))
        except errors.HostError as exc:
            result.refused.append(Refusal(tuner.name, "*", f"could not read the host: {exc}"))
            continue
        result.settings += tp.changes
        result.refused += tp.refused
        result.notes += tp.notes
        result.pending_boot += tp.pending_boot
    result.settings = settled(kernel, result.settings)
    result.notes += coexistence_notes(kernel, profile, ctx.processes, plan=True)
    result.layout = plan_layout(ctx, result.settings)
    if result.blocked and not allow_blocked:
        raise result.blocked_error()
    return result


def plan_processes(
    ctx: PlanContext, pids: list[int], threads: Mapping[int, Collection[int]] | None = None
) -> tuple[list[Change], dict[int, Claim]]:
    """Process settings for just ``pids``, against an earlier context (the daemon's fast path:
    a new process is placed without re-reading the whole host), and the claims on them. A
    process whose parent is among ``ctx.claimed`` is a descendant of a claimed one.
    ``threads``: for these pids only the threads named (new ones) are read and planned, not
    every thread of the process (ProcessTuner.plan_tree)."""
    from gputuned.tuners.inplace import decision
    from gputuned.tuners.procplan import ProcessTuner

    decision(ctx)  # on the full reading of ``ctx``, before its processes are narrowed to pids
    if ctx.gpu_use is not None:
        ctx.gpu_use.forget(set(pids))  # a new exec, or a GPU opened since the last look
    procs = []
    for pid in pids:
        try:
            procs.append(read_process(ctx.kernel, pid, threads=False, brief=True))
        except (errors.TargetGone, errors.PermissionDenied):
            continue
    plan, claims = ProcessTuner().plan_tree(dataclasses.replace(ctx, processes=procs), only=threads)
    return settled(ctx.kernel, plan.changes), claims


def settled(kernel: Kernel, changes: list[Change]) -> list[Change]:
    """``changes`` with ``in_sync`` as each one's setting answers it (registry ``held``), and
    for those apply would write, ``not_possible`` (registry ``impossible``: a read-only
    mount holds the file): tuners say what they want, never whether the host has it or
    lets it be written."""
    mounts = MountTable(kernel)
    out = []
    for c in changes:
        now = dataclasses.replace(c, in_sync=held(kernel, c))
        if not (now.in_sync or now.report_only):
            now = dataclasses.replace(now, not_possible=impossible(now, mounts))
        out.append(now)
    return out
