"""``gputunectl capture DIR``: copy what gputuned reads from a host into a tree ``--root`` accepts.

The layout is described in docs/dev/trees.md. Captures read through the kernel port, so capturing a
tree into another tree works too (tests use that to check capture is complete).
"""

from __future__ import annotations

import contextlib
import errno as E
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from gputuned import errors
from gputuned.cpulist import format_cpulist
from gputuned.kernel import Kernel
from gputuned.kernel.irqs import DEFAULT_AFFINITY, IRQ_DIR, affinity_file, irq_dir
from gputuned.kernel.mounts import CGROUP_FEATURES, MOUNTINFO
from gputuned.kernel.nvml import NvmlGpu, read_gpus
from gputuned.kernel.pci import ASPM_POLICY, DEVICES
from gputuned.kernel.port import TREE_META

log = logging.getLogger(__name__)

_PCI_ATTRS = (
    "vendor", "device", "class", "subsystem_vendor", "subsystem_device", "revision", "numa_node",
    "local_cpulist", "irq", "current_link_speed", "current_link_width", "max_link_speed",
    "max_link_width", "enable",
)  # fmt: skip
_IRQ_FILES = ("smp_affinity", "smp_affinity_list", "effective_affinity_list")
_CPU_FILES = ("online", "possible", "present", "isolated", "nohz_full")
_CGROUP_FILES = (
    "cgroup.controllers", "cgroup.subtree_control", "cgroup.type", "cpuset.cpus",
    "cpuset.cpus.effective", "cpuset.cpus.exclusive", "cpuset.cpus.exclusive.effective",
    "cpuset.cpus.partition", "cpuset.mems", "cpuset.mems.effective", "cpuset.cpu_exclusive",
)  # fmt: skip
_CGROUP_DEPTH = 3


class _Writer:
    """Writes the tree under one directory opened once (O_DIRECTORY|O_NOFOLLOW): every file,
    folder and link is made relative to it, each component opened with O_NOFOLLOW and each
    file created with O_EXCL. Capture runs as root and its folder may sit where others can
    write (/tmp): nothing here follows a link someone planted, and a folder swapped for a link
    after it was opened changes nothing (issue 14, finding 9)."""

    def __init__(self, fd: int, dest: Path) -> None:
        self.fd = fd
        self.dest = dest
        self.files = 0
        self._dirs: dict[tuple[str, ...], int] = {(): fd}

    @classmethod
    def open(cls, dest: Path) -> _Writer:
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        return cls(fd, dest)

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs = {}

    def _dir(self, parts: tuple[str, ...]) -> int:
        """The fd of folder ``parts`` below the root, made where missing."""
        if parts in self._dirs:
            return self._dirs[parts]
        parent = self._dir(parts[:-1])
        with contextlib.suppress(FileExistsError):
            os.mkdir(parts[-1], 0o755, dir_fd=parent)
        fd = os.open(
            parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent
        )
        self._dirs[parts] = fd
        return fd

    @staticmethod
    def _split(hpath: str) -> tuple[tuple[str, ...], str]:
        parts = tuple(p for p in hpath.split("/") if p)
        if not parts or any(p in (".", "..") for p in parts):
            raise errors.PathEscape(f"capture: {hpath!r} is not a path inside the tree")
        return parts[:-1], parts[-1]

    def put(self, hpath: str, data: bytes) -> None:
        folder, name = self._split(hpath)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o644, dir_fd=self._dir(folder))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        self.files += 1

    def mkdir(self, hpath: str) -> None:
        self._dir(tuple(p for p in hpath.split("/") if p))

    def link(self, hpath: str, target: str) -> None:
        folder, name = self._split(hpath)
        at = self._dir(folder)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=at)  # a link made earlier in this capture
        os.symlink(target, name, dir_fd=at)


def _open_destination(dest: Path) -> _Writer:
    """``dest`` made (0700) or checked: an empty folder of this user that no one else may
    write, not a link. Another user's folder, or one they may write, could hold or get links
    that make root write anywhere."""
    try:
        dest.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise errors.GputunedError(f"cannot make {dest}: {exc.strerror or exc}") from exc
    try:
        w = _Writer.open(dest)
    except OSError as exc:
        if exc.errno in (E.ELOOP, E.ENOTDIR):  # O_NOFOLLOW|O_DIRECTORY on a link: ENOTDIR
            what = "a symbolic link" if dest.is_symlink() else "a file, not a folder"
            raise errors.GputunedError(
                f"{dest} is {what}; capture into a new or empty folder of your own"
            ) from None
        raise errors.GputunedError(f"cannot open {dest}: {exc.strerror or exc}") from exc
    st = os.fstat(w.fd)
    why = None
    if st.st_uid != os.geteuid():
        why = f"it is owned by uid {st.st_uid}, not by you"
    elif st.st_mode & 0o022:
        why = f"it is writable by others (mode {st.st_mode & 0o777:o})"
    elif os.listdir(w.fd):
        why = "it is not empty"
    if why is not None:
        w.close()
        raise errors.GputunedError(f"{dest}: {why}; capture into a new or empty folder of your own")
    return w


