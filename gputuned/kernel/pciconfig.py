"""Pure parsing of PCI configuration space bytes.

Offsets and bit fields follow the PCI Express Base Specification (r6.0, section 7.5.3,
"PCI Express Capability Structure") and Linux ``include/uapi/linux/pci_regs.h``; field names
mirror what ``lspci -vv`` prints (DevCap, DevCtl, LnkCap, LnkCtl, LnkSta).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

# Standard capability IDs (pci_regs.h PCI_CAP_ID_*).
CAP_PM = 0x01
CAP_MSI = 0x05
CAP_EXP = 0x10
CAP_MSIX = 0x11

# Device/port types in the PCIe Capabilities register, bits 7:4 (PCI_EXP_TYPE_*).
PORT_TYPES = {
    0x0: "endpoint",
    0x1: "legacy-endpoint",
    0x4: "root-port",
    0x5: "upstream-port",
    0x6: "downstream-port",
    0x7: "pcie-to-pci-bridge",
    0x8: "pci-to-pcie-bridge",
    0x9: "rc-integrated-endpoint",
    0xA: "rc-event-collector",
}
# Types without a link (lspci's cap_express sets link = 0 for these).
_NO_LINK = {0x9, 0xA}

#: Link speed encodings of LnkCap/LnkSta bits 3:0 in GT/s (PCI_EXP_LNKCAP_SLS_*).
LINK_SPEEDS_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

ASPM_NAMES = {0: (), 1: ("L0s",), 2: ("L1",), 3: ("L0s", "L1")}

# Register offsets inside the PCIe capability.
DEVCAP, DEVCTL, DEVSTA, LNKCAP, LNKCTL, LNKSTA = 0x04, 0x08, 0x0A, 0x0C, 0x10, 0x12

#: Field names as findings name them (lspci -vv's register names, the specification's fields).
MPS_SUPPORTED = "DevCap Max_Payload_Size"
MPS_CONTROL = "DevCtl Max_Payload_Size"
MRRS_CONTROL = "DevCtl Max_Read_Request_Size"
#: The header every function has (PCI r3.0 6.1); capabilities live between it and 256 bytes.
HEADER = 64
STANDARD = 256

#: ConfigSpace.state values.
OK, NOT_RESPONDING, HEADER_ONLY, SHORT = "ok", "not responding", "header only", "short"


def payload_bytes(code: int) -> int | None:
    """MPS/MRRS encoding 0..5 -> 128..4096 bytes; ``None`` for the reserved 6 and 7 (PCIe r6.0
    7.5.3.3-4). A register that reads all-ones shows 7: a fact about the device, not a bug
    here, so it is reported as unreadable (``lspci`` prints it and goes on) rather than raised.
    """
    return 128 << code if 0 <= code <= 5 else None


def payload_code(size: int) -> int:
    """128..4096 bytes (a power of two) -> the 3-bit register encoding."""
    if size not in (128, 256, 512, 1024, 2048, 4096):
        raise ValueError(f"{size} is not a valid payload size (128, 256, ..., 4096 bytes)")
    return size.bit_length() - 8


@dataclass(frozen=True)
class PcieCap:
    """The PCI Express capability of one function, decoded from its registers."""

    offset: int
    version: int
    port_type: int
    devcap: int
    devctl: int
    lnkcap: int
    lnkctl: int
    lnksta: int

    @property
    def port_type_name(self) -> str:
        return PORT_TYPES.get(self.port_type, f"type-{self.port_type:#x}")

    @property
    def has_link(self) -> bool:
        return self.port_type not in _NO_LINK

    # DevCap / DevCtl (None: a reserved encoding, see ``unreadable``)
    @property
    def mps_supported(self) -> int | None:
        return payload_bytes(self.devcap & 0x7)

    @property
    def mps(self) -> int | None:
        return payload_bytes((self.devctl >> 5) & 0x7)

    @property
    def mrrs_code(self) -> int:
        return (self.devctl >> 12) & 0x7

    @property
    def mrrs(self) -> int | None:
        """Max Read Request Size in bytes; ``None`` for the reserved encodings 6 and 7."""
        return payload_bytes(self.mrrs_code)

    @property
    def unreadable(self) -> tuple[tuple[str, str], ...]:
        """(field, why) for each decoded field whose value is a reserved encoding."""
        codes = (
            (MPS_SUPPORTED, self.devcap & 0x7),
            (MPS_CONTROL, (self.devctl >> 5) & 0x7),
            (MRRS_CONTROL, self.mrrs_code),
        )
        return tuple(
            (name, f"encoding {code} is reserved (the register may read all-ones)")
            for name, code in codes
            if payload_bytes(code) is None
        )

    # LnkCap / LnkCtl / LnkSta
    @property
    def cap_speed_gts(self) -> float | None:
        return LINK_SPEEDS_GTS.get(self.lnkcap & 0xF) if self.has_link else None

    @property
    def cap_width(self) -> int | None:
        return (self.lnkcap >> 4) & 0x3F if self.has_link else None

    @property
    def aspm_supported(self) -> tuple[str, ...]:
        return ASPM_NAMES[(self.lnkcap >> 10) & 0x3] if self.has_link else ()

    @property
    def aspm_enabled(self) -> tuple[str, ...]:
        return ASPM_NAMES[self.lnkctl & 0x3] if self.has_link else ()

    @property
    def speed_gts(self) -> float | None:
        return LINK_SPEEDS_GTS.get(self.lnksta & 0xF) if self.has_link else None

    @property
    def width(self) -> int | None:
        return (self.lnksta >> 4) & 0x3F if self.has_link else None


@dataclass(frozen=True)
class ConfigSpace:
    """Decoded header and capability lists of one PCI function."""

    raw: bytes  # as parsed: from read_registers, only the registers it reads (zero elsewhere)
    #: OK; NOT_RESPONDING (every byte read all-ones); HEADER_ONLY (64 bytes of a space that
    #: lists capabilities: an unprivileged read); SHORT (less than the 64-byte header).
    state: str
    #: (field, why) for what could not be decoded: reserved encodings, a capability that runs
    #: past the end. The device's other fields are still good.
    unreadable: tuple[tuple[str, str], ...]
    vendor: int
    device: int
    class_code: int
    header_type: int
    caps: tuple[tuple[int, int], ...]  # (capability id, offset)
    ext_caps: tuple[tuple[int, int, int], ...]  # (extended id, version, offset)
    pcie: PcieCap | None
    msix_table_size: int | None
    msi_present: bool


def _u16(raw: bytes, off: int) -> int:
    return int(struct.unpack_from("<H", raw, off)[0])


def _u32(raw: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", raw, off)[0])


def read_registers(read: Callable[[int, int], bytes]) -> bytes:
    """The registers :func:`parse_config` decodes, read span by span, as a 256-byte image.

    ``read(offset, size)`` returns up to ``size`` bytes of config space (a sysfs ``config``
    file). Every dword read is a config cycle, and under PCIe passthrough each one traps to the
    hypervisor: 13-15 us per dword for the lent H200 (benchmarks/config_read.py), ~0.9 ms for
    its first 256 bytes; a host with switches has dozens of functions under its GPUs' root
    ports. This reads the header's first 16 bytes, the capability pointer, one dword per
    capability and the PCIe capability's registers up to LnkSta: 13 dwords for that GPU
    instead of 64. Bytes not read are zero. A config space that ends before a register this
    reads comes back as the 64-byte header alone, which parse_config reports (an unprivileged
    read ends there; a device that cuts a read short elsewhere is reported the same way rather
    than decoded from zeros).
    """
    img = bytearray(256)

    def get(off: int, size: int) -> bool:
        size = min(size, len(img) - off)
        data = read(off, size)[:size]
        img[off : off + len(data)] = data
        return len(data) == size

    if not (get(0x00, 16) and get(0x34, 4)):
        return read(0, 64)  # too short to hold a header: as it is, for parse_config to refuse
    if not img[0x06] & 0x10:  # no capability list (PCI_STATUS_CAP_LIST)
        return bytes(img)
    ptr = img[0x34] & 0xFC
    seen: set[int] = set()
    while ptr >= 0x40 and ptr not in seen:
        seen.add(ptr)
        if not get(ptr, 4):
            return bytes(img[:64])  # a 64-byte config space: no capabilities to read
        if img[ptr] == CAP_EXP and not get(ptr + DEVCAP, LNKSTA + 2 - DEVCAP):
            return bytes(img[:64])
        ptr = img[ptr + 1] & 0xFC
    return bytes(img)


def _state(raw: bytes, size: int) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Whether the read can be decoded at all, and what to tell the user when it cannot."""
    # A config read that no device answers returns all-ones; Vendor ID 0xffff is never valid
    # (drivers/pci/probe.c pci_bus_generic_read_dev_vendor_id).
    if size >= 2 and _u16(raw, 0x00) == 0xFFFF:
        why = (
            "config space reads all-ones: the device fell off the bus or is powered down "
            "(D3cold); check dmesg for AER or 'fell off the bus' messages, then reset or reseat it"
        )
        return NOT_RESPONDING, (("config space", why),)
    if size < HEADER:
        why = f"config space is {size} bytes, less than the 64-byte header: the read was cut short"
        return SHORT, (("config space", why),)
    if size < STANDARD and _u16(raw, 0x06) & 0x10:
        why = (
            "the capabilities past the header could not be read: run as root to read config "
            "space (the kernel gives other users the 64-byte header only), or the device cut "
            "the read short"
        )
        return HEADER_ONLY, (("config space", why),)
    return OK, ()


