"""A tree's files as the kernel model reads and rewrites them, and the facts it derives from them.

The model keeps no state of its own: everything it knows is in the tree's files (plus
:data:`STATE_FILE` for what a tree cannot derive), so two processes working on one tree, or a
process started again, see the same kernel.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from gputuned.cpulist import CpuListError, format_cpulist, parse_cpulist
from gputuned.kernel.procfs import cgroup_path
from gputuned.sim import bitmap

CPU_DIR = "/sys/devices/system/cpu"
#: Remembers what a tree cannot derive (the captured effective CPU of an IRQ, see
#: :func:`gputuned.sim.devices.irq_effective`) beside the tree; deleted as soon as nothing is
#: remembered, so a reverted tree is identical.
STATE_FILE = ".gputuned-kernel-state.json"
#: The kernel has cpuset.cpus.exclusive though no cgroup shows it now (TreeFiles.has_exclusive).
EXCLUSIVE_SEEN = "/run/gputuned-sim/cpuset-exclusive"


def fail(code: int, reason: str | None = None) -> OSError:
    """The OSError the kernel returns; a ``reason`` rides in strerror for errors.translate."""
    return OSError(code, reason or os.strerror(code))


class TreeFiles:
    """The files of the tree at ``root``, by host path."""

    def __init__(self, root: Path) -> None:
        self.root = root

    # -- reading and writing ---------------------------------------------------------------

    def real(self, hpath: str) -> Path:
        return self.root.joinpath(*[p for p in hpath.split("/") if p])

    def get(self, hpath: str) -> str | None:
        try:
            return self.real(hpath).read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def put(self, hpath: str, text: str, *, create: bool = False) -> None:
        """Give an existing (or, with ``create``, new) file the text; equal content is untouched."""
        real = self.real(hpath)
        exists = real.is_file()
        if (exists or create) and not (exists and real.read_bytes() == text.encode()):
            real.write_bytes(text.encode())

    def put_whole(self, hpath: str, text: str) -> None:
        """put(), replacing the file in one step (same mode): a reader in another thread sees
        the old text or the new, never a half-written file, as with the kernel's own files.
        apply remounts in a thread while it goes on (see KernelBase.start_remount)."""
        real = self.real(hpath)
        if not real.is_file() or real.read_bytes() == text.encode():
            return
        tmp = real.with_name(f".{real.name}.gputuned-new")
        tmp.write_bytes(text.encode())
        shutil.copymode(real, tmp)
        tmp.replace(real)

    def put_cpus(self, hpath: str, cpus: frozenset[int]) -> None:
        # Rewritten only when the meaning changes, so files the model agrees with keep their bytes.
        cur = self.get(hpath)
        try:
            same = cur is not None and parse_cpulist(cur) == cpus
        except CpuListError:
            same = False
        if not same:
            self.put(hpath, format_cpulist(cpus) + "\n")

    def load_state(self) -> dict[str, dict[str, str | None]]:
        raw = self.get(f"/{STATE_FILE}")
        return dict(json.loads(raw)) if raw else {}

    def save_state(self, state: dict[str, dict[str, str | None]]) -> None:
        real = self.real(f"/{STATE_FILE}")
        if state:
            real.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        elif real.exists():
            real.unlink()

    # -- CPUs ------------------------------------------------------------------------------

    def nr_cpu_ids(self) -> int:
        for name in ("possible", "present", "online"):
            raw = (self.get(f"{CPU_DIR}/{name}") or "").strip()
            if raw:
                return max(parse_cpulist(raw)) + 1
        return 1

    def possible(self) -> frozenset[int]:
        return frozenset(range(self.nr_cpu_ids()))

    def online(self) -> frozenset[int]:
        raw = self.get(f"{CPU_DIR}/online")
        return parse_cpulist(raw) if raw is not None else self.possible()

    def parse_cpus(self, text: str, *, as_list: bool) -> frozenset[int]:
        """A written CPU list (or mask) for nr_cpu_ids bits, read and refused as the kernel
        reads and refuses it (:mod:`gputuned.sim.bitmap`, not gputuned.cpulist)."""
        shown = repr(text) if len(text) <= 60 else repr(text[:57] + "...")
        parser = bitmap.parselist if as_list else bitmap.parse
        return parser(text, self.nr_cpu_ids(), shown)

    # -- cgroups ---------------------------------------------------------------------------

    def cgroup2_mounts(self) -> list[str]:
        out = []
        for line in (self.get("/proc/mounts") or "").splitlines():
            f = line.split()
            if len(f) >= 3 and f[2] == "cgroup2":
                out.append(f[1])
        return out

    def cgroup2_mount(self, hpath: str) -> str | None:
        """The cgroup v2 mount holding ``hpath`` (longest match), None outside any."""
        hits = [m for m in self.cgroup2_mounts() if hpath == m or hpath.startswith(m + "/")]
        return max(hits, key=len) if hits else None

    def children(self, cg: str) -> list[str]:
        real = self.real(cg)
        return [
            f"{cg}/{n}"
            for n in sorted(os.listdir(real))
            if (real / n).is_dir() and not (real / n).is_symlink()
        ]

    def procs(self, cg: str) -> list[int]:
        return [int(p) for p in (self.get(f"{cg}/cgroup.procs") or "").split()]

    def cgroup_of(self, pid: int) -> str | None:
        """The cgroup v2 path of a process (its ``0::`` line), None when it has none."""
        return cgroup_path(self.get(f"/proc/{pid}/cgroup") or "")

    def has_exclusive(self, mount: str) -> bool:
        """cpuset.cpus.exclusive exists from Linux 6.7: does any cgroup of this tree show it,
        or did one before cpuset was disabled everywhere (:meth:`remember_exclusive`)?"""
        if self.real(EXCLUSIVE_SEEN).exists():
            return True
        return any("cpuset.cpus.exclusive" in files for _d, _s, files in os.walk(self.real(mount)))

    def remember_exclusive(self) -> None:
        """The kernel has cpuset.cpus.exclusive even while no cgroup shows it (cpuset disabled
        at the root): kept in the tree's run/ (outside what tests compare)."""
        marker = self.real(EXCLUSIVE_SEEN)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