def capture(
    kernel: Kernel,
    dest: Path,
    *,
    probe_writes: bool = False,
    stable: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """Copy the host's relevant files to ``dest``; return the tree metadata written.

    With ``probe_writes``, each IRQ affinity and the ASPM policy is written back unchanged (the
    kernel treats an unchanged ASPM policy as a no-op; an IRQ gets the mask it already has) and
    refusals are recorded in ``write_errors`` so the tree refuses the same writes.

    With ``stable``, what changes by itself between two captures of an unchanged host is left
    out, so that two captures can be compared with ``diff -r``: interrupt counts (zeroed),
    ``effective_affinity_list`` (the CPU the kernel picked within the affinity mask), NVML's
    utilisation and process list, and the tree's name.
    """
    w = _open_destination(dest)
    try:
        return _capture_into(kernel, w, dest, probe_writes, stable, progress)
    finally:
        w.close()


def _capture_into(
    kernel: Kernel,
    w: _Writer,
    dest: Path,
    probe_writes: bool,
    stable: bool,
    progress: Callable[[str], None] | None,
) -> dict[str, object]:
    say = progress or (lambda _msg: None)
    # Refusals the source already knows (a tree's recorded write_errors) carry over.
    write_errors = {path: E.errorcode[code] for path, code in kernel.recorded_refusals.items()}

    say("PCI devices")
    _capture_pci(kernel, w)
    say("IRQs")
    _copy(kernel, w, "/proc/cmdline")
    _copy(kernel, w, "/proc/mounts", _stable_mounts if stable else _filter_mounts)
    _copy(kernel, w, MOUNTINFO, _stable_mountinfo if stable else _filter_mountinfo)
    _copy(kernel, w, "/proc/interrupts", _zero_counts if stable else None)
    _copy(kernel, w, DEFAULT_AFFINITY)
    for irq in sorted(int(n) for n in _list(kernel, IRQ_DIR) if n.isdigit()):
        for f in _IRQ_FILES:
            if not (stable and f == "effective_affinity_list"):
                _copy(kernel, w, f"{irq_dir(irq)}/{f}")
        if probe_writes:
            _probe(kernel, affinity_file(irq), write_errors)
    say("CPUs and NUMA")
    for f in _CPU_FILES:
        _copy(kernel, w, f"/sys/devices/system/cpu/{f}")
    _copy(kernel, w, "/sys/devices/system/node/online")
    for node in _list(kernel, "/sys/devices/system/node"):
        if re.fullmatch(r"node\d+", node):
            _copy(kernel, w, f"/sys/devices/system/node/{node}/cpulist")
    # SMT siblings and package ids: CPU sets take whole cores (gputuned.kernel.topology).
    for cpu in _list(kernel, "/sys/devices/system/cpu"):
        if re.fullmatch(r"cpu\d+", cpu):
            for f in _list(kernel, f"/sys/devices/system/cpu/{cpu}/topology"):
                _copy(kernel, w, f"/sys/devices/system/cpu/{cpu}/topology/{f}")
    say("ASPM policy")
    _copy(kernel, w, ASPM_POLICY)
    if probe_writes and kernel.exists(ASPM_POLICY):
        _probe(kernel, ASPM_POLICY, write_errors, policy=True)
    say("cgroups")
    _copy(kernel, w, CGROUP_FEATURES)
    _capture_cgroups(kernel, w, "/sys/fs/cgroup", 0)

    nvml = read_gpus(kernel)
    meta: dict[str, object] = {
        "name": "capture" if stable else dest.name,
        "source": "capture",
        "note": f"captured by gputunectl capture from {kernel.root}",
        "write_errors": write_errors,
    }
    if nvml is not None:
        meta["nvml"] = [_nvml_entry(g, stable) for g in nvml]
    w.put(f"/{TREE_META}", (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    say(f"done: {w.files} files")
    return meta


def _nvml_entry(g: NvmlGpu, stable: bool) -> dict[str, object]:
    entry = asdict(g)
    del entry["cpu_affinity"]
    if g.cpu_affinity is not None:
        entry["cpu_affinity"] = format_cpulist(g.cpu_affinity)
    if stable:
        entry.update(utilization_gpu=None, pids=[])
    return entry


def _list(kernel: Kernel, hpath: str) -> list[str]:
    try:
        return kernel.listdir(hpath)
    except errors.HostError:
        return []


def _copy(
    kernel: Kernel, w: _Writer, hpath: str, transform: Callable[[bytes], bytes] | None = None
) -> None:
    try:
        data = kernel.read_bytes(hpath)
    except errors.HostError as exc:
        log.debug("capture: skip %s: %s", hpath, exc)
        return
    w.put(hpath, transform(data) if transform else data)


def _zero_counts(data: bytes) -> bytes:
    """/proc/interrupts with every per-CPU count replaced by 0, layout kept."""
    return re.sub(rb"(?<=\s)\d+(?=\s)", lambda m: b"0".rjust(len(m.group(0))), data)


def _filter_mounts(data: bytes) -> bytes:
    keep = [ln for ln in data.decode().splitlines() if ln.split()[2:3] in (["cgroup"], ["cgroup2"])]
    return ("\n".join(keep) + "\n").encode() if keep else b""


def _filter_mountinfo(data: bytes) -> bytes:
    """The cgroup and cgroup2 lines of /proc/self/mountinfo (their type follows " - ")."""
    keep = [
        ln
        for ln in data.decode().splitlines()
        if ln.partition(" - ")[2].split()[:1] in (["cgroup"], ["cgroup2"])
    ]
    return ("\n".join(keep) + "\n").encode() if keep else b""


def _by_point(lines: list[str], field: int) -> list[str]:
    """Lines sorted by mount point; mounts on one point keep their order (the last covers)."""
    return sorted(lines, key=lambda ln: ln.split()[field])


def _stable_mounts(data: bytes) -> bytes:
    lines = _by_point(_filter_mounts(data).decode().splitlines(), 1)
    return ("\n".join(lines) + "\n").encode() if lines else b""


def _stable_mountinfo(data: bytes) -> bytes:
    """:func:`_filter_mountinfo`, less what a new mount namespace or a reboot changes by
    itself (proc(5)): the order of mounts on different points (systemd mounts the cgroup v1
    hierarchies in no fixed order), mount IDs and parents (1, 2, ... in the sorted order), the
    device number (0:0) and the optional fields (peer groups: shared:N, master:N). What
    gputuned reads of a line (point, options, type, source, super options) stays (issue 19: the
    package lane compares captures taken before the install and after a reboot and the purge)."""
    lines = _by_point(_filter_mountinfo(data).decode().splitlines(), 4)
    ids = {ln.split()[0]: str(i) for i, ln in enumerate(lines, 1)}
    out = []
    for ln in lines:
        pre, _, post = ln.partition(" - ")
        head = pre.split()
        out.append(
            f"{ids[head[0]]} {ids.get(head[1], '0')} 0:0 {head[3]} {head[4]} {head[5]} - {post}"
        )
    return ("\n".join(out) + "\n").encode() if out else b""


def _capture_pci(kernel: Kernel, w: _Writer) -> None:
    for bdf in _list(kernel, DEVICES):
        real = kernel.resolve(f"{DEVICES}/{bdf}")
        w.link(f"{DEVICES}/{bdf}", os.path.relpath(real, DEVICES))
        _copy(kernel, w, f"{real}/config")
        for attr in _PCI_ATTRS:
            _copy(kernel, w, f"{real}/{attr}")
        for irq in _list(kernel, f"{real}/msi_irqs"):
            _copy(kernel, w, f"{real}/msi_irqs/{irq}")
        for f in _list(kernel, f"{real}/link"):
            _copy(kernel, w, f"{real}/link/{f}")
        if kernel.exists(f"{real}/driver"):
            drv = kernel.resolve(f"{real}/driver")
            w.mkdir(drv)  # the link must resolve inside the tree, as it does on the host
            w.link(f"{real}/driver", os.path.relpath(drv, real))


def _capture_cgroups(kernel: Kernel, w: _Writer, hpath: str, depth: int) -> None:
    names = _list(kernel, hpath)
    for f in _CGROUP_FILES:
        if f in names:
            _copy(kernel, w, f"{hpath}/{f}")
    if depth >= _CGROUP_DEPTH:
        return
    for name in names:
        sub = f"{hpath}/{name}"
        if kernel.is_dir(sub) and not kernel.is_link(sub):
            _capture_cgroups(kernel, w, sub, depth + 1)


def _probe(kernel: Kernel, hpath: str, found: dict[str, str], *, policy: bool = False) -> None:
    try:
        value = kernel.read_value(hpath)
        if policy:
            m = re.search(r"\[(\w+)\]", value)
            value = m.group(1) if m else value
        kernel.write_text(hpath, value)
    except errors.HostError as exc:
        if exc.errno in (E.EPERM, E.EIO, E.EACCES, E.EINVAL):
            found[hpath] = E.errorcode[exc.errno]
