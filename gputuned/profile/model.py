"""A profile is a TOML file that says what gputuned should do on a host.

Each table configures one tuner and is named after it (`[irq]`, `[cpuset]`, ...); a tuner whose
table is absent does nothing. CPUs are never written as numbers in the tuner tables: they name
sets defined under `[cpusets]`, which are resolved on each host (a GPU's local CPUs, a NUMA
node, ...), so one profile fits hosts of different shapes.

Includes: `include = ["base.toml"]` loads those files first (paths relative to the including
file, beside it or below its folder: not absolute, no `..`), then this file's keys override
theirs. An entry without `.toml` and without `/` (`include = ["shared-host"]`) is a profile's
name instead, looked up like `gputunectl plan NAME`: /etc/gputuned/profiles, then the shipped
profiles (`gputunectl list` names both folders); never the including file itself, so a user profile
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

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictStr, create_model

from gputuned.profile import tables as declared
from gputuned.profile.cpusets import CpuSetSpec

if TYPE_CHECKING:
    from gputuned.profile.tables.bootargs import Config as BootargsConfig
    from gputuned.profile.tables.cpuset import Config as CpusetConfig
    from gputuned.profile.tables.daemon import Config as DaemonConfig
    from gputuned.profile.tables.irq import Config as IrqConfig
    from gputuned.profile.tables.neighbours import Config as NeighboursConfig
    from gputuned.profile.tables.pcie_aspm import Config as PcieAspmConfig
    from gputuned.profile.tables.pcie_payload import Config as PciePayloadConfig
    from gputuned.profile.tables.process import Config as ProcessConfig


class Keys(BaseModel):
    """The keys of a profile that are not tables; :class:`Profile` adds one field per table."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    #: profile/files.digest of the data it was made from (parse_profile sets it): active.json
    #: keeps it, and verify compares a profile file with it without loading the model.
    _source_digest: str | None = PrivateAttr(default=None)

    @property
    def source_digest(self) -> str | None:
        return self._source_digest

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


# The profile's fields for the tables are made from the tables' declarations
# (gputuned/profile/tables/), one per table.
_DOC = """A whole profile, after includes are merged. Made by gputuned/profile/load.py
``parse_profile`` only, which runs the checks across tables (gputuned/profile/checks.py)."""


def _fields(tables: Sequence[declared.Table]) -> dict[str, Any]:
    return {t.key: (t.annotation(), t.field()) for t in tables}


if TYPE_CHECKING:

    class Profile(Keys):
        # What mypy sees of the tables' fields, which are made from their declarations below.
        # A table added later is reached as TABLE.present(profile) and needs no line here;
        # tests/unit/test_add_a_kind.py checks that these agree with the declarations.
        pcie_aspm: PcieAspmConfig | None
        pcie_payload: PciePayloadConfig | None
        irq: IrqConfig | None
        cpuset: CpusetConfig | None
        process: tuple[ProcessConfig, ...]
        bootargs: BootargsConfig | None
        neighbours: NeighboursConfig | None
        daemon: DaemonConfig

else:
    Profile = create_model(
        "Profile", __base__=Keys, __module__=__name__, __doc__=_DOC, **_fields(declared.tables())
    )


def profile_model() -> type[Profile]:
    """The model of a profile with every table declared now: :class:`Profile`, or a subclass
    of it with the tables declared after it was made (a table registered at run time)."""
    return _extended(tuple(t for t in declared.tables() if t.key not in Profile.model_fields))


@cache
def _extended(extra: tuple[declared.Table, ...]) -> type[Profile]:
    if not extra:
        return Profile
    fields = _fields(extra)
    return create_model("Profile", __base__=Profile, __module__=__name__, **fields)
