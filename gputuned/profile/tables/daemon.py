"""The `[daemon]` table: how the long-running gputuned service keeps the profile in place.

`gputunectl apply` is a one-shot; the daemon (`systemctl enable --now gputuned`) applies the
active profile at boot, places matching processes as they start (threads created later too),
re-reads what it applied every `drift_interval_s` and repairs drift (the kernel restoring DevCtl
after a reset, irqbalance moving IRQs back, someone renicing), and reverts everything when it
stops.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from gputuned.profile.tables import Table

#: A user or group name as useradd(8) accepts it (NAME_REGEX of adduser.conf, with '.').
_NAME = re.compile(r"[a-z_][a-z0-9_.-]*\$?")


class Config(BaseModel):
    """The `[daemon]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    drift_interval_s: float = Field(
        default=10.0,
        ge=0.5,
        le=3600,
        description="Seconds between re-reads of every applied setting; drift is repaired and counted.",
    )
    nvml_interval_s: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="Seconds between NVML looks for processes that newly opened a GPU (rules with match.uses_gpu or by_gpu; NVML has no events).",
    )
    gpu_scan_interval_s: float = Field(
        default=2.0,
        ge=0.2,
        le=3600,
        description="With by_gpu rules: seconds between reads of the GPU device nodes (/proc/PID/fd) of the processes placed without a GPU open, so a process that opens its GPU after it started moves to that GPU's CPUs within this time (the kernel announces no open).",
    )
    revert_on_shutdown: StrictBool = Field(
        default=True,
        description="Revert when the daemon stops during system shutdown too. false skips it: runtime settings die with the boot anyway, and the shutdown is faster.",
    )
    control_group: StrictStr | None = Field(
        default=None,
        description="Group whose members may use the control socket's read-only commands (status, verify, top) besides root (socket mode 0660); unset: root only (0600).",
    )
    admin_group: StrictStr | None = Field(
        default=None,
        description="Group whose members may also send the commands that change the host (apply, revert, register, unregister), which are otherwise root's only. With control_group set too, its members must be in that group as well to reach the socket file.",
    )
    realtime_priority: StrictInt = Field(
        default=0,
        ge=0,
        le=10,
        description="SCHED_FIFO priority (1 is the lowest) for the daemon's event thread, so that on a busy host it places a new process at once instead of waiting for a CPU behind the neighbours (issue 20: under heavy noise on 2 CPUs, exec -> placed p99 29 ms at nice -10, 4 ms at FIFO 1). 0: off, the unit's nice only. Threads and processes it starts stay SCHED_OTHER (SCHED_RESET_ON_FORK); the kernel's RT throttling bounds it. The kernel refuses it in a cgroup whose cpu controller has no RT budget (CONFIG_RT_GROUP_SCHED); the daemon says so and runs on. On such kernels a real-time task below the root cgroup also keeps the cpu controller from being enabled above it. Read when the daemon starts.",
    )
    metrics_port: StrictInt | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Serve Prometheus metrics at http://ADDRESS:PORT/metrics (ADDRESS: metrics_address): the verify counts, the daemon's counters and, per placed process, run-queue delay, context switches, IRQs on its CPUs and GPU load. Unset: off. Read when the daemon starts.",
    )
    metrics_address: StrictStr = Field(
        default="127.0.0.1",
        description="IP address the metrics port binds. Anything but loopback also needs an IPAddressAllow= drop-in for the systemd unit, which denies IP traffic other than loopback.",
    )
    metrics_allow: tuple[StrictStr, ...] = Field(
        default=(),
        description="Who may scrape besides root: local users by name ('prometheus'), members of a group ('@monitoring'), and clients from other hosts by network ('10.0.0.0/8'). The figures list processes, so no one else may (a 403).",
    )

    @field_validator("control_group", "admin_group")
    @classmethod
    def _group_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a group name; use the name groupadd made")
        return value

    @field_validator("metrics_address")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address; use one such as 127.0.0.1") from None
        return value

    @field_validator("metrics_allow")
    @classmethod
    def _allow(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            if _NAME.fullmatch(entry.removeprefix("@")):
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry!r} is neither a user, a @group nor a network such as 10.0.0.0/8"
                ) from None
        return value


TABLE = Table(
    key="daemon",
    model=Config,
    summary="How the gputuned service keeps the profile.",
    manual=__doc__ or "",
    position=80,
    tuner="gputuned.tuners.daemon:DaemonTuner",
    plan_rank=90,
    always=True,
)
