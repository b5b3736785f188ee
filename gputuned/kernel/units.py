"""systemd's runtime unit properties: what ``systemctl show`` reports and ``systemctl
set-property --runtime`` sets, in the form the unit file takes (``CPUQuota=400%``).

Where systemd is PID 1 it owns the cgroups of its units: a value written into a slice's
``cpu.max`` behind its back is one systemd does not know, reports wrongly in ``systemctl
status`` and writes over at its next ``daemon-reload``. Setting the unit's property instead
makes systemd write the cgroup file itself and keeps both views in agreement (systemd.resource-
control(5): CPUWeight=, CPUQuota=). ``--runtime`` keeps the change in
/run/systemd/system.control, so it ends with the boot, like every other runtime setting.

:func:`show_form` turns ``systemctl show``'s form (``CPUQuotaPerSecUSec=4s``,
``CPUWeight=[not set]``) into the assignment form, so that writing back what was read puts the
same value in place: "" (an empty assignment) is systemd's "reset to the default".
"""

from __future__ import annotations

import re

from gputuned import errors

#: sd_booted(3): PID 1 is systemd exactly when this directory exists.
SYSTEMD_RUNTIME = "/run/systemd/system"
#: The properties gputuned sets, with the name ``systemctl show`` reports each under.
SHOWN_AS = {"CPUQuota": "CPUQuotaPerSecUSec", "CPUWeight": "CPUWeight"}
#: A unit name as systemd makes them for the cgroups of its slices, services and scopes
#: (systemd.unit(5): escaped names use only these characters).
UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,250}\.(slice|service|scope)")
#: Where --runtime puts the drop-in of one property (src/core/dbus-unit.c unit_write_setting:
#: "50-<Property>.conf" in the unit's runtime control folder).
CONTROL_DIR = "/run/systemd/system.control"

_SPAN = re.compile(r"([0-9.]+)\s*(us|ms|s|min|h)")
_USEC = {"us": 1, "ms": 1_000, "s": 1_000_000, "min": 60_000_000, "h": 3_600_000_000}
#: CGROUP_WEIGHT_INVALID, printed as a number by systemd before v252.
_UNSET_WEIGHT = ("[not set]", "18446744073709551615", "")


def check_property(name: str, value: str) -> None:
    """Refuse anything but the two properties gputuned sets, with values in their form."""
    if name not in SHOWN_AS:
        raise errors.InvalidValue(f"{name}= is not a unit property gputuned sets", path=name)
    ok = value == "" or (
        re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,2})?%", value)
        if name == "CPUQuota"
        else re.fullmatch(r"[0-9]{1,5}", value) and 1 <= int(value) <= 10000
    )
    if not ok:
        raise errors.InvalidValue(f"{name}={value[:40]!r} is not a value of it", path=name)


def show_form(name: str, shown: str) -> str:
    """``systemctl show``'s value of ``SHOWN_AS[name]`` as an assignment of ``name``."""
    shown = shown.strip()
    if name == "CPUWeight":
        return "" if shown in _UNSET_WEIGHT else shown
    if shown in ("infinity", ""):
        return ""
    usec = 0.0
    rest = _SPAN.sub("", shown).strip()
    if rest:
        raise errors.HostError(f"systemctl show: {shown!r} is not a time span gputuned reads")
    for number, unit in _SPAN.findall(shown):
        usec += float(number) * _USEC[unit]
    # CPU time per second of wall time, as a percentage of one CPU.
    percent = usec / 10_000
    return f"{percent:.0f}%" if abs(percent - round(percent)) < 0.005 else f"{percent:.2f}%"


#: The cgroup file systemd writes each property to (systemd.resource-control(5)).
CGROUP_FILE = {"CPUQuota": "cpu.max", "CPUWeight": "cpu.weight"}


def file_holds(name: str, value: str, text: str | None) -> bool:
    """Does cgroup file text ``text`` show property ``name`` = ``value`` as systemd writes it?
    (CPUQuota=400% is cpu.max "400000 100000", or the same share of another period;
    CPUQuota= is "max"; CPUWeight= unset is the kernel's default weight, 100.) Read back from
    the file, not through systemctl: a drift check every few seconds must not start a process
    per unit."""
    if text is None:
        return False
    words = text.split()
    if name == "CPUWeight":
        return words == [value or "100"]
    if len(words) != 2 or not words[1].isdigit() or int(words[1]) <= 0:
        return False
    if words[0] == "max" or not value:
        return words[0] == "max" and not value
    if not words[0].isdigit():
        return False
    return abs(int(words[0]) / int(words[1]) * 100 - float(value.rstrip("%"))) < 0.01


def file_form(name: str, text: str | None) -> str:
    """The property's value as cgroup file text ``text`` shows it (for people reading a plan)."""
    if text is None:
        return "(cpu controller off)"
    words = text.split()
    if name == "CPUWeight" or len(words) != 2 or words[0] == "max":
        return "(default)" if words in (["max", "100000"], ["100"]) else text.strip()
    try:
        return cpu_quota(int(words[0]) / int(words[1]))
    except (ValueError, ZeroDivisionError):
        return text.strip()


def cpu_quota(cpus: float) -> str:
    """``cpus`` CPUs' worth of time as CPUQuota= takes it (4 -> "400%")."""
    percent = cpus * 100
    return f"{percent:.0f}%" if abs(percent - round(percent)) < 0.005 else f"{percent:.2f}%"


def unit_of(cgroup: str) -> str | None:
    """The unit whose cgroup ``cgroup`` is (a path under the cgroup v2 mount: its last name,
    for systemd names a unit's cgroup after the unit), or None for a cgroup no unit makes."""
    name = cgroup.rstrip("/").rsplit("/", 1)[-1]
    return name if UNIT_NAME.fullmatch(name) else None
