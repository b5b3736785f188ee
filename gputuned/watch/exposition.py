"""Prometheus text exposition (format 0.0.4) of gputuned's figures.

One writer for both outputs: ``gputunectl verify --prometheus FILE`` (node_exporter's textfile
collector) and the daemon's optional ``/metrics`` port (:mod:`gputuned.service.httpmetrics`). The
daemon serves the verify families plus its counters and, for every process it placed or had
registered, the counters behind ``gputunectl top``. They are served as counters, not rates:
``rate(gputuned_process_runqueue_wait_seconds_total[1m]) * 1000`` is top's "run-queue ms/s".
Nothing is sampled between scrapes, so an idle daemon stays idle.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gputuned import errors
from gputuned.engine.verify import STATUSES, verify_exit_code
from gputuned.kernel import Kernel
from gputuned.kernel.nvml import NvmlGpu, read_gpus
from gputuned.kernel.sampling import (
    IrqCounts,
    ProcSample,
    clock_ticks,
    read_irq_counts,
    sample_process,
)

log = logging.getLogger(__name__)


def escape_label(value: str) -> str:
    """A label value as the exposition format wants it: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items()) + "}"


def _value(v: float) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))


@dataclass
class Exposition:
    """Families in order, each with HELP and TYPE before its samples (as the format requires)."""

    lines: list[str] = field(default_factory=list)

    def family(
        self,
        name: str,
        kind: str,
        text: str,
        samples: Iterable[tuple[dict[str, str], float]],
        *,
        fmt: str | None = None,
    ) -> None:
        rows = list(samples)
        if not rows:
            return  # a family without samples is noise for the scraper
        self.lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, v in rows:
            shown = fmt.format(v) if fmt else _value(v)
            self.lines.append(f"{name}{_labels(labels)} {shown}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n" if self.lines else ""


def add_verify(exp: Exposition, profile: str, counts: dict[str, int], *, at: float | None) -> None:
    """The verify families, exactly as ``gputunectl verify --prometheus`` writes them."""
    p = {"profile": profile}
    exp.family(
        "gputuned_settings",
        "gauge",
        "Settings of the active profile by verify status.",
        [({**p, "status": s}, int(counts.get(s, 0))) for s in STATUSES],
    )
    exp.family(
        "gputuned_verify_exit_code",
        "gauge",
        "Exit code of the last verify (0 ok, 1 drift, 2 pending reboot).",
        [(p, verify_exit_code(counts))],
    )
    if at is not None:
        exp.family(
            "gputuned_verify_timestamp_seconds",
            "gauge",
            "When the last verify ran.",
            [(p, at)],
            fmt="{:.3f}",
        )


def add_processes(
    exp: Exposition,
    procs: list[tuple[ProcSample, str]],
    irqs: IrqCounts | None,
    *,
    ticks: int,
) -> None:
    """Counters per watched process (``(sample, why)``; why: placed or registered)."""

    def lab(s: ProcSample, why: str) -> dict[str, str]:
        return {"pid": str(s.pid), "comm": s.comm, "why": why}

    with_sched = [
        (s, w) for s, w in procs if all(t.wait_ns is not None for t in s.threads) and s.threads
    ]
    exp.family(
        "gputuned_process_runqueue_wait_seconds_total",
        "counter",
        "Time the process's live threads spent runnable but waiting for a CPU (schedstat).",
        [(lab(s, w), sum(t.wait_ns or 0 for t in s.threads) / 1e9) for s, w in with_sched],
    )
    exp.family(
        "gputuned_process_cpu_seconds_total",
        "counter",
        "CPU time of the process (utime + stime, exited threads included).",
        [(lab(s, w), s.cpu_ticks / ticks) for s, w in procs],
    )
    exp.family(
        "gputuned_process_context_switches_total",
        "counter",
        "Context switches of the process's live threads; involuntary ones are preemptions.",
        [
            ({**lab(s, w), "kind": kind}, sum(getattr(t, kind) for t in s.threads))
            for s, w in procs
            for kind in ("voluntary", "involuntary")
        ],
    )
    exp.family(
        "gputuned_process_threads",
        "gauge",
        "Threads of the process.",
        [(lab(s, w), len(s.threads)) for s, w in procs],
    )
    exp.family(
        "gputuned_process_allowed_cpus",
        "gauge",
        "CPUs the process's threads may run on.",
        [(lab(s, w), len(s.cpus)) for s, w in procs],
    )
    if irqs is not None:
        exp.family(
            "gputuned_process_cpu_irqs_total",
            "counter",
            "Device IRQs handled so far by the CPUs the process may run on (restarts when "
            "its CPUs change).",
            [(lab(s, w), irqs.on(s.cpus)) for s, w in procs],
        )
        exp.family(
            "gputuned_cpu_device_irqs_total",
            "counter",
            "Device IRQs handled per CPU (numbered lines of /proc/interrupts).",
            [({"cpu": str(c)}, n) for c, n in sorted(irqs.device.items())],
        )


def add_gpus(exp: Exposition, gpus: list[NvmlGpu]) -> None:
    exp.family(
        "gputuned_gpu_utilization_ratio",
        "gauge",
        "GPU busy fraction over NVML's last sample period.",
        [
            ({"gpu": str(g.index), "bdf": g.bdf, "name": g.name}, g.utilization_gpu / 100)
            for g in gpus
            if g.utilization_gpu is not None
        ],
    )


def daemon_metrics(kernel: Kernel, status: dict[str, Any], *, nvml: bool = True) -> str:
    """Everything the daemon serves, from its ``status`` answer (the control socket's)."""
    exp = Exposition()
    d = status.get("daemon") or {}
    profile = status.get("active_profile")
    exp.family(
        "gputuned_info",
        "gauge",
        "gputuned daemon version and active profile (empty: none).",
        [({"version": str(d.get("version", "")), "profile": profile or ""}, 1)],
    )
    if profile and status.get("verify"):
        add_verify(exp, profile, status["verify"], at=status.get("verified_at"))
    exp.family(
        "gputuned_journal_entries",
        "gauge",
        "Original values held in the journal for revert.",
        [({}, int(status.get("journal_entries", 0)))],
    )
    for name, text in (
        ("repairs", "Drifted settings the daemon put back."),
        ("replans", "Re-plans after PCI udev events."),
        ("placements", "Process placements that wrote something."),
        ("reloads", "Profile reloads (SIGHUP)."),
        ("self_binding", "Placed processes found setting their own CPUs back (twice in a row)."),
    ):
        if name in d:
            exp.family(f"gputuned_{name}_total", "counter", text, [({}, int(d[name]))])
    if "self_binding" in status:
        found = [s for s in status["self_binding"] if isinstance(s, dict)]
        exp.family(
            "gputuned_self_binding_processes",
            "gauge",
            "Placed processes that bind themselves, by the rule's self_binding: 'respect' "
            "(their CPUs left to them) or 'override' (repaired on).",
            [
                ({"mode": mode}, sum(1 for s in found if s.get("mode") == mode))
                for mode in ("respect", "override")
            ],
        )
    registered = {int(k): str(v) for k, v in (status.get("registered") or {}).items()}
    pids = sorted(set(status.get("placed") or []) | set(registered))
    exp.family(
        "gputuned_watched_processes",
        "gauge",
        "Processes the daemon placed or had registered.",
        [({}, len(pids))],
    )
    procs = []
    for pid in pids:
        try:
            procs.append(
                (sample_process(kernel, pid), "registered" if pid in registered else "placed")
            )
        except (errors.TargetGone, errors.PermissionDenied):
            continue  # exited since the daemon last looked
    try:
        irqs: IrqCounts | None = read_irq_counts(kernel)
    except errors.HostError as exc:
        log.debug("metrics: /proc/interrupts unreadable: %s", exc)
        irqs = None
    add_processes(exp, procs, irqs, ticks=clock_ticks())
    gpus = read_gpus(kernel) if nvml else None
    if gpus:
        add_gpus(exp, gpus)
    return exp.text()
