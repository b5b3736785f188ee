#!/usr/bin/env python3
"""Capture CPU and NUMA topology files from a real kernel, for the trees build_trees.py makes.

    flock /tmp/gputuned-live.lock .venv/bin/python tests/data/topology/capture.py SHAPE

Boots the e2e lane's cached Debian 13 guest image (tests/e2e/vm/image.py; it is not built
here: run the QEMU lane once if none is cached) under QEMU/TCG with the CPU topology SHAPE
names, and writes ``tests/data/topology/SHAPE.json``: every file of
``/sys/devices/system/cpu/cpu*/topology/`` and the CPU and node lists under
``/sys/devices/system/{cpu,node}`` as the guest's kernel printed them, with the QEMU
arguments, the kernel version and the date. Nothing in those files is edited here; where a tree
needs another CPU numbering, build_trees.py renumbers them and says why.

SHAPE is ``<sockets>s<cores>c<threads>t``: one NUMA node per socket (``-numa cpu`` by
socket-id), memory split evenly between the nodes. QEMU numbers vCPUs by APIC ID, so Linux
sees a core's threads next to each other (siblings 2k and 2k+1).
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from tests.e2e.vm import image as vm_image  # noqa: E402
from tests.e2e.vm.machine import Machine  # noqa: E402

MEM_MB_PER_NODE = 512

# The files read in the guest: each CPU's topology directory whole, and the lists the kernel
# keeps of CPUs and nodes (drivers/base/cpu.c, drivers/base/node.c). Per-node files that are
# statistics (meminfo, vmstat, numastat) or write-only (compact, reclaim) are left out.
GUEST_SCRIPT = r"""
set -e
for f in /sys/devices/system/cpu/online /sys/devices/system/cpu/possible \
         /sys/devices/system/cpu/present /sys/devices/system/cpu/offline \
         /sys/devices/system/cpu/isolated /sys/devices/system/cpu/kernel_max \
         /sys/devices/system/cpu/cpu*/topology/* \
         /sys/devices/system/node/online /sys/devices/system/node/possible \
         /sys/devices/system/node/has_cpu /sys/devices/system/node/has_memory \
         /sys/devices/system/node/has_normal_memory \
         /sys/devices/system/node/node*/cpulist /sys/devices/system/node/node*/cpumap \
         /sys/devices/system/node/node*/distance; do
    [ -f "$f" ] || continue
    printf '=== %s\n' "$f"
    cat "$f"
done
printf '=== uname\n'
uname -r
"""


def parse_shape(shape: str) -> tuple[int, int, int]:
    m = re.fullmatch(r"(\d+)s(\d+)c(\d+)t", shape)
    if not m:
        sys.exit(f"capture: {shape!r} is not a shape such as 2s16c2t (sockets, cores, threads)")
    return int(m[1]), int(m[2]), int(m[3])


class TopologyMachine(Machine):
    """The lane's machine with the CPU topology and NUMA nodes of one shape."""

    sockets: int = 1
    cores: int = 1
    threads: int = 1

    def argv(self, append: str) -> list[str]:
        args = super().argv(append)
        i = args.index("-smp")
        cpus = self.sockets * self.cores * self.threads
        args[i + 1] = f"{cpus},sockets={self.sockets},cores={self.cores},threads={self.threads}"
        args[args.index("-m") + 1] = str(MEM_MB_PER_NODE * self.sockets)
        for s in range(self.sockets):
            args += [
                "-object", f"memory-backend-ram,id=mem{s},size={MEM_MB_PER_NODE}M",
                "-numa", f"node,nodeid={s},memdev=mem{s}",
                "-numa", f"cpu,node-id={s},socket-id={s}",
            ]  # fmt: skip
        return args


def cached_image() -> vm_image.Image:
    """The newest complete image in the lane's cache (any key: only its kernel matters here)."""
    done = sorted(
        (d for d in vm_image.CACHE.iterdir() if (d / vm_image.COMPLETE).is_file()),
        key=lambda d: (d / vm_image.COMPLETE).stat().st_mtime,
    )
    if not done:
        sys.exit(f"capture: no guest image in {vm_image.CACHE}; run tests/e2e/test_vm.py once")
    meta = json.loads((done[-1] / vm_image.COMPLETE).read_text())
    return vm_image.Image(done[-1], meta)


def parse_dump(text: str) -> dict[str, str]:
    files: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines(keepends=True):
        if line.startswith("=== "):
            current = line[4:].rstrip("\n")
            files[current] = ""
        elif current is not None:
            files[current] += line
    return files


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    shape = sys.argv[1]
    sockets, cores, threads = parse_shape(shape)
    img = cached_image()
    runs = vm_image.CACHE / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="run-topology-", dir=runs))
    m = TopologyMachine(img, workdir)
    m.sockets, m.cores, m.threads = sockets, cores, threads
    m.numa = False  # its own nodes, one per socket (argv)
    m.create_disks()
    try:
        boot = m.boot(timeout=1500)
        res = m.sh(GUEST_SCRIPT, timeout=600)
        qemu = m.argv(boot.append)
    finally:
        m.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    files = parse_dump(res.out)
    uname = files.pop("uname").strip()
    out = {
        "shape": shape,
        "source": (
            f"read in a QEMU {qemu[0]} guest (-machine q35 -accel tcg -cpu max) booted from the "
            f"gputuned e2e lane's Debian 13 image {img.dir.name} (kernel {uname}) by "
            "tests/data/topology/capture.py; file contents exactly as the guest's kernel "
            "printed them"
        ),
        "captured": datetime.date.today().isoformat(),
        "kernel": uname,
        "qemu_topology": [a for a in qemu if a.startswith(("memory-backend", "node,", "cpu,"))]
        + [qemu[qemu.index("-smp") + 1]],
        "boot_s": round(boot.qemu_to_running_s, 1),
        "files": dict(sorted(files.items())),
    }
    dest = HERE / f"{shape}.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{dest.relative_to(REPO)}: {len(files)} files, kernel {uname}, ")
    print(f"boot to running {boot.qemu_to_running_s:.0f} s")


if __name__ == "__main__":
    main()
