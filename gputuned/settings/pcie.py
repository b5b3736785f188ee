"""A field of a PCI function's config-space register: MPS or MRRS in PCIe Device Control.

The op's ``data`` names the register (``offset`` of the 16-bit register in config space) and the
field (``mask`` and ``shift``); the value is the field's 3-bit code. A write is a
read-modify-write of that one register, touching only the field's bits, and nothing is written
when the register already holds them.
"""

from __future__ import annotations

import re
import struct
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.settings.base import Op, ReadBackMismatch, Setting
from gputuned.settings.sysfs import PCI_DEVICE

if TYPE_CHECKING:
    from gputuned.changes import Change
    from gputuned.kernel import Kernel

#: DevCtl MPS and MRRS (mask -> shift; tuners/pcie_payload.py).
_FIELDS = {0x00E0: 5, 0x7000: 12}


class PcieField(Setting):
    kind = change_kind = "pcie"
    writes_path = True
    what = "a field of a PCI function's Device Control register (MPS, MRRS)"

    def ops(self, ch: Change) -> list[Op]:
        value = str(ch.data["value"])  # wanted reads "512" for people; the op's value is a code
        return [Op(ch.key, ch.tuner, ch.target, self.kind, ch.path, value, data=dict(ch.data))]

    def read(self, kernel: Kernel, op: Op) -> str:
        reg = _register(kernel, op)
        return str((reg & op.data["mask"]) >> op.data["shift"])

    def write(self, kernel: Kernel, op: Op, value: str) -> None:
        off, mask, shift = op.data["offset"], op.data["mask"], op.data["shift"]
        reg = _register(kernel, op)
        new = (reg & ~mask) | ((int(value) << shift) & mask)
        if new != reg:
            kernel.write_bytes(op.path, struct.pack("<H", new), offset=off)

    def not_possible(self, op: Op, exc: errors.GputunedError) -> str | None:
        if isinstance(exc, ReadBackMismatch):
            return f"the device keeps this register field read-only: {exc}"
        return None

    def refusal(self, op: Op, value: str) -> str | None:
        if not re.fullmatch(rf"{PCI_DEVICE}/config", op.path):
            return f"{op.path!r} is no PCI function's config space"
        d = op.data
        off, mask, shift = d.get("offset"), d.get("mask"), d.get("shift")
        if type(off) is not int or not 0x48 <= off <= 0xFE or off % 2:
            return f"config space offset {off!r} is not a Device Control register"
        if mask not in _FIELDS or _FIELDS[mask] != shift:
            return f"mask {mask!r} and shift {shift!r} are not the MPS or MRRS field"
        return None if value.isdigit() and int(value) <= 5 else f"{value!r} is not a payload code"


def _register(kernel: Kernel, op: Op) -> int:
    reg = int(struct.unpack("<H", kernel.read_bytes(op.path, op.data["offset"], 2))[0])
    if reg == 0xFFFF:
        # No function answered the read: a config read then returns all-ones (drivers/pci/
        # access.c), which DevCtl never holds (MPS and MRRS code 7 are reserved). A field
        # written into it would set every other control bit, Initiate Function Level Reset
        # (bit 15) among them, and 7 journaled as the original could never be put back.
        raise errors.TargetGone(
            f"{op.target}: config space reads all-ones: the device is not responding (fell "
            "off the bus or powered down); nothing was written to it",
            path=op.path,
        )
    return reg
