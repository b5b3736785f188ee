"""CPU and NUMA sysfs files from a topology capture (capture.py), for build_trees.py.

A capture holds the files exactly as a real kernel printed them. ``cpu_files`` returns them,
optionally with the CPUs renumbered: a bijection from the guest's CPU numbers to the ones a
tree needs, applied to every file name (``cpuN``), CPU list and CPU mask; ids (core_id,
physical_package_id, ...) and node lists are kept as they are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from gputuned.cpulist import format_cpulist, format_mask, parse_cpulist, parse_mask

HERE = Path(__file__).resolve().parent

#: Files that hold a CPU mask (drivers/base/topology.c, drivers/base/node.c print them with
#: cpumap_print_to_pagebuf(false, ...): 32-bit hex groups, the first cut to nr_cpu_ids).
MASK_FILES = {
    "cluster_cpus",
    "core_cpus",
    "core_siblings",
    "die_cpus",
    "package_cpus",
    "thread_siblings",
    "cpumap",
}
#: Files of /sys/devices/system/cpu that list CPUs (in node/ only nodeN/cpulist does).
CPU_LIST_FILES = {"online", "possible", "present", "offline", "isolated"}


def _lists_cpus(path: str, name: str) -> bool:
    if path.startswith("/sys/devices/system/cpu/"):
        return name.endswith("_list") or name in CPU_LIST_FILES
    return path.startswith("/sys/devices/system/node/node") and name == "cpulist"


def load(shape: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((HERE / f"{shape}.json").read_text())
    return data


def qemu_position(cpu: int, cores: int, threads: int) -> tuple[int, int, int]:
    """(socket, core, thread) of QEMU's vCPU ``cpu``: QEMU numbers vCPUs by APIC ID, thread
    bits lowest (hw/i386/topology.h x86_apicid_from_topo_ids), and Linux numbers CPUs in the
    order of the MADT, which QEMU writes in that same order."""
    return cpu // (cores * threads), (cpu // threads) % cores, cpu % threads


def cores_first(sockets: int, cores: int, threads: int) -> Callable[[int], int]:
    """Guest CPU -> the number it has where firmware lists every core's first thread before
    any second thread, socket by socket: thread t of core c of socket s is CPU
    t * sockets * cores + s * cores + c (siblings N and N + sockets * cores).

    That order is what Linux shows on two-socket servers, e.g. the lscpu and hwloc-ls of a
    2 x 64-core AMD host at https://hackmd.io/@hlajungo/H1PJfTJxgg: "NUMA node0 CPU(s):
    0-15,128-143", core L#0 with PUs P#16 and P#144."""

    def renumber(cpu: int) -> int:
        s, c, t = qemu_position(cpu, cores, threads)
        return t * sockets * cores + s * cores + c

    return renumber


def _renumbered(path: str, text: str, r: Callable[[int], int], nr: int) -> tuple[str, str]:
    name = path.rsplit("/", 1)[-1]
    cpu_dir = re.search(r"/cpu(\d+)/", path)
    new_path = path.replace(cpu_dir[0], f"/cpu{r(int(cpu_dir[1]))}/") if cpu_dir else path
    if name in MASK_FILES:
        # the capture's own text must be what format_mask writes, or the edit would show
        assert format_mask(parse_mask(text), nr) + "\n" == text, (path, text)
        return new_path, format_mask({r(c) for c in parse_mask(text)}, nr) + "\n"
    if _lists_cpus(path, name):
        assert format_cpulist(parse_cpulist(text)) + "\n" == text, (path, text)
        return new_path, format_cpulist({r(c) for c in parse_cpulist(text)}) + "\n"
    return new_path, text


def cpu_files(
    shape: str, renumber: Callable[[int], int] | None = None
) -> tuple[dict[str, str], dict[int, str]]:
    """The capture's files (host path -> text), renumbered if asked, and node -> cpulist."""
    cap = load(shape)
    files = cap["files"]
    assert isinstance(files, dict)
    nr = len(parse_cpulist(files["/sys/devices/system/cpu/possible"]))
    r = renumber or (lambda c: c)
    assert sorted(r(c) for c in range(nr)) == list(range(nr)), "renumbering must be a bijection"
    out = dict(_renumbered(path, text, r, nr) for path, text in files.items())
    nodes = {
        int(m[1]): text.strip()
        for path, text in out.items()
        if (m := re.fullmatch(r"/sys/devices/system/node/node(\d+)/cpulist", path))
    }
    return dict(sorted(out.items())), nodes
