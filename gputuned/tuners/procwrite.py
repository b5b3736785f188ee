"""The settings of one process a `[[process]]` rule claims, as plan changes.

One :class:`~gputuned.changes.Change` per attribute (nice, policy, affinity: one value per
thread; the cgroup: the whole process), keyed as the journal keys them, each carrying the
originals :mod:`gputuned.tuners.proctree` worked out: a thread that shows what a placement
passed on at fork has its ancestor's original journaled, not the value it shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gputuned.changes import Change
from gputuned.tuners.context import PlanContext

if TYPE_CHECKING:
    from gputuned.kernel.proc import ProcInfo
    from gputuned.profile.tables.process import Config
    from gputuned.tuners.context import Claim
    from gputuned.tuners.proctree import Tuned


class ChangeWriter:
    """Builds the changes of one process (see procplan.ProcessTuner._plan_proc)."""

    def __init__(self, tuner: str, ctx: PlanContext, rule: Config, proc: ProcInfo, c: Claim):
        self.tuner, self.ctx, self.rule, self.proc, self.claim = tuner, ctx, rule, proc, c
        self.out: list[Change] = []
        how = ""
        if c.role == "child":
            how = f", started by {c.parent}"
        elif c.role == "excluded":
            how = f", left out, started by {c.parent}"
        self.label = f"pid {proc.pid} ({proc.comm}{how}, {len(proc.threads)} threads)"
        self.why = f"process rule {rule.name!r}"
        if c.role == "child":
            self.why += f" (a process pid {c.parent} of the rule started)"
        elif c.role == "excluded":
            self.why += " leaves it out: back to what its ancestor had before gputuned"

    def _data(self) -> dict[str, object]:
        p = self.proc
        return {
            "pid": p.pid,
            "start": p.start_time,
            "rule": self.rule.name,
            "role": self.claim.role,
        }

    def per_thread(
        self,
        attr: str,
        old: dict[int, str],
        want: dict[int, str],
        shown: str,
        orig: dict[str, str | None],
        tuned: Tuned,
        *,
        have: dict[int, str] | None = None,
        give_back: bool = False,
    ) -> None:
        have = old if have is None else have
        was = orig.get(attr)
        origin = {
            tid: was
            for tid in want
            if was is not None and (give_back or tuned.shows(attr, have[tid]))
        }
        p = self.proc
        self.out.append(
            Change(
                self.tuner,
                f"{self.label} {attr}",
                _summary([have[t] for t in want]),
                shown,
                self.why,
                report_only=self.rule.report_only,
                key=f"thread:{p.pid}:{p.start_time}:{attr}",
                kind="thread",
                data={
                    **self._data(),
                    "ppid": p.ppid,
                    "attr": attr,
                    "threads": want,
                    "old": {tid: origin.get(tid, old[tid]) for tid in want},
                    "origin": origin,
                    "cgmount": self.ctx.cgroup.v2_mount,
                },
            )
        )

    def move(self, want: str, origin: str | None) -> None:
        mount = self.ctx.cgroup.v2_mount
        if mount is None:
            return
        p = self.proc
        self.out.append(
            Change(
                self.tuner,
                f"{self.label} cgroup",
                p.cgroup or "-",
                want,
                self.why,
                report_only=self.rule.report_only,
                key=f"proc_cgroup:{p.pid}:{p.start_time}",
                kind="proc_cgroup",
                data={**self._data(), "mount": mount, "origin": origin},
            )
        )


def _summary(values: list[str]) -> str:
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else "mixed: " + ", ".join(distinct)
