"""Rooted file access with OSError translation: the mechanism under every host adapter."""

from __future__ import annotations

import errno as E
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gputuned import errors
from gputuned.cpulist import format_cpulist

if TYPE_CHECKING:
    from gputuned.host.treekernel import TreeKernel

#: Name of the metadata file at the top of a captured or synthetic tree.
TREE_META = "gputuned-tree.json"

_ERRNO_NAMES = {name: getattr(E, name) for name in dir(E) if name.startswith("E")}
_RMDIR_BUSY = "a cgroup that still has processes or child cgroups, or a mount point; empty it first"


@dataclass(frozen=True)
class Fault:
    """An injected failure: ``op`` ("read" or "write") on ``path`` fails with ``errno``.

    ``op`` "drop" makes a write to ``path`` succeed and store nothing (``errno`` unused): a
    register field the device keeps read-only, a value the kernel does not keep.
    """

    path: str
    op: str
    errno: int
    #: True for the refusals a tree recorded at capture (``write_errors``): plan may rely on
    #: them, as it would on knowledge of the host; injected faults are surprises at apply time.
    recorded: bool = False


@dataclass(frozen=True)
class WriteRecord:
    """One write that reached the host (kept so tests can count and compare writes)."""

    path: str
    data: bytes
    offset: int | None = None