def parse_config(raw: bytes) -> ConfigSpace:
    """Decode a config space dump (64, 256 or 4096 bytes, as sysfs ``config`` returns).

    Never raises on what a device or the kernel returns: a short, all-ones or header-only read
    gives a ConfigSpace whose ``state`` says so, a field with a reserved encoding is listed in
    ``unreadable`` (and decodes as ``None``), and everything else is decoded as usual.
    """
    size = len(raw)
    state, unreadable = _state(raw, size)
    if size < HEADER:  # what was not read reads as a failed config read does: all-ones
        raw = raw + b"\xff" * (HEADER - size)
    vendor, device = _u16(raw, 0x00), _u16(raw, 0x02)
    status = _u16(raw, 0x06)
    class_code = _u32(raw, 0x08) >> 8
    header_type = raw[0x0E] & 0x7F
    caps: list[tuple[int, int]] = []
    # Capability list (PCI_STATUS_CAP_LIST); pointers are dword aligned, low 2 bits reserved.
    if status & 0x10 and size >= STANDARD and state == OK:
        ptr = raw[0x34] & 0xFC
        seen: set[int] = set()
        while ptr >= 0x40 and ptr not in seen and ptr + 1 < len(raw):
            seen.add(ptr)
            caps.append((raw[ptr], ptr))
            ptr = raw[ptr + 1] & 0xFC
    pcie = None
    msix_size = None
    for cap_id, off in caps:
        if cap_id == CAP_EXP and pcie is None and off + LNKSTA + 2 > len(raw):
            why = f"runs past the end of config space ({len(raw)} bytes); no field of it is read"
            unreadable += ((f"PCI Express capability at {off:#x}", why),)
        elif cap_id == CAP_EXP and pcie is None:
            flags = _u16(raw, off + 2)
            port_type = (flags >> 4) & 0xF
            has_link = port_type not in _NO_LINK
            pcie = PcieCap(
                offset=off,
                version=flags & 0xF,
                port_type=port_type,
                devcap=_u32(raw, off + DEVCAP),
                devctl=_u16(raw, off + DEVCTL),
                lnkcap=_u32(raw, off + LNKCAP) if has_link else 0,
                lnkctl=_u16(raw, off + LNKCTL) if has_link else 0,
                lnksta=_u16(raw, off + LNKSTA) if has_link else 0,
            )
        elif cap_id == CAP_MSIX and msix_size is None and off + 4 <= len(raw):
            msix_size = (_u16(raw, off + 2) & 0x7FF) + 1
    ext: list[tuple[int, int, int]] = []
    if pcie is not None and len(raw) >= 4096:
        off = 0x100
        seen_ext: set[int] = set()
        while off >= 0x100 and off not in seen_ext and off + 4 <= len(raw):
            seen_ext.add(off)
            hdr = _u32(raw, off)
            if hdr in (0, 0xFFFFFFFF):
                break
            ext.append((hdr & 0xFFFF, (hdr >> 16) & 0xF, off))
            off = (hdr >> 20) & 0xFFC
    if pcie is not None:
        unreadable += pcie.unreadable
    return ConfigSpace(
        raw=bytes(raw),
        state=state,
        unreadable=unreadable,
        vendor=vendor,
        device=device,
        class_code=class_code,
        header_type=header_type,
        caps=tuple(caps),
        ext_caps=tuple(ext),
        pcie=pcie,
        msix_table_size=msix_size,
        msi_present=any(c == CAP_MSI for c, _ in caps),
    )
