"""Rooted file access with OSError translation: the mechanism under every host adapter."""

from __future__ import annotations

import errno as E
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gputuned import errors

#: Name of the metadata file at the top of a captured or synthetic tree.
TREE_META = "gputuned-tree.json"

_ERRNO_NAMES = {name: getattr(E, name) for name in dir(E) if name.startswith("E")}


@dataclass(frozen=True)
class Fault:
    """An injected failure: ``op`` ("read" or "write") on ``path`` fails with ``errno``."""

    path: str
    op: str
    errno: int


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
    """

    root: Path = Path("/")
    faults: list[Fault] = field(default_factory=list)
    writes: list[WriteRecord] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root).absolute()
        if not self.live:
            meta_path = self.root / TREE_META
            if meta_path.is_file():
                self.meta = json.loads(meta_path.read_text())
                we = self.meta.get("write_errors", {})
                assert isinstance(we, dict)
                for p, name in we.items():
                    self.faults.append(Fault(str(p), "write", _ERRNO_NAMES[str(name)]))

    @property
    def live(self) -> bool:
        """True when this Host is the running machine rather than a tree."""
        return self.root == Path("/")

    # -- paths ---------------------------------------------------------------------------

    def path(self, hpath: str) -> Path:
        """Map a host-absolute path (``/sys/...``) to the real path under the root."""
        parts = _components(hpath)
        return self.root.joinpath(*parts) if parts else self.root

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
        return self.path(hpath).exists()

    def is_dir(self, hpath: str) -> bool:
        return self.path(hpath).is_dir()

    def listdir(self, hpath: str) -> list[str]:
        """Sorted entries of a directory; translated errors if it is missing."""
        with self._translate("list", hpath):
            return sorted(os.listdir(self.path(hpath)))

    def readlink(self, hpath: str) -> str:
        with self._translate("read link", hpath):
            return os.readlink(self.path(hpath))

    def read_bytes(self, hpath: str, offset: int = 0, size: int = -1) -> bytes:
        self._check_fault("read", hpath)
        with self._translate("read", hpath), open(self.path(hpath), "rb") as f:
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
            return stat.S_IMODE(os.stat(self.path(hpath)).st_mode)

    # -- writes --------------------------------------------------------------------------

    def write_text(self, hpath: str, text: str) -> None:
        """Write a sysfs/procfs attribute in one ``write(2)``, as the kernel expects."""
        self.write_bytes(hpath, text.encode())

    def write_bytes(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        """Write ``data``; with ``offset``, write in place (PCI config space) without truncating."""
        self._check_fault("write", hpath)
        real = self.path(hpath)
        # O_TRUNC is what `echo >` does (sysfs and procfs ignore it); config space is written
        # in place at an offset.
        flags = os.O_WRONLY | (0 if offset is not None else os.O_TRUNC)
        with self._translate("write", hpath):
            fd = os.open(real, flags)
            try:
                n = os.pwrite(fd, data, offset) if offset is not None else os.write(fd, data)
                if n != len(data):
                    raise OSError(E.EIO, f"short write ({n} of {len(data)} bytes)")
            finally:
                os.close(fd)
        self.writes.append(WriteRecord(hpath, data, offset))

    # -- faults and translation ----------------------------------------------------------

    def inject(self, path: str, op: str, errno_: int) -> None:
        """Make ``op`` on ``path`` fail with ``errno_`` from now on (tests, fault matrix)."""
        self.faults.append(Fault(path, op, errno_))

    def _check_fault(self, op: str, hpath: str) -> None:
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


def translate(exc: OSError, op: str, hpath: str) -> errors.HostError:
    """Turn an OSError into the gputuned exception that says what to do about it."""
    code = exc.errno or 0
    what = f"{op} {hpath}"
    name = E.errorcode.get(code, str(code))
    if code in (E.ENOENT, E.ENODEV, E.ENXIO, E.ESRCH):
        return errors.TargetGone(
            f"{what}: not there ({name}); the device, IRQ, process or cgroup may have gone, "
            "or this kernel does not have that interface",
            path=hpath,
            errno=code,
        )
    if code in (E.EPERM, E.EACCES, E.EROFS):
        hint = (
            "run gputunectl as root"
            if os.geteuid() != 0
            else "the kernel refused it; see the reason gputuned reports for this setting"
        )
        return errors.PermissionDenied(
            f"{what}: permission denied ({name}); {hint}", path=hpath, errno=code
        )
    if code in (E.EINVAL, E.ERANGE, E.EOVERFLOW):
        return errors.InvalidValue(
            f"{what}: the kernel rejected the value ({name}); check the profile's value",
            path=hpath,
            errno=code,
        )
    if code in (E.EOPNOTSUPP, E.ENOSYS, E.ENOTTY):
        return errors.NotSupported(f"{what}: not supported here ({name})", path=hpath, errno=code)
    if code == E.EBUSY:
        return errors.Busy(
            f"{what}: busy ({name}); retry when the device is idle", path=hpath, errno=code
        )
    if code in (E.ENOSPC, E.EDQUOT):
        return errors.NoSpace(
            f"{what}: no space left ({name}); free space on that filesystem", path=hpath, errno=code
        )
    return errors.HostError(f"{what}: {exc.strerror or exc} ({name})", path=hpath, errno=code)