@dataclass
class Host:
    """The machine (``root="/"``) or a captured tree rooted elsewhere.

    On a tree, ``gputuned-tree.json`` at its top may list ``write_errors`` (path → errno name):
    the errors the real kernel gave when the tree was captured, replayed here so that a tree
    behaves like its host (for example EPERM on the ASPM policy where firmware owns ASPM).
    Past those, :mod:`gputuned.host.treekernel` answers for the kernel: a write, ``mkdir`` or
    ``rmdir`` on a tree reads back as the kernel would show it, and writing the old value back
    leaves the tree byte-identical.

    Threads are changed with :meth:`set_nice`, :meth:`set_affinity` and :meth:`set_scheduler`
    (syscalls live, /proc edits on a tree; mechanism in :mod:`gputuned.host.procctl`) and
    processes moved with :meth:`move_to_cgroup`; :meth:`remount` changes a mount's super
    options. Every mutation lands in ``writes``: thread
    operations as a pseudo-path such as ``/proc/1234/task/1235:nice`` with data ``b"-10"``,
    directories as ``/sys/fs/cgroup/x:mkdir`` / ``:rmdir`` with empty data.
    """

    root: Path = Path("/")
    faults: list[Fault] = field(default_factory=list)
    writes: list[WriteRecord] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)
    _mutations: int = field(default=0, repr=False)
    _failpoint: tuple[str, int] | None = field(default=None, repr=False)
    # Remounts under way in their threads (start_remount): a failpoint's SIGKILL waits for
    # them, as a real one takes effect only once the mount(2) in progress has returned.
    _in_kernel: list[threading.Thread] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root).absolute()
        self._failpoint = _parse_failpoint(os.environ.get(FAILPOINT_ENV, ""))
        if not self.live:
            meta_path = self.root / TREE_META
            if meta_path.is_file():
                self.meta = json.loads(meta_path.read_text())
                we = self.meta.get("write_errors", {})
                assert isinstance(we, dict)
                for p, name in we.items():
                    self.faults.append(Fault(str(p), "write", _ERRNO_NAMES[str(name)], True))
                # "inject": faults the host did not show at capture, for fault tests through
                # the CLI: [{"path": ..., "op": "write"|"read"|"mkdir"|"rmdir", "errno": "EIO"}]
                # or {"path": ..., "op": "drop"} (the write succeeds and stores nothing)
                inj = self.meta.get("inject", [])
                assert isinstance(inj, list)
                for f in inj:
                    code = 0 if f["op"] == "drop" else _ERRNO_NAMES[f["errno"]]
                    self.faults.append(Fault(f["path"], f["op"], code))

    @property
    def live(self) -> bool:
        """True when this Host is the running machine rather than a tree."""
        return self.root == Path("/")

    # -- paths ---------------------------------------------------------------------------

    def path(self, hpath: str) -> Path:
        """Map a host-absolute path (``/sys/...``) to the real path under the root."""
        parts = _components(hpath)
        return Path(self.real(hpath)) if parts else self.root

    def real(self, hpath: str) -> str:
        """Like :meth:`path`, as a string: one join, no pathlib parsing (every read uses it)."""
        return self._root_prefix + "/".join(_components(hpath))

    @property
    def _root_prefix(self) -> str:
        r = str(self.root)
        return r if r.endswith("/") else r + "/"

    def resolve(self, hpath: str) -> str:
        """Follow symbolic links component by component, never leaving the root.

        Returns the host-absolute canonical path (what ``realpath`` prints on the host).
        """
        todo = _components(hpath)
        done: list[str] = []
        hops = 0
        while todo:
            name = todo.pop(0)
            if name == "..":  # only from link targets; user paths reject it in _components
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

    # -- queries -------------------------------------------------------------------------

    def exists(self, hpath: str) -> bool:
        return os.path.exists(self.real(hpath))

    def is_dir(self, hpath: str) -> bool:
        return os.path.isdir(self.real(hpath))

    def listdir(self, hpath: str) -> list[str]:
        """Sorted entries of a directory; translated errors if it is missing."""
        with self._translate("list", hpath):
            return sorted(os.listdir(self.real(hpath)))

    def readlink(self, hpath: str) -> str:
        with self._translate("read link", hpath):
            return os.readlink(self.real(hpath))

    def read_bytes(self, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        self._check_fault("read", hpath)
        # Unbuffered: a buffered read of a few bytes asks the kernel for a whole buffer, and
        # for a sysfs ``config`` file that is all 4 KiB of config space, a config cycle per
        # dword: 20 ms for the H200 behind passthrough (benchmarks/config_read.py), where
        # the 256 bytes asked for take 0.9 ms.
        with self._translate("read", hpath), open(self.real(hpath), "rb", buffering=0) as f:
            if offset:
                f.seek(offset)
            return f.read(size)

    def read_text(self, hpath: str) -> str:
        """Whole file as text (sysfs and procfs files are small)."""
        return self.read_bytes(hpath).decode("utf-8", errors="replace")

    def read_value(self, hpath: str) -> str:
        """A one-value attribute with its trailing newline removed."""
        return self.read_text(hpath).strip()

    def read_optional(self, hpath: str) -> str | None:
        """Like :meth:`read_value`, but ``None`` when the file does not exist."""
        try:
            return self.read_value(hpath)
        except errors.TargetGone:
            return None

    def mode(self, hpath: str) -> int:
        with self._translate("stat", hpath):
            return stat.S_IMODE(os.stat(self.real(hpath)).st_mode)

    # -- writes --------------------------------------------------------------------------

    def write_text(self, hpath: str, text: str) -> None:
        """Write a sysfs/procfs attribute in one ``write(2)``, as the kernel expects."""
        self.write_bytes(hpath, text.encode())

    def write_bytes(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        """Write ``data``; with ``offset``, write in place (PCI config space) without truncating.

        On a tree the write goes through :mod:`gputuned.host.treekernel`, which answers for the
        kernel (formats, side effects, errors) after any injected fault has fired.
        """
        self._check_fault("write", hpath)
        if any(f.op == "drop" and f.path == hpath for f in self.faults):
            self._wrote(WriteRecord(hpath, data, offset))  # "succeeds"; nothing is stored
            return
        with self._translate("write", hpath):
            if self.live:
                write_file(self.path(hpath), data, offset)
            else:
                self._kernel().write(self.resolve(hpath), data, offset)
        self._wrote(WriteRecord(hpath, data, offset))

    # -- directories, processes and threads (each recorded in ``writes``) -----------------

    def mkdir(self, hpath: str) -> None:
        """Make a directory; on a tree, a cgroup v2 one comes with the files the kernel makes."""
        self._check_fault("mkdir", hpath)
        with self._translate("mkdir", hpath):
            if self.live:
                os.mkdir(self.real(hpath))
            else:
                self._kernel().mkdir(self.resolve(hpath))
        self._wrote(WriteRecord(f"{hpath}:mkdir", b""))

    def rmdir(self, hpath: str) -> None:
        """Remove a directory (a cgroup: Busy while it has processes or child cgroups)."""
        self._check_fault("rmdir", hpath)
        with self._translate("rmdir", hpath):
            if not self.live:
                self._kernel().rmdir(self.resolve(hpath))
            else:
                try:
                    os.rmdir(self.real(hpath))
                except OSError as exc:
                    if exc.errno != E.EBUSY:
                        raise
                    raise OSError(E.EBUSY, _RMDIR_BUSY) from exc
        self._wrote(WriteRecord(f"{hpath}:rmdir", b""))

    def set_nice(self, tid: int, nice: int) -> None:
        """Set one thread's nice value (-20..19; setpriority(2) on a TID acts on that thread)."""
        from gputuned.host import procctl

        self._thread_op(tid, "nice", str(nice), lambda pid: procctl.set_nice(self, pid, tid, nice))

    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
        """Pin one thread to ``cpus`` (sched_setaffinity(2))."""
        from gputuned.host import procctl

        self._thread_op(
            tid,
            "affinity",
            format_cpulist(cpus),
            lambda pid: procctl.set_affinity(self, pid, tid, cpus),
        )

    def set_scheduler(self, tid: int, policy: str, priority: int) -> None:
        """Set one thread's policy (other, fifo, rr, batch, idle) and real-time priority."""
        from gputuned.host import procctl

        self._thread_op(
            tid,
            "scheduler",
            f"{policy} {priority}",
            lambda pid: procctl.set_scheduler(self, pid, tid, policy, priority),
        )

    def move_to_cgroup(self, pid: int, cgroup_dir: str) -> None:
        """Move process ``pid`` with all its threads into the cgroup v2 directory ``cgroup_dir``.

        Writes the PID to ``{cgroup_dir}/cgroup.procs`` (recorded as that write); errors say why
        the kernel refused.
        """
        from gputuned.host import procctl

        try:
            self.write_text(f"{cgroup_dir.rstrip('/')}/cgroup.procs", str(pid))
        except errors.HostError as exc:
            raise procctl.explain_move(exc, pid, cgroup_dir) from exc

    def remount(self, point: str, fstype: str, super_options: str) -> None:
        """Give the ``fstype`` filesystem mounted at ``point`` exactly ``super_options`` (as
        /proc/self/mountinfo prints them), keeping the mount's own flags (nosuid, ...).

        mount(2) with MS_REMOUNT live; the tree's mountinfo is rewritten by its kernel model
        (:mod:`gputuned.host.mounts`). Recorded as a write to ``{point}:remount``, which is
        also the path to inject faults on.
        """
        self.start_remount(point, fstype, super_options)()

    def start_remount(self, point: str, fstype: str, super_options: str) -> Callable[[], None]:
        """Start :meth:`remount` in a thread; returns the function that waits for it, raises
        its error, and records the write.

        Switching cgroup2's favordynmods on makes the kernel wait for an RCU grace period
        inside mount(2) (14-22 ms for a lone apply on the lent H200, 8-27 ms on the CI machine
        kind): apply lets that wait run beside its next writes (H200, lone apply: median 24 and
        33 ms against 39 and 40 ms waiting in line; scripts/device/applytime.sh). Fault checks
        and the write record stay in the calling thread, so injected faults and crash points
        (GPUTUNED_FAILPOINT) count writes in one order.
        """
        from gputuned.host import mounts

        where = f"{point}:remount"
        self._check_fault("write", where)
        record = WriteRecord(where, super_options.encode())
        if any(f.op == "drop" and f.path == where for f in self.faults):
            return lambda: self._wrote(record)  # "succeeds", changes nothing
        failed: list[BaseException] = []

        def run() -> None:
            try:
                with self._translate("remount", point):
                    mounts.remount(self, point, fstype, super_options)
            except BaseException as exc:  # handed to the caller by finish()
                failed.append(exc)

        worker = threading.Thread(target=run, name="gputuned-remount", daemon=True)
        self._in_kernel.append(worker)
        worker.start()

        def finish() -> None:
            worker.join()
            self._in_kernel.remove(worker)
            if failed:
                raise failed[0]
            self._wrote(record)

        return finish

    def _thread_op(self, tid: int, what: str, data: str, run: Callable[[int], None]) -> None:
        from gputuned.host import procctl

        pid = procctl.thread_group(self, tid)
        where = procctl.where(pid, tid, what)
        self._check_fault("write", where)
        run(pid)
        self._wrote(WriteRecord(where, data.encode()))

    def _kernel(self) -> TreeKernel:
        from gputuned.host.treekernel import TreeKernel

        return TreeKernel(self.root)

    # -- faults and translation ----------------------------------------------------------

    def inject(self, path: str, op: str, errno_: int) -> None:
        """Make ``op`` on ``path`` fail with ``errno_`` from now on (tests, fault matrix).

        ``op`` is "read", "write", "mkdir" or "rmdir"; thread operations are writes to their
        pseudo-path, e.g. ``inject("/proc/1234/task/1235:nice", "write", errno.EPERM)``. "drop"
        makes file writes to ``path`` return success and store nothing (``errno_`` unused).
        """
        self.faults.append(Fault(path, op, errno_))

    def _wrote(self, rec: WriteRecord) -> None:
        self.writes.append(rec)
        # ">=": a write the kernel refused is not "done", so "after N" is the first done write
        # from the N-th attempt on.
        fp = self._failpoint
        if fp is not None and fp[0] == "after" and self._mutations >= fp[1]:
            self._kill(f"after write {self._mutations} ({rec.path})")

    def _kill(self, where: str) -> None:
        """The failpoint's SIGKILL. A signal ends a task only on its way out of the kernel, so a
        remount in progress in its thread completes (or fails) first, as mount(2) would."""
        for worker in list(self._in_kernel):
            worker.join()
        _die(where)

    def _check_fault(self, op: str, hpath: str) -> None:
        if op != "read":
            self._mutations += 1
            if self._failpoint == ("before", self._mutations):
                self._kill(f"before write {self._mutations} ({hpath})")
        for f in self.faults:
            if f.op == op and f.path == hpath:
                raise translate(OSError(f.errno, os.strerror(f.errno)), op, hpath)

    @contextmanager
    def _translate(self, op: str, hpath: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise translate(exc, op, hpath) from exc


def _components(hpath: str) -> list[str]:
    if not hpath.startswith("/"):
        raise errors.PathEscape(f"host path {hpath!r} must be absolute (start with '/')")
    if "\0" in hpath:
        raise errors.PathEscape(f"host path {hpath!r} contains a NUL byte")
    parts = [p for p in hpath.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise errors.PathEscape(f"host path {hpath!r} contains '..'; name the target directly")
    return parts


def write_file(real: Path, data: bytes, offset: int | None) -> None:
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


#: Crash tests: "kill-before-write:N" / "kill-after-write:N" SIGKILL this process just before or
#: just after its N-th write to the host (docs/dev/lanes.md, "Fault injection").
FAILPOINT_ENV = "GPUTUNED_FAILPOINT"


def _parse_failpoint(text: str) -> tuple[str, int] | None:
    if not text:
        return None
    kind, _, n = text.partition(":")
    if kind not in ("kill-before-write", "kill-after-write") or not n.isdigit():
        raise errors.GputunedError(
            f"{FAILPOINT_ENV}={text!r}: use kill-before-write:N or kill-after-write:N"
        )
    return (kind.split("-")[1], int(n))


def _die(where: str) -> None:
    import signal
    import sys

    sys.stderr.write(f"gputuned: {FAILPOINT_ENV}: SIGKILL {where}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def translate(exc: OSError, op: str, hpath: str) -> errors.HostError:
    """Turn an OSError into the gputuned exception that says what to do about it.

    An OSError whose ``strerror`` is not the C library's text carries a reason of its own (the
    tree's kernel model and procctl give one); it replaces the generic hint.
    """
    code = exc.errno or 0
    what = f"{op} {hpath}"
    name = E.errorcode.get(code, str(code))
    reason = exc.strerror if exc.strerror and exc.strerror != os.strerror(code) else None
    if code in (E.ENOENT, E.ENODEV, E.ENXIO, E.ESRCH):
        return errors.TargetGone(
            f"{what}: not there ({name}); "
            + (
                reason
                or "the device, IRQ, process or cgroup may have gone, "
                "or this kernel does not have that interface"
            ),
            path=hpath,
            errno=code,
            op=op,
        )
    if code in (E.EPERM, E.EACCES, E.EROFS):
        hint = reason or (
            "run gputunectl as root"
            if os.geteuid() != 0
            else "the kernel refused it; see the reason gputuned reports for this setting"
        )
        return errors.PermissionDenied(
            f"{what}: permission denied ({name}); {hint}", path=hpath, errno=code, op=op
        )
    if code in (E.EINVAL, E.ERANGE, E.EOVERFLOW):
        return errors.InvalidValue(
            f"{what}: the kernel rejected the value ({name}); "
            + (reason or "check the profile's value"),
            path=hpath,
            errno=code,
            op=op,
        )
    if code in (E.EOPNOTSUPP, E.ENOSYS, E.ENOTTY):
        tail = f"; {reason}" if reason else ""
        return errors.NotSupported(
            f"{what}: not supported here ({name}){tail}", path=hpath, errno=code, op=op
        )
    if code == E.EBUSY:
        return errors.Busy(
            f"{what}: busy ({name}); {reason or 'retry when the device is idle'}",
            path=hpath,
            errno=code,
            op=op,
        )
    if code in (E.ENOSPC, E.EDQUOT):
        # An IRQ affinity write gets ENOSPC when no interrupt vector is free on the target
        # CPUs (arch/x86/kernel/apic/vector.c: irq_matrix_alloc()): not a full file system.
        # So does a cpuset write that would leave the cgroup's processes without a CPU or
        # memory node (kernel/cgroup/cpuset.c validate_change(): a populated cpuset cannot
        # be emptied), and a move into a cgroup whose cpuset is empty.
        name_ = hpath.rsplit("/", 1)[-1]
        if hpath.startswith("/proc/irq/"):
            hint = (
                "no free interrupt vector on the target CPUs; give this IRQ more CPUs, or move "
                "other IRQs off them"
            )
        elif name_.startswith(("cpuset.cpus", "cpuset.mems")):
            hint = (
                "the cgroup still holds processes, and a cpuset with processes in it cannot be "
                "left without CPUs or memory nodes; move them out of the cgroup first (its "
                "cgroup.procs lists them)"
            )
        elif name_ == "cgroup.procs":
            hint = "the cgroup's cpuset has no CPU or memory node; give it CPUs first"
        else:
            hint = "free space on that filesystem"
        return errors.NoSpace(
            f"{what}: no space left ({name}); {reason or hint}",
            path=hpath,
            errno=code,
            op=op,
        )
    return errors.HostError(
        f"{what}: {exc.strerror or exc} ({name})", path=hpath, errno=code, op=op
    )
