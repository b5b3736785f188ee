"""What a journal entry may ask revert to write: only the paths and kinds gputuned writes.

The journal is root's file in a root-only folder, and gputuned refuses it when others could
have written it; still, revert writes whatever its entries name, as root, so an entry is checked
against what the tuners produce before it is trusted (issue 14, finding 13). An entry that names
anything else (``/etc/passwd`` as a "sysfs" value, a "file" other than the GRUB drop-in, a
config-space write outside Device Control's payload fields, a mount that is not cgroup2) is
refused: revert leaves it alone and reports it, and it stays in the journal for a person to see.

The fields every entry has are checked here; what its kind allows, by the kind's own class
(:meth:`gputuned.settings.base.Setting.refusal`: the forms are in each module of
gputuned/settings/).
"""

from __future__ import annotations

from gputuned.settings.base import Op
from gputuned.settings.registry import settings

_COMPARES = ("text", "cpulist", "cpulist_subset", "mask", "policy", "partition", "options")


def refusal(op: Op, value: str) -> str | None:
    """Why revert must not write ``value`` through ``op`` (None: it is one of gputuned's)."""
    if not all(isinstance(v, str) for v in (op.key, op.tuner, op.target, op.kind, op.path)):
        return "a field of the wrong type"
    if ".." in op.path.split("/") or "\0" in op.path:
        return f"the path {op.path!r} climbs out with '..'"
    if op.compare not in _COMPARES:
        return f"an unknown comparison {op.compare!r}"
    setting = settings().get(op.kind)
    if setting is None:
        return f"an unknown kind {op.kind!r}"
    return setting.refusal(op, value)
