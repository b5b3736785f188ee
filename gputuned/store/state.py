"""gputuned's own state files under the host root: the journal, the lock, the active profile.

/run/gputuned holds what dies with the boot (the journal of original values, the lock), since
runtime settings die with it too; /etc/gputuned holds the profile to apply at the next boot.
Every write here is durable before it returns: the journal is fsynced before the setting it
protects is touched.
"""

from __future__ import annotations

import errno as E
import fcntl
import os
import stat
from dataclasses import dataclass

from gputuned import errors
from gputuned.kernel import Kernel
from gputuned.kernel.oserrors import translate
from gputuned.kernel.sysinstall import fsync_dir, install_file, remove_file

RUN_DIR = "/run/gputuned"
ETC_DIR = "/etc/gputuned"
JOURNAL = f"{RUN_DIR}/journal.jsonl"
LOCK = f"{RUN_DIR}/lock"
STATE = f"{RUN_DIR}/state.json"
ACTIVE = f"{ETC_DIR}/active.json"
GRUB_DROPIN = "/etc/default/grub.d/gputuned.cfg"
#: What GRUB_DROPIN held before gputuned wrote it (engine/grub.py): boot configuration
#: outlives /run, so its record does too.
GRUB_RECORD = f"{ETC_DIR}/grub-dropin.json"


def ensure_dir(kernel: Kernel, hpath: str, mode: int = 0o700) -> None:
    real = kernel.path(hpath)
    try:
        real.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as exc:
        raise translate(exc, "create directory", hpath) from exc


def check_private(kernel: Kernel, hpath: str) -> None:
    """Refuse state files others could have written: they decide what gputuned writes as root."""
    try:
        st = os.lstat(kernel.path(hpath))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise translate(exc, "stat", hpath) from exc
    owner = kernel.trusted_uid
    if stat.S_ISLNK(st.st_mode) or st.st_mode & 0o022 or (owner is not None and st.st_uid != owner):
        raise errors.PermissionDenied(
            f"{hpath} is a link, or writable by others, or not owned by root; gputuned will not "
            "trust it: check who made it, then remove it",
            path=hpath,
            errno=E.EPERM,
        )


def check_state_files(kernel: Kernel) -> None:
    """Refuse, before anything is planned or written, state files others could have written.

    apply appends to the journal before every write and records state.json and active.json
    after the last; a file found untrusted only then would fail an apply that has already
    tuned the host.
    """
    for hpath in (JOURNAL, STATE, ACTIVE):
        check_private(kernel, hpath)


def append_durable(kernel: Kernel, hpath: str, line: bytes, *, sync: bool = True) -> None:
    """Append one line and fsync it (and the directory when the file is new).

    ``sync=False`` is for records whose loss is harmless (the journal's "drop": replaying a
    restore that already happened finds the value in place and writes nothing).
    """
    ensure_dir(kernel, hpath.rsplit("/", 1)[0])
    check_private(kernel, hpath)
    real = kernel.path(hpath)
    new = not real.exists()
    try:
        fd = os.open(real, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            size = os.fstat(fd).st_size
            try:
                if os.write(fd, line) != len(line):
                    raise OSError(E.ENOSPC, "short write to the journal")
            except OSError:
                # A full file system takes part of the line: cut it off again, or the next
                # append would continue the torn line and make the journal unreadable.
                os.ftruncate(fd, size)
                raise
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_dir(real.parent)
    except OSError as exc:
        raise translate(exc, "append to", hpath) from exc


def replace_durable(kernel: Kernel, hpath: str, data: bytes, mode: int = 0o600) -> None:
    """Write a whole file atomically (sysinstall.install_file: temporary beside it, every byte
    written, fsync, rename, fsync the directory), in a private directory, if it is trusted."""
    ensure_dir(kernel, hpath.rsplit("/", 1)[0])
    check_private(kernel, hpath)
    install_file(kernel, hpath, data, mode)


def remove(kernel: Kernel, hpath: str) -> None:
    remove_file(kernel, hpath)


def read_optional_bytes(kernel: Kernel, hpath: str) -> bytes | None:
    check_private(kernel, hpath)
    try:
        return kernel.path(hpath).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate(exc, "read", hpath) from exc


@dataclass
class HostLock:
    """One apply or revert at a time per host: an exclusive flock on /run/gputuned/lock."""

    kernel: Kernel
    fd: int = -1

    def __enter__(self) -> HostLock:
        ensure_dir(self.kernel, RUN_DIR)
        real = self.kernel.path(LOCK)
        try:
            self.fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise translate(exc, "open lock", LOCK) from exc
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(self.fd, 64).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            self.fd = -1
            raise errors.Busy(
                f"another gputuned apply or revert is running (PID {holder}); wait for it to "
                "finish, or use gputunectl status to see what it is doing",
                path=LOCK,
                errno=E.EWOULDBLOCK,
            ) from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.ftruncate(self.fd, 0)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1
