"""The neighbours: weight or cap the CPU time of everything that is not the server.

A partition gives the server CPUs of its own; the rest of the host still runs flat out on the
others, and on a virtual machine busy sibling vCPUs slow the server's own (measured on a
16-vCPU VM: a pure loop ran at 0.79x with the 15 other vCPUs busy). `[neighbours]` sets
the cgroup v2 cpu controller's `cpu.max` (a bandwidth cap: `cap_cpus = 4` is "400000 100000",
four CPUs' worth of time per 100 ms) and/or `cpu.weight` (the share under contention, 1-10000,
the kernel's default 100) on every cgroup that holds neither the server nor gputuned
(Documentation/admin-guide/cgroup-v2.rst, "CPU Interface Files").

Which cgroups: the children of the cgroup v2 root, except gputuned's own (the `[cpuset]`
cgroup and its per-node or per-GPU siblings, and `gputuned.service`, the daemon), systemd's
`init.scope` (PID 1, which starts every login and unit), the cgroups
of the processes the `[[process]]` rules place (where a rule moves them into the partition,
that is gputuned's own) and those listed in `keep`. Where a child holds the server or
gputuned further down (systemd's `system.slice` holding `inference.service`), its own children
are taken instead, one level at a time, so that the server's and gputuned's ancestors are
never capped: `user.slice`, `machine.slice` and `system.slice/cron.service` are, `system.slice`
is not. Each of these cgroups gets the cap on its own (cgroup v2 has no cap over several
sibling cgroups): with `cap_cpus = 4`, `user.slice` and `machine.slice` may use four CPUs each.

Processes in the root cgroup itself (kernel threads, and on hosts without systemd often
everything started at boot) cannot be weighted or capped: the root cgroup has no `cpu.max` or
`cpu.weight`. `plan` counts them. A process in a cgroup that gputuned descends through cannot
be capped either (it would need `cpu.max` on the server's ancestor); `plan` counts those too.

systemd: where systemd is PID 1 (`/run/systemd/system`), a cgroup named like a unit
(`user.slice`, `cron.service`, `session-4.scope`) is changed through the unit's properties
(`systemctl set-property --runtime UNIT CPUQuota=400% CPUWeight=50`), so that systemd's view
(`systemctl show`, `systemctl status`) agrees and its next `daemon-reload` keeps the values.
Other cgroups get the files written directly, and so do those inside a user's own service manager
(`user@1000.service/...`): their units are the user manager's, not the system's.

The neighbours are planned with the rest of the profile. A server process that a rule leaves
where it is (no `move_to_partition`) and that starts later inside a cgroup capped as a
neighbour makes the daemon plan the whole profile again, which leaves that cgroup alone.

The cpu controller must be enabled in the parent's `cgroup.subtree_control` for the children to
have these files. Where it is not, apply enables it (`+cpu`, journaled, reverted), and the plan
says what that does: the parent's children then share CPU time by `cpu.weight` (100 each, unless
set) instead of thread by thread, which changes how the host shares CPUs even where no cap is
set. A parent that has processes of its own (other than the root) cannot enable it (the "no
internal processes" rule): its children are refused in the plan. Under systemd, systemd enables
it along the path itself.

Absent table: nothing changes. Revert puts back each value read before the first change.
"""

from __future__ import annotations

import math

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from gputuned.profile.tables import Ref, Table


class Config(BaseModel):
    """The `[neighbours]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cap_cpus: float | StrictStr | None = Field(
        default=None,
        description=(
            "CPU time each neighbour cgroup may use, in CPUs (4: cpu.max '400000 100000'; "
            "fractions allowed, at least 0.01), or the name of a [cpusets] set: as many CPUs as "
            "it has on this host. Absent: no cap."
        ),
    )
    weight: StrictInt | None = Field(
        default=None,
        ge=1,
        le=10000,
        description="cpu.weight of each neighbour cgroup (1-10000; the kernel's default is 100).",
    )
    keep: tuple[StrictStr, ...] = Field(
        default=(),
        description=(
            "cgroups left alone, as paths under the cgroup v2 mount ('init.scope', "
            "'system.slice/backup.service')."
        ),
    )
    report_only: StrictBool = Field(
        default=False, description="List the neighbours and what would change; change nothing."
    )

    @model_validator(mode="after")
    def _check(self) -> Config:
        if self.cap_cpus is None and self.weight is None:
            raise ValueError("give cap_cpus, weight or both (or leave the table out)")
        if isinstance(self.cap_cpus, int | float) and not (
            math.isfinite(self.cap_cpus) and self.cap_cpus >= 0.01
        ):
            raise ValueError("cap_cpus: at least 0.01 CPU (the kernel's smallest quota, 1 ms)")
        for k in self.keep:
            if not k.strip("/") or ".." in k.split("/"):
                raise ValueError(f"keep: {k!r} is not a cgroup path under the mount")
        return self


def _refs(cfg: Config) -> list[Ref]:
    return [("neighbours.cap_cpus", cfg.cap_cpus, False)] if isinstance(cfg.cap_cpus, str) else []


TABLE = Table(
    key="neighbours",
    model=Config,
    summary="CPU weight and cap of everything that is not the server.",
    manual=__doc__ or "",
    position=70,
    tuner="gputuned.tuners.neighbours:NeighboursTuner",
    plan_rank=70,
    refs=_refs,
)
