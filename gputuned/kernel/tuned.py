"""TuneD's active profile, read from its files: what in it places CPUs or IRQs (issue 19, item 5).

TuneD (github.com/redhat-performance/tuned) records the profile ``tuned-adm profile`` chose in
``/etc/tuned/active_profile`` (``consts.ACTIVE_PROFILE_FILE``; several names, space-separated,
are merged in order). Each profile is a folder with a ``tuned.conf``: under ``/etc/tuned`` (the
user's, which win) or ``/usr/lib/tuned`` (``consts.LOAD_DIRECTORIES``), or their ``profiles/``
sub-folders in TuneD 2.24 and later. ``[main] include=`` names the profiles it builds on.

What overlaps with gputuned (docs/coexistence.md has the table and its sources):

- ``[scheduler] isolated_cores`` (plugin_scheduler.py) moves every process and thread off those
  CPUs, and new ones as they start; ``default_irq_smp_affinity`` and ``irq_process`` move IRQs;
  ``group.NAME=`` rules set processes' affinity;
- ``[irqbalance] banned_cpus`` (plugin_irqbalance.py) rewrites irqbalance's banned CPUs and
  restarts it;
- ``[systemd] cpu_affinity`` sets every service's CPUs (systemd's CPUAffinity=);
- ``[bootloader]`` kernel arguments ``isolcpus``, ``nohz_full``, ``rcu_nocbs``, ``irqaffinity``;
- ``[sysfs]`` writes under ``/proc/irq``.

The files are root's, but parsed as hostile all the same: lines are bounded, includes too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gputuned import errors
from gputuned.kernel import Kernel

ACTIVE_PROFILE = "/etc/tuned/active_profile"
#: Where a profile NAME's folder is looked for, first match wins (the user's before the
#: distribution's, TuneD 2.24's profiles/ sub-folders before the older layout).
PROFILE_DIRS = ("/etc/tuned/profiles", "/etc/tuned", "/usr/lib/tuned/profiles", "/usr/lib/tuned")
_MAX_INCLUDES = 16
_MAX_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")
_BOOT_ARGS = ("isolcpus=", "nohz_full=", "rcu_nocbs=", "irqaffinity=")


@dataclass(frozen=True)
class TunedProfile:
    """The active TuneD profile: its names, what in it touches CPUs or IRQs, and which of its
    profiles (or includes) could not be found."""

    names: tuple[str, ...]
    touches: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    files: tuple[str, ...] = field(default=(), compare=False)


def read_active(kernel: Kernel) -> TunedProfile | None:
    """The active TuneD profile, or None when TuneD has none here (not installed, or off)."""
    try:
        text = kernel.read_optional(ACTIVE_PROFILE)
    except errors.HostError:
        return None  # unreadable: said as if there were none; status and plan are advisory
    names = tuple(n for n in (text or "").split() if _NAME.fullmatch(n))[:_MAX_INCLUDES]
    if not names:
        return None
    touches: list[str] = []
    missing: list[str] = []
    files: list[str] = []
    todo, seen = list(names), set[str]()
    while todo and len(seen) < _MAX_INCLUDES:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        conf = _find(kernel, name)
        if conf is None:
            missing.append(name)
            continue
        files.append(conf)
        sections = parse_conf(_read(kernel, conf))
        touches += [t for t in overlaps(sections) if t not in touches]
        todo += [i for i in _includes(sections) if i not in seen]
    return TunedProfile(names, tuple(touches), tuple(missing), tuple(files))


def _find(kernel: Kernel, name: str) -> str | None:
    for d in PROFILE_DIRS:
        conf = f"{d}/{name}/tuned.conf"
        if kernel.exists(conf):
            return conf
    return None


def _read(kernel: Kernel, hpath: str) -> str:
    try:
        return kernel.read_bytes(hpath, 0, _MAX_BYTES).decode(errors="replace")
    except errors.HostError:
        return ""


def parse_conf(text: str) -> dict[str, dict[str, str]]:
    """A tuned.conf as {section: {key: value}}: configobj's syntax as TuneD uses it (``key =
    value``, ``#`` comments, a later key replacing an earlier one)."""
    out: dict[str, dict[str, str]] = {}
    section: dict[str, str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = out.setdefault(line[1:-1].strip().lower(), {})
        elif section is not None and "=" in line:
            key, _, value = line.partition("=")
            section[key.strip().lower()] = value.strip()
    return out


def _includes(sections: dict[str, dict[str, str]]) -> list[str]:
    """``[main] include=a, b``: profile names (a ``${...}`` or a path is not followed)."""
    value = sections.get("main", {}).get("include", "")
    return [n for n in re.split(r"[,\s]+", value) if _NAME.fullmatch(n)]


def overlaps(sections: dict[str, dict[str, str]]) -> list[str]:
    """What in one tuned.conf places CPUs or IRQs, as ``[section] key`` for the messages."""
    out = []
    sched = sections.get("scheduler", {})
    for key in ("isolated_cores", "default_irq_smp_affinity", "irq_process"):
        if key in sched and not (key != "isolated_cores" and _off(sched[key])):
            out.append(f"[scheduler] {key}")
    if any(k.startswith("group.") for k in sched):
        out.append("[scheduler] group.*")
    if "irqbalance" in sections:
        out.append("[irqbalance] banned_cpus")
    if "cpu_affinity" in sections.get("systemd", {}):
        out.append("[systemd] cpu_affinity")
    args = " ".join(sections.get("bootloader", {}).values())
    out += [f"[bootloader] {a[:-1]}" for a in _BOOT_ARGS if a in args]
    if any(k.startswith("/proc/irq") for k in sections.get("sysfs", {})):
        out.append("[sysfs] /proc/irq")
    return out


def _off(value: str) -> bool:
    return value.strip().lower() in ("false", "0", "no", "off", "ignore", "n")
