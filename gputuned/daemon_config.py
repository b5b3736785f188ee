"""The `[daemon]` table: how the long-running gputuned service keeps the profile in place.

`gputunectl apply` is a one-shot; the daemon (`systemctl enable --now gputuned`) applies the
active profile at boot, places matching processes as they start (threads created later too),
re-reads what it applied every `drift_interval_s` and repairs drift (the kernel restoring DevCtl
after a reset, irqbalance moving IRQs back, someone renicing), and reverts everything when it
stops.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


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
        description="Seconds between NVML looks for processes that newly opened a GPU (rules with match.uses_gpu; NVML has no events).",
    )
    revert_on_shutdown: StrictBool = Field(
        default=True,
        description="Revert when the daemon stops during system shutdown too. false skips it: runtime settings die with the boot anyway, and the shutdown is faster.",
    )
    control_group: StrictStr | None = Field(
        default=None,
        description="Group whose members may use the control socket besides root (mode 0660); unset: root only (0600).",
    )
    metrics_port: StrictInt | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Serve Prometheus metrics at http://127.0.0.1:PORT/metrics: the verify counts, the daemon's counters and, per placed process, run-queue delay, context switches, IRQs on its CPUs and GPU load. Unset: off. Read when the daemon starts.",
    )
