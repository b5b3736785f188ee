"""What every backend of the kernel port shares: rooted paths, reads, and the derived writes.

A backend (:class:`~gputuned.kernel.live.LiveKernel`, :class:`gputuned.sim.SimKernel`)
subclasses :class:`KernelBase` and implements the operations that differ between a machine
and a tree: ``write_bytes``, ``mkdir``, ``rmdir``, the thread operations, ``thread_group``,
``user_id`` and ``_mount`` (the mount(2) call of a remount). Reads are the same for both: a
tree holds the files the kernel would show.
"""

from __future__ import annotations

import errno as E
import os
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gputuned import errors
from gputuned.kernel import mounts, units
from gputuned.kernel.oserrors import translate
from gputuned.kernel.procfs import parse_status
from gputuned.kernel.tasks import explain_move


class KernelBase:
    """The shared part of a :class:`~gputuned.kernel.port.Kernel` rooted at ``root``."""

    proc_connector = False
    udev = False
    nvml = False
    abstract_sockets = False
    services = False
    runs_gputuned = False
    trusted_uid: int | None = None
    recorded_refusals: Mapping[str, int] = MappingProxyType({})
    recorded_nvml: Sequence[Mapping[str, Any]] | None = None

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        r = str(self.root)
        self._prefix = r if r.endswith("/") else r + "/"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    # -- paths ----------------------------------------------------------------------------

    def path(self, hpath: str) -> Path:
        return Path(self._real(hpath)) if components(hpath) else self.root

    def _real(self, hpath: str) -> str:
        """:meth:`path` as a string: one join, no pathlib parsing (every read uses it)."""
        return self._prefix + "/".join(components(hpath))

    def resolve(self, hpath: str) -> str:
        todo = components(hpath)
        done: list[str] = []
        hops = 0
        while todo:
            name = todo.pop(0)
            if name == "..":  # only from link targets; user paths reject it in components()
                if done:
                    done.pop()
                continue
            if name == ".":
                continue
            real = self.root.joinpath(*done, name)
            if real.is_symlink():
                hops += 1
                if hops > 40:
                    raise errors.HostError(
                        f"too many symbolic links under {hpath}", path=hpath, errno=E.ELOOP
                    )
                target = os.readlink(real)
                if target.startswith("/"):
                    done = []
                todo = [p for p in target.split("/") if p] + todo
                continue
            done.append(name)
        return "/" + "/".join(done)

    # -- reads ----------------------------------------------------------------------------

    def exists(self, hpath: str) -> bool:
        return os.path.exists(self._real(hpath))

    def is_dir(self, hpath: str) -> bool:
        return os.path.isdir(self._real(hpath))

    def is_link(self, hpath: str) -> bool:
        return os.path.islink(self._real(hpath))

    def listdir(self, hpath: str) -> list[str]:
        with translating("list", hpath):
            return sorted(os.listdir(self._real(hpath)))

    def readlink(self, hpath: str) -> str:
        with translating("read link", hpath):
            return os.readlink(self._real(hpath))

    def char_device(self, hpath: str) -> tuple[int, int] | None:
        try:
            st = os.stat(self._real(hpath))
        except OSError:
            return None  # closed since the listing, or not ours to read
        if not stat.S_ISCHR(st.st_mode):
            return None
        return os.major(st.st_rdev), os.minor(st.st_rdev)

    def mode(self, hpath: str) -> int:
        with translating("stat", hpath):
            return stat.S_IMODE(os.stat(self._real(hpath)).st_mode)

    def read_bytes(self, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        # Unbuffered: a buffered read of a few bytes asks the kernel for a whole buffer, and
        # for a sysfs ``config`` file that is all 4 KiB of config space, a config cycle per
        # dword: 20 ms for the H200 behind passthrough (benchmarks/config_read.py), where
        # the 256 bytes asked for take 0.9 ms.
        with translating("read", hpath), open(self._real(hpath), "rb", buffering=0) as f:
            if offset:
                f.seek(offset)
            return f.read(size)

    def read_text(self, hpath: str) -> str:
        """Whole file as text (sysfs and procfs files are small)."""
        return self.read_bytes(hpath).decode("utf-8", errors="replace")

    def read_value(self, hpath: str) -> str:
        return self.read_text(hpath).strip()

    def read_optional(self, hpath: str) -> str | None:
        try:
            return self.read_value(hpath)
        except errors.TargetGone:
            return None

    # -- processes ------------------------------------------------------------------------

    def thread_group(self, tid: int) -> int:
        try:  # the kernel serves /proc/TID for threads too
            tgid = parse_status(self.read_text(f"/proc/{tid}/status")).get("Tgid", "")
        except errors.TargetGone:
            tgid = ""
        if tgid.isdigit():
            return int(tgid)
        raise errors.TargetGone(
            f"thread {tid}: not there (ESRCH); the process or thread has exited",
            path=f"/proc/{tid}",
            errno=E.ESRCH,
        )

    # -- writes that every backend makes the same way --------------------------------------

    def write_text(self, hpath: str, text: str) -> None:
        """Write a sysfs/procfs attribute in one ``write(2)``, as the kernel expects."""
        self.write_bytes(hpath, text.encode())

    # -- what each backend does its own way --------------------------------------------------

    def write_bytes(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        raise NotImplementedError

    def mkdir(self, hpath: str) -> None:
        raise NotImplementedError

    def rmdir(self, hpath: str) -> None:
        raise NotImplementedError

    def set_nice(self, tid: int, nice: int) -> None:
        raise NotImplementedError

    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
        raise NotImplementedError

    def set_scheduler(self, tid: int, policy: str, priority: int) -> None:
        raise NotImplementedError

    def user_id(self, name: str) -> int | None:
        raise NotImplementedError

    @property
    def systemd(self) -> bool:
        return self.is_dir(units.SYSTEMD_RUNTIME)

    def unit_property(self, unit: str, name: str) -> str:
        raise NotImplementedError

    def set_unit_property(self, unit: str, name: str, value: str) -> None:
        raise NotImplementedError

    def move_to_cgroup(self, pid: int, cgroup_dir: str) -> None:
        """Writes the PID to ``{cgroup_dir}/cgroup.procs``; errors say why the kernel refused."""
        try:
            self.write_text(f"{cgroup_dir.rstrip('/')}/cgroup.procs", str(pid))
        except errors.HostError as exc:
            raise explain_move(exc, pid, cgroup_dir) from exc

    # -- remounts -------------------------------------------------------------------------

    def remount(self, point: str, fstype: str, super_options: str) -> None:
        self.start_remount(point, fstype, super_options)()

    def start_remount(self, point: str, fstype: str, super_options: str) -> Callable[[], None]:
        """Switching cgroup2's favordynmods on makes the kernel wait for an RCU grace period
        inside mount(2) (14-22 ms for a lone apply on the lent H200, 8-27 ms on the CI machine
        kind): apply lets that wait run beside its next writes (H200, lone apply: median 24 and
        33 ms against 39 and 40 ms waiting in line; scripts/device/applytime.sh)."""
        failed: list[BaseException] = []

        def run() -> None:
            try:
                with translating("remount", point):
                    mount = mounts.find(self, point, fstype)
                    flags, data = mounts.remount_call(mount, super_options)
                    self._mount(mount, flags, data)
            except BaseException as exc:  # handed to the caller by finish()
                failed.append(exc)

        worker = threading.Thread(target=run, name="gputuned-remount", daemon=True)
        worker.start()

        def finish() -> None:
            worker.join()
            if failed:
                raise failed[0]

        return finish

    def _mount(self, mount: mounts.Mount, flags: int, data: str) -> None:
        """mount(2) with MS_REMOUNT ``flags`` and ``data`` (mounts.remount_call) on ``mount``;
        OSError with a reason where the kernel refuses."""
        raise NotImplementedError


def components(hpath: str) -> list[str]:
    """The names of host path ``hpath``; PathEscape for a relative path, NUL or ``..``."""
    if not hpath.startswith("/"):
        raise errors.PathEscape(f"host path {hpath!r} must be absolute (start with '/')")
    if "\0" in hpath:
        raise errors.PathEscape(f"host path {hpath!r} contains a NUL byte")
    parts = [p for p in hpath.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise errors.PathEscape(f"host path {hpath!r} contains '..'; name the target directly")
    return parts


@contextmanager
def translating(op: str, hpath: str) -> Iterator[None]:
    """OSError inside becomes the gputuned error for ``op`` on ``hpath``."""
    try:
        yield
    except OSError as exc:
        raise translate(exc, op, hpath) from exc


def write_file(real: Path | str, data: bytes, offset: int | None) -> None:
    """One ``write(2)`` (``pwrite`` at ``offset``) to an existing file, as sysfs expects."""
    # O_TRUNC is what `echo >` does (sysfs and procfs ignore it); config space is written
    # in place at an offset.
    flags = os.O_WRONLY | (0 if offset is not None else os.O_TRUNC)
    fd = os.open(real, flags)
    try:
        n = os.pwrite(fd, data, offset) if offset is not None else os.write(fd, data)
        if n != len(data):
            raise OSError(E.EIO, f"short write ({n} of {len(data)} bytes)")
    finally:
        os.close(fd)
