"""Files a user names on the command line or in a profile (profiles and their includes).

These are not part of the tuned host tree, so they are read directly rather than through
the kernel port and its root; this module keeps the one ``open`` out of the
profile layer, which never touches the machine itself.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from gputuned.errors import ProfileError

#: Profiles are a few KiB; anything near this is not one (a log, /proc/kcore).
MAX_USER_FILE = 1 << 20


def read_user_file(path: str | Path) -> bytes:
    """Return the bytes of ``path``; a failure becomes a :class:`ProfileError` naming it.

    Only a regular file of at most :data:`MAX_USER_FILE` bytes is read: a FIFO, a device or
    /dev/zero would block the reader or feed it without end. Run as root, a file that another
    user could have written is refused too (see :func:`untrusted_reason`), and so is one in a
    folder another user could write or owns, anywhere up to / (:func:`untrusted_folder`): they
    could put another file in its place. Whoever can change a profile decides what gputuned
    writes (issue 14, finding 12).
    """
    if "\0" in str(path):  # said here: Python's own words for it differ between versions
        raise ProfileError(str(path), [("", "cannot read: the path holds a NUL byte; check it")])
    try:
        # Looked at before it is opened: opening a device or FIFO can block or act.
        not_regular = _not_regular(os.stat(path))
        if not_regular is None:
            # O_NONBLOCK: should it have become a FIFO since, the open does not wait for a
            # writer; the descriptor is checked again.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())  # the file read, not a path re-checked
                not_regular = _not_regular(st)
                why = None if not_regular else untrusted_reason(st)
                fix = f"chown root {path} && chmod go-w {path}"
                if not_regular is None and why is None:
                    why = untrusted_folder(path, st)
                    fix = "keep profiles in folders only root may change, such as /etc/gputuned"
                if not_regular is None and why is None:
                    data = f.read(MAX_USER_FILE + 1)
                    if len(data) <= MAX_USER_FILE:
                        return data
                    why = f"larger than {MAX_USER_FILE >> 20} MiB; a profile is a few KiB"
                    raise ProfileError(str(path), [("", f"refused: {why}; check the path")])
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ProfileError(str(path), [("", f"cannot read: {reason}; check the path")]) from exc
    if not_regular is not None:
        msg = f"refused: not a regular file ({not_regular}); name a profile file"
        raise ProfileError(str(path), [("", msg)])
    msg = f"refused: {why}; gputuned runs as root and would apply what another user wrote: {fix}"
    raise ProfileError(str(path), [("", msg)])


def untrusted_folder(path: str | Path, st: os.stat_result) -> str | None:
    """Why root must not trust the folders above the file ``st`` (opened from ``path``): one
    that is not root's, or that others may write (a sticky one, such as /tmp, only where what
    it holds is root's: others cannot remove or rename that), lets them swap the file."""
    if os.geteuid() != 0:
        return None
    real = os.path.realpath(path)
    try:
        now = os.stat(real)
        # The path as given too: a link another user made (in /tmp, say) sends root to the
        # file of their choosing, and its folders decide what it is next time (issue 30).
        given = os.path.abspath(path)
        link = os.lstat(given)
    except OSError:
        return "it moved while it was read"
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        return "it was replaced while it was read"
    if stat.S_ISLNK(link.st_mode):
        if link.st_uid != 0:
            return f"the link {given} is owned by uid {link.st_uid}, not root"
        why = _folders(os.path.dirname(given), link.st_uid)
        if why is not None:
            return why
    return _folders(os.path.dirname(real), st.st_uid)


def _folders(folder: str, owner: int) -> str | None:
    """Why root must not trust ``folder`` and those above it, holding an entry of ``owner``."""
    while True:
        dst = os.lstat(folder)
        if dst.st_uid != 0:
            return f"the folder {folder} is owned by uid {dst.st_uid}, not root"
        others_write = dst.st_mode & 0o002 or (dst.st_mode & 0o020 and dst.st_gid != 0)
        if others_write and not (dst.st_mode & stat.S_ISVTX and owner == 0):
            return f"the folder {folder} is writable by others"
        if folder == "/":
            return None
        owner, folder = dst.st_uid, os.path.dirname(folder)


def _not_regular(st: os.stat_result) -> str | None:
    """What the file is when it is not a regular file (links are followed before)."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


def untrusted_reason(st: os.stat_result) -> str | None:
    """Why root must not trust a file with this stat: others can write it, or it is theirs."""
    if os.geteuid() != 0:
        return None  # a user's own run: the kernel refuses what that user may not change
    if st.st_mode & 0o002:
        return "the file is writable by every user"
    if st.st_mode & 0o020 and st.st_gid != 0:
        return f"the file is writable by group {st.st_gid}"
    if st.st_uid != 0:
        return f"the file is owned by uid {st.st_uid}, not root"
    return None


def write_user_file_atomic(path: str | Path, data: bytes) -> None:
    """Replace ``path`` atomically (temporary file beside it, then rename), as node_exporter's
    textfile collector requires: it must never read a half-written file.

    The folder may be writable by others (node_exporter's textfile folder belongs to its own
    user): the temporary file gets an unpredictable name and is created with O_EXCL and
    O_NOFOLLOW, so a link planted there is never followed (issue 14, finding 8); the rename
    replaces a link at ``path`` itself, never the file it points to. Mode 0644: the collector
    reads it as its own user.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ProfileError(str(path), [("", f"cannot write: {exc.strerror or exc}")]) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ProfileError(str(path), [("", f"cannot write: {exc.strerror or exc}")]) from exc
