"""verify: compare the live host with the profile, one line per setting.

Statuses: passed, drifted, pending reboot, not possible here, report only, left to the process.
Exit codes (the table of every command: gputuned/exitcodes.py): 0 ok, 1 drift, 2 pending reboot.
"not possible here" (firmware owns ASPM, an unmovable IRQ, no cgroup v2) does not fail verify
unless ``strict``. "left to the process" (only the daemon's verify has it: a placed process that
binds itself, whose CPUs the daemon stopped repairing under ``self_binding = "respect"``,
gputuned/daemon/selfbind.py) never fails verify, ``strict`` or not: the rule asked for it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from gputuned import exitcodes

if TYPE_CHECKING:
    # A report the daemon sent is read back without the planner (gputunectl verify).
    from gputuned.engine.plan import PlanResult

PASSED, DRIFTED, PENDING, NOT_POSSIBLE, REPORT_ONLY, SELF_BOUND = (
    "passed",
    "drifted",
    "pending reboot",
    "not possible here",
    "report only",
    "left to the process",
)
STATUSES = (PASSED, DRIFTED, PENDING, NOT_POSSIBLE, REPORT_ONLY, SELF_BOUND)


def verify_exit_code(counts: dict[str, int], *, strict: bool = False) -> int:
    """What ``gputunectl verify`` exits with for these counts of each status."""
    if counts.get(DRIFTED) or (strict and counts.get(NOT_POSSIBLE)):
        return exitcodes.DRIFTED
    return exitcodes.PENDING_REBOOT if counts.get(PENDING) else exitcodes.OK


@dataclass(frozen=True)
class Line:
    status: str
    tuner: str
    target: str
    live: str
    wanted: str
    reason: str = ""


@dataclass
class VerifyReport:
    profile: str
    lines: list[Line] = field(default_factory=list)
    strict: bool = False
    at: float = field(default_factory=time.time)

    def count(self, status: str) -> int:
        return sum(1 for ln in self.lines if ln.status == status)

    @property
    def exit_code(self) -> int:
        return verify_exit_code({s: self.count(s) for s in STATUSES}, strict=self.strict)

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "exit_code": self.exit_code,
            "counts": {s: self.count(s) for s in STATUSES},
            "settings": [asdict(ln) for ln in self.lines],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], *, strict: bool = False) -> VerifyReport:
        """Rebuild a report the daemon sent (``to_json``) for rendering here."""
        return cls(str(d["profile"]), [Line(**ln) for ln in d["settings"]], strict=strict)

    def prometheus(self) -> str:
        """node_exporter textfile format (one family per metric, HELP and TYPE first)."""
        prof = self.profile.replace("\\", "\\\\").replace('"', '\\"')
        out = [
            "# HELP gputuned_settings Settings of the active profile by verify status.",
            "# TYPE gputuned_settings gauge",
        ]
        for s in STATUSES:
            out.append(f'gputuned_settings{{profile="{prof}",status="{s}"}} {self.count(s)}')
        out += [
            "# HELP gputuned_verify_exit_code Exit code of the last verify (0 ok, 1 drift, 2 pending reboot).",
            "# TYPE gputuned_verify_exit_code gauge",
            f'gputuned_verify_exit_code{{profile="{prof}"}} {self.exit_code}',
            "# HELP gputuned_verify_timestamp_seconds When the last verify ran.",
            "# TYPE gputuned_verify_timestamp_seconds gauge",
            f'gputuned_verify_timestamp_seconds{{profile="{prof}"}} {self.at:.3f}',
        ]
        return "\n".join(out) + "\n"


def verify_plan(plan: PlanResult, state: dict[str, Any], *, strict: bool = False) -> VerifyReport:
    """Turn a fresh plan of the active profile into verify lines."""
    not_possible: dict[str, dict[str, str]] = state.get("not_possible", {})
    rep = VerifyReport(plan.profile, strict=strict)
    for ch in plan.settings:
        if ch.key in not_possible and not ch.in_sync:
            status, reason = NOT_POSSIBLE, not_possible[ch.key]["reason"]
        elif ch.in_sync:
            status, reason = PASSED, ""
        elif ch.not_possible:  # known without an apply's attempt (a read-only mount)
            status, reason = NOT_POSSIBLE, ch.not_possible
        elif ch.report_only:
            status, reason = REPORT_ONLY, "the profile sets report_only for this tuner"
        else:
            status, reason = DRIFTED, ch.why
        rep.lines.append(Line(status, ch.tuner, ch.target, ch.current, ch.wanted, reason))
    for r in plan.refused:
        rep.lines.append(Line(NOT_POSSIBLE, r.tuner, r.target, "-", "-", r.reason))
    for arg in plan.pending_boot:
        rep.lines.append(
            Line(PENDING, "bootargs", arg.split()[0], "-", arg.split()[0], "not in /proc/cmdline")
        )
    return rep
