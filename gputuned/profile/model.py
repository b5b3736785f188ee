"""A profile is a TOML file that says what gputuned should do on a host.

Each table configures one tuner and is named after it (`[irq]`, `[cpuset]`, ...); a tuner whose
table is absent does nothing. CPUs are never written as numbers in the tuner tables: they name
sets defined under `[cpusets]`, which are resolved on each host (a GPU's local CPUs, a NUMA
node, ...), so one profile fits hosts of different shapes.

Includes: `include = ["base.toml"]` loads those files first (paths relative to the including
file, beside it or below its folder: not absolute, no `..`), then this file's keys override
theirs. An entry without `.toml` and without `/` (`include = ["shared-host"]`) is a profile's
name instead, looked up like `gputunectl plan NAME`: /etc/gputuned/profiles, then the shipped
profiles (gputuned/store/profiledirs.py); never the including file itself, so a user profile
named like a shipped one can include it and override a few keys. Tables are merged key by key, except that a set
under `[cpusets]` is replaced whole (a set is defined by exactly one base) and arrays, including
arrays of tables such as `[[process]]`, are replaced rather than appended to. An include cannot
remove a key; override it with `"keep"` where the key allows that. Include cycles are rejected.

Checking: every problem is reported at once, with its key path (`process[1].priority`) and what
is allowed there; nothing is changed while a profile is invalid. Unknown keys are errors, so a
misspelt key cannot be silently ignored. Checks that depend on the host (does GPU 0 exist, do
two sets overlap once resolved) run when the profile is planned on that host.

`gputunectl schema` prints the JSON schema of a profile, for editors that complete TOML.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from gputuned.profile.cpusets import CpuSetSpec
from gputuned.profile.tables.bootargs import Config as BootargsConfig
from gputuned.profile.tables.cpuset import Config as CpusetConfig
from gputuned.profile.tables.daemon import Config as DaemonConfig
from gputuned.profile.tables.irq import Config as IrqConfig
from gputuned.profile.tables.neighbours import Config as NeighboursConfig
from gputuned.profile.tables.pcie_aspm import Config as PcieAspmConfig
from gputuned.profile.tables.pcie_payload import Config as PciePayloadConfig
from gputuned.profile.tables.process import Config as ProcessConfig


class Profile(BaseModel):
    """A whole profile, after includes are merged. Made by gputuned/profile/load.py
    ``parse_profile`` only, which runs the checks across tables (gputuned/profile/checks.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(min_length=1, description="Name of the profile, shown in reports.")
    description: StrictStr = Field(default="", description="What the profile is for.")
    include: tuple[StrictStr, ...] = Field(
        default=(),
        description="Profiles loaded first (paths relative to this file); this one overrides them.",
    )
    cpusets: dict[str, CpuSetSpec] = Field(
        default_factory=dict,
        description="Named CPU sets ([cpusets.<name>]); the tuner tables refer to them by name.",
    )
    pcie_aspm: PcieAspmConfig | None = Field(default=None, description="PCIe ASPM on GPU links.")
    pcie_payload: PciePayloadConfig | None = Field(
        default=None, description="PCIe MPS and MRRS on GPU paths."
    )
    irq: IrqConfig | None = Field(default=None, description="IRQ affinity.")
    cpuset: CpusetConfig | None = Field(default=None, description="cgroup v2 CPU partition.")
    process: tuple[ProcessConfig, ...] = Field(
        default=(), description="Process rules, one [[process]] table each."
    )
    bootargs: BootargsConfig | None = Field(default=None, description="Kernel boot arguments.")
    neighbours: NeighboursConfig | None = Field(
        default=None, description="CPU weight and cap of everything that is not the server."
    )
    daemon: DaemonConfig = Field(
        default_factory=DaemonConfig, description="How the gputuned service keeps the profile."
    )
