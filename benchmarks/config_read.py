"""What a PCI config-space read costs, per function, by size and interface. Read-only.

    python3 benchmarks/config_read.py [--repeat N] [--json FILE]

For every PCI function: the sysfs ``config`` file opened and read with 4, 64, 256 and 4096
bytes (a new open each time, as a plan does), 5 reads of 4 bytes on one open file, a read of
``current_link_speed``, gputuned's own read (only the registers it decodes, one open per
span, as the kernel port's ``read_bytes`` does), and the same sizes through ``/proc/bus/pci`` (which skips sysfs's
runtime-PM get/put around the read). Median microseconds of N tries each. Under PCIe
passthrough each access can trap to the hypervisor: this says whether a read costs per call
or per byte, which decides how gputuned reads config space (docs/dev/benchmarks.md). Nothing is
written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputuned.kernel.pciconfig import read_registers

DEVICES = Path("/sys/bus/pci/devices")


def timed(repeat: int, fn: Callable[..., Any], *args: Any) -> float:
    xs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        xs.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(xs), 1)


def open_close(path: Path) -> None:
    os.close(os.open(path, os.O_RDONLY))


def read_at(path: Path, size: int, offset: int = 0) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def one_open(path: Path, reads: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(reads):
            os.pread(fd, 4, 4 * i)
    finally:
        os.close(fd)


def gputuned_read(path: Path) -> None:
    read_registers(lambda off, size: read_at(path, size, off))


def proc_path(bdf: str) -> Path:
    domain, bus, devfn = bdf.split(":")
    name = f"{bus}/{devfn}"
    return Path("/proc/bus/pci") / (name if domain == "0000" else f"{domain}:{name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for dev in sorted(DEVICES.iterdir()):
        cfg = dev / "config"
        row: dict[str, object] = {
            "bdf": dev.name,
            "class": (dev / "class").read_text().strip(),
            "vendor": (dev / "vendor").read_text().strip(),
            "driver": (dev / "driver").readlink().name if (dev / "driver").exists() else None,
            "config_bytes": cfg.stat().st_size,
            "runtime_status": (dev / "power/runtime_status").read_text().strip()
            if (dev / "power/runtime_status").exists()
            else None,
            "power_state": (dev / "power_state").read_text().strip()
            if (dev / "power_state").exists()
            else None,
        }
        row["open_close_us"] = timed(args.repeat, open_close, cfg)
        for size in (4, 64, 256, 4096):
            if size <= cfg.stat().st_size:
                row[f"sysfs_{size}_us"] = timed(args.repeat, read_at, cfg, size)
        row["gputuned_registers_us"] = timed(args.repeat, gputuned_read, cfg)
        row["sysfs_5x4_one_open_us"] = timed(args.repeat, one_open, cfg, 5)
        speed = dev / "current_link_speed"
        if speed.exists():
            row["current_link_speed_us"] = timed(args.repeat, speed.read_bytes)
        proc = proc_path(dev.name)
        if proc.exists():
            for size in (4, 64, 256):
                row[f"proc_{size}_us"] = timed(args.repeat, read_at, proc, size)
            row["proc_5x4_one_open_us"] = timed(args.repeat, one_open, proc, 5)
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
