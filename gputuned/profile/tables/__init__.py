"""The profile's tables, one module each: its model (the keys, their types, bounds and
descriptions), in the module's docstring its manual (docs/profiles.md is built from both), and
its declaration ``TABLE``: what the rest of gputuned derives from it (the profile's field, the
JSON schema, the CPU-set references it holds, the tuner that plans it and when). Models only:
what a table makes happen is planned in gputuned/tuners/, named here by module path and never
imported. docs/dev/add-a-kind.md walks through adding one.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import BaseModel, Field

#: A place a CPU set is named: (key path, set name, whether "keep" is allowed there).
Ref = tuple[str, str, bool]


def _no_refs(_value: Any) -> list[Ref]:
    return []


@dataclass(frozen=True)
class Table:
    """One profile table, declared once in its module as ``TABLE``."""

    #: The TOML key, which is also the profile's field (``irq`` for ``[irq]``).
    key: str
    #: The model of the table (of one entry, for an array of tables).
    model: type[BaseModel]
    #: One line: the profile field's description (the schema and "Top-level keys").
    summary: str
    #: The manual, usually the module's ``__doc__``: docs/profiles.md's section.
    manual: str
    #: Place in the profile, the schema and the manual (ascending).
    position: int
    #: The tuner that plans it, "module:Class" under gputuned/tuners/, and when, among the
    #: others (ascending). A tuner sees every change planned before it.
    tuner: str
    plan_rank: int
    #: The CPU-set references in a value of the table (called only when the table is there).
    refs: Callable[[Any], list[Ref]] = _no_refs
    #: ``[[key]]``: an array of tables, default empty.
    many: bool = False
    #: Present with its defaults when the profile leaves it out (``[daemon]``).
    always: bool = False

    @property
    def heading(self) -> str:
        return f"[[{self.key}]]" if self.many else f"[{self.key}]"

    def annotation(self) -> Any:
        """The profile field's type."""
        if self.many:
            return tuple[self.model, ...]  # type: ignore[name-defined]
        return self.model if self.always else self.model | None

    def field(self) -> Any:
        """The profile field's default and description."""
        if self.many:
            return Field(default=(), description=self.summary)
        if self.always:
            return Field(default_factory=self.model, description=self.summary)
        return Field(default=None, description=self.summary)

    def present(self, profile: BaseModel) -> Any:
        """The table's value in ``profile``, None when it is not there (an empty array too)."""
        value = getattr(profile, self.key)
        return value if value else None


@cache
def tables() -> Sequence[Table]:
    """Every table, found from the modules of this package, in profile order."""
    found = []
    for mod in pkgutil.iter_modules(__path__):
        table = getattr(importlib.import_module(f"{__name__}.{mod.name}"), "TABLE", None)
        if isinstance(table, Table):
            found.append(table)
    keys = [t.key for t in found]
    assert len(set(keys)) == len(keys), f"two tables share a key: {sorted(keys)}"
    return tuple(sorted(found, key=lambda t: t.position))
