"""What the e2e guest's kernel says, as one JSON object (run by the test with the guest's python3).

Read straight from /proc, /sys and the cgroup files, not through gputuned, so the test checks
gputuned's work against the kernel's own account of it.
"""

import glob
import json
import os
import struct
from typing import Any

CG = "/sys/fs/cgroup"
PART = f"{CG}/gputuned.inference"
JOURNAL = "/run/gputuned/journal.jsonl"


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpus(text: str | None) -> list[int]:
    out: set[int] = set()
    for part in (text or "").split(","):
        if "-" in part:
            a, b = part.split("-")
            out |= set(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return sorted(out)


def irqs() -> dict[int, dict[str, Any]]:
    names: dict[int, str] = {}
    for line in (read("/proc/interrupts") or "").splitlines()[1:]:
        head, _, rest = line.partition(":")
        if head.strip().isdigit():
            names[int(head)] = rest.split()[-1] if rest.split() else ""
    out: dict[int, dict[str, Any]] = {}
    for d in glob.glob("/proc/irq/[0-9]*"):
        n = int(os.path.basename(d))
        out[n] = {
            "affinity": cpus(read(f"{d}/smp_affinity_list")),
            "name": names.get(n, ""),
            # Listed in /proc/interrupts: requested by a driver (others never fire).
            "in_use": n in names,
        }
    return out


def pcie(bdf: str) -> dict[str, Any] | None:
    """DevCtl and LnkCtl of the PCIe capability, from the config space as sysfs gives it."""
    try:
        with open(f"/sys/bus/pci/devices/{bdf}/config", "rb") as f:
            raw = f.read(256)
    except OSError:
        return None
    msi = f"/sys/bus/pci/devices/{bdf}/msi_irqs"
    vectors = sorted(int(n) for n in os.listdir(msi)) if os.path.isdir(msi) else []
    vendor, device = struct.unpack_from("<HH", raw, 0)
    out: dict[str, Any] = {
        "numa_node": read(f"/sys/bus/pci/devices/{bdf}/numa_node"),
        "local_cpus": cpus(read(f"/sys/bus/pci/devices/{bdf}/local_cpulist")),
        "vendor": f"0x{vendor:04x}",
        "device": f"0x{device:04x}",
        "class": f"0x{struct.unpack_from('<I', raw, 8)[0] >> 8:06x}",
        # Vectors the driver requested (allocated ones without /proc/irq/N are not yet in use).
        "msi_irqs": [n for n in vectors if os.path.isdir(f"/proc/irq/{n}")],
    }
    ptr = raw[0x34] & 0xFC if len(raw) >= 256 and raw[6] & 0x10 else 0
    seen = set()
    while ptr >= 0x40 and ptr not in seen:
        seen.add(ptr)
        if raw[ptr] == 0x10:
            out["devctl"] = struct.unpack_from("<H", raw, ptr + 8)[0]
            out["lnkctl"] = struct.unpack_from("<H", raw, ptr + 0x10)[0]
            break
        ptr = raw[ptr + 1] & 0xFC
    return out


def tasks(pid: int) -> list[dict[str, Any]]:
    out = []
    for t in sorted(glob.glob(f"/proc/{pid}/task/*")):
        tid = int(os.path.basename(t))
        try:
            nice = os.getpriority(os.PRIO_PROCESS, tid)
            aff = sorted(os.sched_getaffinity(tid))
        except OSError:
            continue
        out.append(
            {
                "tid": tid,
                "comm": read(f"{t}/comm"),
                "nice": nice,
                "affinity": aff,
                "cgroup": (read(f"{t}/cgroup") or "")[3:],
                "policy": os.sched_getscheduler(tid),
            }
        )
    return out


def workload() -> dict[str, Any] | None:
    for d in glob.glob("/proc/[0-9]*"):
        cmd = (read(f"{d}/cmdline") or "").replace("\0", " ")
        if "gputuned-vm/workload.py" in cmd and "probe.py" not in cmd:
            pid = int(os.path.basename(d))
            return {"pid": pid, "tasks": tasks(pid)}
    return None


def tree() -> dict[str, Any] | None:
    """The process tree of gputuned-vm-tree.service (tree.py), by role: its tasks."""
    text = read("/run/gputuned-vm-tree.json")
    if not text:
        return None
    return {role: {"pid": pid, "tasks": tasks(pid)} for role, pid in json.loads(text).items()}


def container_tree() -> dict[str, Any] | None:
    """tree.py in the podman container: its roles' PIDs as the container sees them
    (/run/gputuned-vm-ct/tree.json, a folder bound into it), each with its PID here (the one
    process whose NSpid: line ends with it in the one nested PID namespace of the guest)."""
    text = read("/run/gputuned-vm-ct/tree.json")
    if not text:
        return None
    here: dict[int, int] = {}
    for d in glob.glob("/proc/[0-9]*"):
        ns = [
            ln.split()[1:]
            for ln in (read(f"{d}/status") or "").splitlines()
            if ln.startswith("NSpid:")
        ]
        if ns and len(ns[0]) == 2:
            here[int(ns[0][1])] = int(ns[0][0])
    out = {}
    for role, inner in json.loads(text).items():
        if inner in here:
            out[role] = {"pid": here[inner], "tasks": tasks(here[inner])}
    return out


def numa_tree() -> dict[str, Any] | None:
    """The tree of gputuned-vm-numa.service (numa_tree.py), by role: its tasks."""
    text = read("/run/gputuned-vm-numa.json")
    if not text:
        return None
    return {role: {"pid": pid, "tasks": tasks(pid)} for role, pid in json.loads(text).items()}


def selfbind() -> dict[str, Any] | None:
    """The self-binding stand-in (selfbind.py): its own count of resets, and its tasks."""
    text = read("/run/gputuned-vm-selfbind.json")
    if not text:
        return None
    state: dict[str, Any] = json.loads(text)
    return {**state, "tasks": tasks(int(state["pid"]))}


def gputuned_cgroups() -> dict[str, Any]:
    """Every cgroup gputuned may make at the top (gputuned.inference*): partition state,
    effective CPUs, processes."""
    out = {}
    for d in sorted(glob.glob(f"{PART}*")):
        out[os.path.basename(d)] = {
            "partition": read(f"{d}/cpuset.cpus.partition"),
            "effective": cpus(read(f"{d}/cpuset.cpus.effective")),
            "procs": [int(p) for p in (read(f"{d}/cgroup.procs") or "").split()],
        }
    return out


def nvidia_nodes() -> dict[str, list[int]]:
    """/dev/nvidia* character devices: [major, minor]."""
    out = {}
    for p in sorted(glob.glob("/dev/nvidia*")):
        st = os.stat(p)
        out[p] = [os.major(st.st_rdev), os.minor(st.st_rdev)]
    return out


def partition_procs() -> list[int] | None:
    """Processes in gputuned's cgroup and below it (None when there is no such cgroup)."""
    if not os.path.isdir(PART):
        return None
    out = []
    for d, _dirs, files in os.walk(PART):
        if "cgroup.procs" in files:
            out += [int(p) for p in (read(f"{d}/cgroup.procs") or "").split()]
    return out


def journal() -> dict[str, Any]:
    live: dict[str, Any] = {}
    for line in (read(JOURNAL) or "").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("op") == "save":
            e = rec["entry"]
            live.setdefault(e.get("key"), e)
        elif rec.get("op") == "drop":
            live.pop(rec.get("key"), None)
    return {"exists": os.path.exists(JOURNAL), "entries": list(live.values())}


print(
    json.dumps(
        {
            "kernel": os.uname().release,
            "cmdline": read("/proc/cmdline"),
            "aspm_policy": read("/sys/module/pcie_aspm/parameters/policy"),
            "partition": {
                f: read(f"{PART}/{f}")
                for f in (
                    "cpuset.cpus",
                    "cpuset.cpus.exclusive",
                    "cpuset.cpus.effective",
                    "cpuset.cpus.partition",
                )
            }
            if os.path.isdir(PART)
            else None,
            "root_isolated": read(f"{CG}/cpuset.cpus.isolated"),
            "system_slice_effective": read(f"{CG}/system.slice/cpuset.cpus.effective"),
            "nohz_full": read("/sys/devices/system/cpu/nohz_full"),
            "default_smp_affinity": read("/proc/irq/default_smp_affinity"),
            "irqs": irqs(),
            "pcie": {b: pcie(b) for b in sorted(os.listdir("/sys/bus/pci/devices"))},
            "workload": workload(),
            "tree": tree(),
            "container_tree": container_tree(),
            "numa_tree": numa_tree(),
            "selfbind": selfbind(),
            "gputuned_cgroups": gputuned_cgroups(),
            "nvidia_nodes": nvidia_nodes(),
            "nodes": {
                os.path.basename(d)[4:]: cpus(read(f"{d}/cpulist"))
                for d in glob.glob("/sys/devices/system/node/node[0-9]*")
            },
            "partition_procs": partition_procs(),
            "journal": journal(),
        }
    )
)
