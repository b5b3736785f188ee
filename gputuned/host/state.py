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
from gputuned.host.fs import Host, translate
from gputuned.host.sysinstall import install_file, remove_file

RUN_DIR = "/run/gputuned"
ETC_DIR = "/etc/gputuned"
JOURNAL = f"{RUN_DIR}/journal.jsonl"
LOCK = f"{RUN_DIR}/lock"
STATE = f"{RUN_DIR}/state.json"
ACTIVE = f"{ETC_DIR}/active.json"
GRUB_DROPIN = "/etc/default/grub.d/gputuned.cfg"


def ensure_dir(host: Host, hpath: str, mode: int = 0o700) -> None:
    real = host.path(hpath)
    try:
        real.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as exc:
        raise translate(exc, "create directory", hpath) from exc


def check_private(host: Host, hpath: str) -> None:
    """Refuse state files others could have written: they decide what gputuned writes as root."""
    try:
        st = os.lstat(host.path(hpath))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise translate(exc, "stat", hpath) from exc
    if stat.S_ISLNK(st.st_mode) or st.st_mode & 0o022 or (host.live and st.st_uid != 0):
        raise errors.PermissionDenied(
            f"{hpath} is a link, or writable by others, or not owned by root; gputuned will not "
            "trust it: check who made it, then remove it",
            path=hpath,
            errno=E.EPERM,
        )


def check_state_files(host: Host) -> None:
    """Refuse, before anything is planned or written, state files others could have written.

    apply appends to the journal before every write and records state.json and active.json
    after the last; a file found untrusted only then would fail an apply that has already
    tuned the host.
    """
    for hpath in (JOURNAL, STATE, ACTIVE):
        check_private(host, hpath)


def append_durable(host: Host, hpath: str, line: bytes, *, sync: bool = True) -> None:
    """Append one line and fsync it (and the directory when the file is new).

    ``sync=False`` is for records whose loss is harmless (the journal's "drop": replaying a
    restore that already happened finds the value in place and writes nothing).
    """
    ensure_dir(host, hpath.rsplit("/", 1)[0])
    check_private(host, hpath)
    real = host.path(hpath)
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
            _fsync_dir(real.parent)
    except OSError as exc:
        raise translate(exc, "append to", hpath) from exc


def replace_durable(host: Host, hpath: str, data: bytes, mode: int = 0o600) -> None:
    """Write a whole file atomically (sysinstall.install_file: temporary beside it, every byte
    written, fsync, rename, fsync the directory), in a private directory, if it is trusted."""
    ensure_dir(host, hpath.rsplit("/", 1)[0])
    check_private(host, hpath)
    install_file(host, hpath, data, mode)


def remove(host: Host, hpath: str) -> None:
    remove_file(host, hpath)


def read_optional_bytes(host: Host, hpath: str) -> bytes | None:
    check_private(host, hpath)
    try:
        return host.path(hpath).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate(exc, "read", hpath) from exc


def _fsync_dir(path: os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class HostLock:
    """One apply or revert at a time per host: an exclusive flock on /run/gputuned/lock."""

    host: Host
    fd: int = -1

    def __enter__(self) -> HostLock:
        ensure_dir(self.host, RUN_DIR)
        real = self.host.path(LOCK)
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
