"""The simulated backend of the kernel port: a host tree under a folder (``--root DIR``).

A tree is what ``gputunectl capture`` copies from a machine (docs/dev/trees.md), or what
tests/data/build_trees.py builds. Reads are plain file reads under the root. Writes, ``mkdir``
and ``rmdir`` go through the kernel model (:mod:`gputuned.sim.model`), thread operations edit
the tree's ``/proc`` (:mod:`gputuned.sim.tasks`), and a remount rewrites its mount tables
(:mod:`gputuned.sim.mounts`): a tree reads back as the kernel would show it, and writing the
old value back leaves it byte-identical.

``gputuned-tree.json`` at the top of a tree may list ``write_errors`` (path -> errno name):
the errors the real kernel gave when the tree was captured, replayed here so that a tree
refuses what its host refused (for example EPERM on the ASPM policy where firmware owns
ASPM), and ``nvml``: what NVML said at capture.
"""

from __future__ import annotations

import errno as E
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputuned import errors
from gputuned.kernel import mounts
from gputuned.kernel.base import KernelBase, translating
from gputuned.kernel.oserrors import translate
from gputuned.kernel.port import TREE_META
from gputuned.kernel.systemd import ALLOWED_CPUS, dropin
from gputuned.kernel.tasks import where
from gputuned.sim import tasks, unitcpu, units
from gputuned.sim.model import TreeModel

_ERRNO_NAMES = {name: getattr(E, name) for name in dir(E) if name.startswith("E")}


class SimKernel(KernelBase):
    """The tree at ``root``, served as its kernel would serve it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.model = TreeModel(self.root)
        #: The tree's gputuned-tree.json ({} when it has none).
        self.meta: dict[str, Any] = {}
        meta_path = self.root / TREE_META
        if meta_path.is_file():
            self.meta = json.loads(meta_path.read_text())
        written = self.meta.get("write_errors", {})
        self.recorded_refusals = {
            str(p): _ERRNO_NAMES[str(name)] for p, name in dict(written).items()
        }
        nvml = self.meta.get("nvml")
        self.recorded_nvml = nvml if isinstance(nvml, list) else None

    # -- files ----------------------------------------------------------------------------

    def write_bytes(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        self._refuse_recorded(hpath)
        with translating("write", hpath):
            self.model.write(self._writable(hpath), data, offset)

    def mkdir(self, hpath: str) -> None:
        with translating("mkdir", hpath):
            self.model.mkdir(self._writable(hpath))

    def rmdir(self, hpath: str) -> None:
        with translating("rmdir", hpath):
            self.model.rmdir(self._writable(hpath))

    def _writable(self, hpath: str) -> str:
        """``hpath`` resolved, unless a mount of the tree's mountinfo that refuses writes
        holds it: EROFS, as the kernel answers before any file's own handler
        (fs/open.c do_dentry_open(), fs/namei.c filename_create(): mnt_want_write())."""
        real = self.resolve(hpath)
        info = mounts.parse_table(self.model.get(mounts.MOUNTINFO) or "")
        held = mounts.covering(info, real)
        if held is not None and held.refuses_writes:
            raise OSError(E.EROFS, f"{held.point} is mounted read-only")
        return real

    # -- threads --------------------------------------------------------------------------

    def thread_group(self, tid: int) -> int:
        try:
            return super().thread_group(tid)
        except errors.TargetGone:
            owner = tasks.thread_owner(self.model, tid)
            if owner is None:
                raise
            return owner

    def set_nice(self, tid: int, nice: int) -> None:
        pid = self._thread_op(tid, "nice")
        tasks.set_nice(self.model, pid, tid, nice)

    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
        pid = self._thread_op(tid, "affinity")
        tasks.set_affinity(self.model, pid, tid, cpus)

    def char_device(self, hpath: str) -> tuple[int, int] | None:
        """A tree holds no device nodes: a descriptor is a link whose target the tree meta's
        ``char_devices`` maps to (major, minor)."""
        try:
            target = self.readlink(hpath)
        except errors.HostError:
            return None
        known = self.meta.get("char_devices")
        if not isinstance(known, dict):
            return None
        num = known.get(target)
        if isinstance(num, list) and len(num) == 2 and all(isinstance(n, int) for n in num):
            return num[0], num[1]
        return None

    def set_scheduler(self, tid: int, policy: str, priority: int) -> None:
        pid = self._thread_op(tid, "scheduler")
        tasks.set_scheduler(self.model, pid, tid, policy, priority)

    def user_id(self, name: str) -> int | None:
        """A tree has only its /etc/passwd (passwd(5): name:password:UID:GID:...)."""
        text = self.read_optional("/etc/passwd") or ""
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) >= 3 and fields[0] == name and fields[2].isdigit():
                return int(fields[2])
        return None

    # -- systemd's units (a tree with /run/systemd/system): AllowedCPUs in sim/units.py,
    # CPUQuota and CPUWeight in sim/unitcpu.py ---------------------------------------------

    def unit_property(self, unit: str, name: str) -> str | None:
        if name == ALLOWED_CPUS:
            return units.show(self.model, unit, name)
        if name == "Delegate":
            return units.delegate(self.model, unit)
        with translating("read", unit):
            return unitcpu.read(self.model, unit, name)

    def set_unit_property(self, unit: str, name: str, value: str) -> None:
        self._refuse_recorded(f"{unit}:{name}")
        if name == ALLOWED_CPUS:
            with translating("set-property", dropin(unit, name)):
                units.set_property(self.model, unit, name, value)
            return
        with translating("set-property", unit):
            unitcpu.write(self.model, unit, name, value, self.write_text)

    # -- mounts ---------------------------------------------------------------------------

    def start_remount(self, point: str, fstype: str, super_options: str) -> Callable[[], None]:
        self._refuse_recorded(f"{point}:remount")
        return super().start_remount(point, fstype, super_options)

    def _mount(self, mount: mounts.Mount, flags: int, data: str) -> None:
        self.model.remount(mount.point, flags, data)

    # -- refusals recorded at capture ------------------------------------------------------

    def _thread_op(self, tid: int, what: str) -> int:
        pid = self.thread_group(tid)
        self._refuse_recorded(where(pid, tid, what))
        return pid

    def _refuse_recorded(self, hpath: str) -> None:
        code = self.recorded_refusals.get(hpath)
        if code:
            raise translate(OSError(code, os.strerror(code)), "write", hpath)
