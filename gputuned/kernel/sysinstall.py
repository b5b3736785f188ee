"""The machine side of ``gputunectl install-system``: package data, files, and systemd's tools.

Kept here because :mod:`gputuned.install.system` decides *what* to install and may not touch the
machine itself: every file it reads or writes goes through the kernel port's root (so ``--prefix DIR``
installs into a tree exactly as ``/`` would), and the programs it runs go through
:func:`run_tool`.
"""

from __future__ import annotations

import errno as E
import os
import shlex
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from gputuned import errors
from gputuned.kernel import Kernel
from gputuned.kernel.oserrors import translate

#: sd_booted(3): PID 1 is systemd exactly when this directory exists.
SYSTEMD_RUNTIME = "/run/systemd/system"
#: systemd-udevd's control socket: present while udevd runs (udevadm control talks to it).
UDEV_CONTROL = "/run/udev/control"


def package_data(folder: str) -> dict[str, bytes]:
    """Files shipped in ``gputuned/data/<folder>/`` (name -> bytes), sorted by name.

    In a source checkout these folders are links to the top-level ``profiles/``, ``systemd/``
    and ``udev/``; in an installed wheel they are real files.
    """
    import importlib.resources  # here: every command loads this module (store/state.py)

    base = importlib.resources.files("gputuned").joinpath("data", folder)
    try:
        entries = sorted(base.iterdir(), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise errors.NotSupported(
            f"gputuned's package data folder data/{folder} is missing: this installation is "
            "incomplete; reinstall gputuned with pip",
            path=str(base),
            errno=E.ENOENT,
        ) from exc
    return {e.name: e.read_bytes() for e in entries if e.is_file()}


def entry_point(name: str) -> str | None:
    """Absolute path of the console script ``name`` of this installation.

    The one beside the running interpreter first (a venv's bin/, or /usr/local/bin for a system
    pip install): that is the same installation as the running ``gputunectl``. Else ``PATH``.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside.absolute())
    found = shutil.which(name)
    return os.path.abspath(found) if found else None


#: The PATH systemd gives a system service (systemd.exec(5), "Environment variables in spawned
#: processes"): where ``#!/usr/bin/env python3`` finds its interpreter under the unit.
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: The second line of pip's ``/bin/sh`` form of ``#!``, for an interpreter's path too long for
#: ``#!`` or with a space in it (distlib's ``ScriptMaker._build_shebang``).
_SH_EXEC = "'''exec' "


def interpreter_of(exe: str) -> list[str]:
    """The programs that running the script ``exe`` runs: its ``#!`` program, and the Python
    that one starts when it is ``env`` (looked up on :data:`SERVICE_PATH`) or pip's ``/bin/sh``
    form (:data:`_SH_EXEC`, then the Python). ``[]`` for a file that is no script."""
    try:
        with open(exe, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace").splitlines()
    except OSError as exc:
        raise translate(exc, "read", exe) from exc
    if not head or not head[0].startswith("#!"):
        return []
    program, _, arg = head[0][2:].strip().partition(" ")
    out = [program]
    if os.path.basename(program) == "env" and arg.split():
        found = shutil.which(arg.split()[0], path=SERVICE_PATH)
        out += [found] if found else []
    elif len(head) > 1 and head[1].startswith(_SH_EXEC):
        try:
            out += shlex.split(head[1].removeprefix(_SH_EXEC))[:1]
        except ValueError as exc:  # unbalanced quotes: not pip's line
            raise errors.GputunedError(
                f"cannot tell which Python {exe} starts ({exc} in its second line); "
                "reinstall gputuned with pip, then run install-system again"
            ) from exc
    return out


def package_folders() -> list[str]:
    """Where the running gputuned was imported from, and the site-packages folders of this
    Python. For an editable install ``gputuned.__file__`` is already the source tree the
    install points to."""
    import gputuned

    out = [os.path.dirname(os.path.abspath(gputuned.__file__))]
    for key in ("purelib", "platlib"):
        site = sysconfig.get_paths()[key]
        if site not in out and os.path.isdir(site):
            out.append(site)
    return out


def which(name: str) -> str | None:
    return shutil.which(name)


def sha256_of(kernel: Kernel, hpath: str) -> str | None:
    """SHA-256 of a file's bytes (a link is followed), or ``None`` when there is none."""
    import hashlib

    real = kernel.path(hpath)
    try:
        with open(real, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise translate(exc, "read", hpath) from exc


def install_file(kernel: Kernel, hpath: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``hpath`` atomically: a temporary file beside it, fsync, rename, fsync the folder.

    Missing parent folders are made with mode 0755 (readable, like /etc itself).
    """
    real = kernel.path(hpath)
    tmp = real.with_name(f".{real.name}.gputuned-install")
    try:
        _makedirs(real.parent)
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)  # the umask must not narrow it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, real)
        fsync_dir(real.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise translate(exc, "install", hpath) from exc


def remove_file(kernel: Kernel, hpath: str) -> None:
    try:
        kernel.path(hpath).unlink(missing_ok=True)
    except OSError as exc:
        raise translate(exc, "remove", hpath) from exc


def remove_dir_if_empty(kernel: Kernel, hpath: str) -> bool:
    """Remove a folder if it is empty; ``False`` (and no error) when it is not, or is gone."""
    try:
        os.rmdir(kernel.path(hpath))
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in (E.ENOTEMPTY, E.EEXIST):
            return False
        raise translate(exc, "remove folder", hpath) from exc
    return True


def systemd_booted(kernel: Kernel) -> bool:
    """sd_booted(3): the system was started by systemd (always ``False`` on a tree)."""
    return kernel.services and kernel.is_dir(SYSTEMD_RUNTIME)


def udevd_running(kernel: Kernel) -> bool:
    return kernel.services and kernel.exists(UDEV_CONTROL)


@dataclass(frozen=True)
class ToolRun:
    argv: tuple[str, ...]
    rc: int
    output: str


def run_tool(argv: list[str], timeout: float = 120) -> ToolRun:
    """Run a system tool (systemctl, udevadm); its exit status is returned, never raised."""
    import subprocess

    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return ToolRun(tuple(argv), 124, f"no answer after {timeout:g} s")
    except OSError as exc:
        return ToolRun(tuple(argv), 127, exc.strerror or str(exc))
    return ToolRun(tuple(argv), p.returncode, (p.stdout + p.stderr).strip())


def _makedirs(path: Path) -> None:
    if path.is_dir():
        return
    _makedirs(path.parent)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return
    os.chmod(path, 0o755)  # noqa: S103  (like /etc itself: others read unit, rule, profiles)


def fsync_dir(path: Path) -> None:
    """fsync(2) a folder: a file made or renamed in it is durable only after that."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
