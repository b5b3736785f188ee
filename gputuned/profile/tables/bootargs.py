"""Kernel command-line arguments for what only boot can set.

A CPU partition moves no IRQs, keeps the timer tick and leaves RCU callbacks on its CPUs. Those
are boot parameters (Documentation/admin-guide/kernel-parameters.txt):

- `nohz_full`: stop the periodic tick on these CPUs while one task runs there.
- `rcu_nocbs`: run RCU callbacks for these CPUs on other CPUs.
- `irqaffinity`: the CPUs IRQs start on at boot; keep it off `nohz_full` and `rcu_nocbs`.
- `pcie_aspm`: `"off"` leaves ASPM exactly as firmware set it and removes the runtime controls
  `[pcie_aspm]` uses; `"force"` enables ASPM even on devices that claim not to support it. To boot
  with ASPM disabled on every link, use `extra = ["pcie_aspm.policy=performance"]` instead.
- `extra`: further arguments, each `key` or `key=value`.

The CPU arguments name sets from `[cpusets]`, resolved on this host to CPU lists. They take
effect only at the next boot: gputuned reports each argument as pending until `/proc/cmdline`
contains it. The kernel takes the boot CPU out of `nohz_full` because it keeps time
(kernel/time/tick-sched.c), so keep CPU 0 in a housekeeping set.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

from gputuned.profile.tables import Ref, Table

#: Keys with their own field; `extra` may not set them a second time.
TYPED_KEYS = ("nohz_full", "rcu_nocbs", "irqaffinity", "pcie_aspm")
#: The keys that name a CPU set.
SET_KEYS = ("nohz_full", "rcu_nocbs", "irqaffinity")


_ARG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(=[^\s\"';`\\]+)?")


def _check_arg(value: str) -> str:
    if not _ARG.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an argument gputuned writes; use key or key=value without "
            "spaces, quotes or semicolons (e.g. 'preempt=full')"
        )
    key = value.partition("=")[0]
    if key in TYPED_KEYS:
        raise ValueError(f"{value!r} sets {key}, which has its own key: write bootargs.{key}")
    return value


class Config(BaseModel):
    """The `[bootargs]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nohz_full: StrictStr | None = Field(
        default=None, description="CPU set (a [cpusets] name) for nohz_full=, or absent."
    )
    rcu_nocbs: StrictStr | None = Field(
        default=None, description="CPU set (a [cpusets] name) for rcu_nocbs=, or absent."
    )
    irqaffinity: StrictStr | None = Field(
        default=None, description="CPU set (a [cpusets] name) for irqaffinity=, or absent."
    )
    pcie_aspm: Literal["off", "force"] | None = Field(
        default=None,
        description=(
            "pcie_aspm= 'off' (firmware's ASPM setting stays, runtime controls go) or 'force'; "
            "or absent."
        ),
    )
    extra: tuple[Annotated[StrictStr, AfterValidator(_check_arg)], ...] = Field(
        default=(),
        description="Further arguments: key or key=value, no spaces, quotes or semicolons.",
    )


def _refs(cfg: Config) -> list[Ref]:
    return [
        (f"bootargs.{k}", getattr(cfg, k), False) for k in SET_KEYS if getattr(cfg, k) is not None
    ]


TABLE = Table(
    key="bootargs",
    model=Config,
    summary="Kernel boot arguments.",
    manual=__doc__ or "",
    position=60,
    tuner="gputuned.tuners.bootargs:BootargsTuner",
    plan_rank=60,
    refs=_refs,
)
