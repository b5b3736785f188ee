"""The kernel's side of writes to a captured tree: which file's write the kernel answers how.

On the live machine, writing ``/proc/irq/N/smp_affinity_list`` makes the kernel reformat the
value, update ``smp_affinity`` and pick an effective CPU; on a tree nothing but a file write would
happen. :class:`TreeModel` plays the kernel for the files gputuned writes, so that reading back
after a write shows what the kernel would show, and writing the old value back leaves the tree
byte-identical. Anything not routed below is a plain file write:

- ASPM policy, per-link ASPM files, IRQ affinity: :mod:`gputuned.sim.devices`;
- cgroup v2 (by the tree's ``/proc/mounts``): ``cgroup.subtree_control``, ``cgroup.procs``,
  ``mkdir`` and ``rmdir``: :mod:`gputuned.sim.cgroups`; ``cpuset.cpus``,
  ``cpuset.cpus.exclusive``, ``cpuset.cpus.partition``: :mod:`gputuned.sim.cpusets`;
- a remount of the cgroup2 hierarchy: :mod:`gputuned.sim.mounts`;
- written CPU lists and masks are read as the kernel reads them: :mod:`gputuned.sim.bitmap`.

Entry points raise ``OSError`` with the errno the kernel returns; where the user needs a reason it
rides in ``strerror`` and :func:`gputuned.errors.translate` shows it. Simplifications are named
where they are made.

One simplification for every file: a write of no bytes reaches the handler as an empty value.
The kernel's sysfs and cgroup files return 0 without looking at it (cgroup_file_write(),
sysfs_kf_write(): ``if (!nbytes) return 0``); gputuned writes ``"\n"`` for an empty value.
"""

from __future__ import annotations

import errno as E
from collections.abc import Callable

from gputuned.kernel.base import write_file
from gputuned.kernel.irqs import AFFINITY_FILE
from gputuned.kernel.masks import MASK_FILES
from gputuned.kernel.pci import ASPM_POLICY, LINK_ASPM_FILES
from gputuned.sim import cgroups, cpusets, devices, mounts
from gputuned.sim.files import TreeFiles, fail

Handler = Callable[[str, str], None]


class TreeModel(TreeFiles):
    """The kernel model for the tree at ``root`` (state lives in the tree's files only)."""

    def write(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        """``write(2)`` of ``data`` to the canonical (link-free) host path ``hpath``."""
        handler = self._handler(hpath) if offset is None else None
        if handler is None:
            write_file(self.real(hpath), data, offset)
            return
        # Every cgroup has cgroup.procs; captured trees often leave the root's out.
        real = self.real(hpath)
        if not (real.is_file() or (real.name == "cgroup.procs" and real.parent.is_dir())):
            raise fail(E.ENOENT)
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise fail(E.EINVAL) from exc
        handler(hpath, text)

    def mkdir(self, hpath: str) -> None:
        cgroups.mkdir(self, hpath)

    def rmdir(self, hpath: str) -> None:
        cgroups.rmdir(self, hpath)

    def remount(self, point: str, flags: int, data: str) -> None:
        mounts.remount(self, point, flags, data)

    def _handler(self, hpath: str) -> Handler | None:
        if hpath == ASPM_POLICY:
            return lambda hp, text: devices.aspm_policy(self, hp, text)
        if MASK_FILES.fullmatch(hpath):
            return lambda hp, text: devices.cpu_mask(self, hp, text)
        m = AFFINITY_FILE.fullmatch(hpath)
        if m:
            irq, as_list = int(m[1]), m[2] == "smp_affinity_list"
            return lambda _hp, text: devices.irq_affinity(self, irq, text, as_list=as_list)
        parts = hpath.split("/")
        if hpath.startswith("/sys/") and parts[-2:-1] == ["link"] and parts[-1] in LINK_ASPM_FILES:
            return lambda hp, text: devices.link_aspm(self, hp, text)
        mount = self.cgroup2_mount(hpath)
        if mount is None or hpath == mount:
            return None
        cg, name = hpath.rsplit("/", 1)
        if name in cgroups.READ_ONLY:
            return _read_only
        cgroup_handlers: dict[str, Callable[[TreeFiles, str, str, str], None]] = {
            "cgroup.subtree_control": cgroups.write_subtree_control,
            "cgroup.procs": cgroups.write_procs,
            "cpuset.cpus": cpusets.write_cpus,
            "cpuset.cpus.exclusive": cpusets.write_exclusive,
            "cpuset.cpus.partition": cpusets.write_partition,
            "cpu.weight": cgroups.write_cpu_weight,
            "cpu.max": cgroups.write_cpu_max,
        }
        h = cgroup_handlers.get(name)
        return None if h is None else (lambda _hp, text: h(self, mount, cg, text))


def _read_only(_hpath: str, _text: str) -> None:
    # kernfs_fop_open() refuses to open a file without a write method for writing.
    raise fail(E.EACCES, "a read-only kernel file; the kernel computes it")
