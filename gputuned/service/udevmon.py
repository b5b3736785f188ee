"""PCI device events from udev (pyudev), as plain data for the daemon.

A GPU added, removed, re-bound to a driver, or "changed" (for example after a reset) may carry
new register values or IRQ numbers, so the daemon re-plans on each. Without udev (containers,
trees) there is simply no monitor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gputuned.kernel import Kernel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceEvent:
    action: str  # add, remove, change, bind, unbind
    bdf: str
    pci_class: str  # e.g. "0x030200"; "" when udev did not say


class UdevMonitor:
    def __init__(self, monitor: Any) -> None:
        self._mon = monitor

    def fileno(self) -> int:
        return int(self._mon.fileno())

    def read(self) -> list[DeviceEvent]:
        out: list[DeviceEvent] = []
        while True:
            dev = self._mon.poll(timeout=0)
            if dev is None:
                return out
            cls = dev.properties.get("PCI_CLASS", "")
            out.append(
                DeviceEvent(str(dev.action), str(dev.sys_name), f"0x{cls.lower()}" if cls else "")
            )


def open_monitor(kernel: Kernel) -> UdevMonitor | None:
    """A non-blocking monitor of the PCI subsystem, or None (no udev here, or a tree)."""
    if not kernel.udev:
        return None
    try:
        import pyudev

        ctx = pyudev.Context()
        mon = pyudev.Monitor.from_netlink(ctx, source="udev")
        mon.filter_by(subsystem="pci")
        mon.start()
    except Exception as exc:  # pyudev raises plain OSError/ImportError/DeviceNotFound...
        log.info(
            "daemon: no udev monitor (%s); GPU hotplug and resets are seen by the drift loop only",
            exc,
        )
        return None
    return UdevMonitor(mon)
