"""Files a user names on the command line or in a profile (profiles and their includes), and
whether root may trust a path: only root can change what it leads to (profiles, and the
program install-system points root's unit at).

These are not part of the tuned host tree, so they are read directly rather than through
the kernel port and its root; this module keeps the one ``open`` out of the
profile layer, which never touches the machine itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
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
        fix = "check the path"
        if exc.errno == errno.EACCES and not os.path.isabs(path):
            fix += ", or give it from / (the current folder may be closed to this user)"
        raise ProfileError(str(path), [("", f"cannot read: {reason}; {fix}")]) from exc
    if not_regular is not None:
        msg = f"refused: not a regular file ({not_regular}); name a profile file"
        raise ProfileError(str(path), [("", msg)])
    msg = f"refused: {why}; gputuned runs as root and would apply what another user wrote: {fix}"
    raise ProfileError(str(path), [("", msg)])


def untrusted_folder(path: str | Path, st: os.stat_result) -> str | None:
    """Why root must not trust the folders above the file ``st`` (opened from ``path``), or
    the links on the way to it (:func:`untrusted_path`, the file itself left to
    :func:`untrusted_reason`)."""
    if os.geteuid() != 0:
        return None
    try:
        walk = list(_resolution(os.path.abspath(path)))
    except OSError:
        return "it moved while it was read"
    last = walk[-1][1]
    if (last.st_dev, last.st_ino) != (st.st_dev, st.st_ino):
        return "it was replaced while it was read"
    return _untrusted_walk(walk[:-1], walk[-1][1].st_uid)


def untrusted_path(path: str | Path) -> str | None:
    """Why root must not trust what ``path`` leads to, whoever asks: an entry on the way that
    is not root's, a folder that others may write (a sticky one, such as /tmp, only where what
    it holds is root's: others cannot remove or rename that), or the file (or folder) at the
    end writable by others. Every entry the kernel goes through counts: each folder from /
    down, each link (the path as given, a link in a folder of the path, a link a link points
    to) and the folders of what it points to: another user's link (in /tmp, say) sends root
    to the file of their choosing (issue 30, item 6), and root's unit must not run a program,
    or import a package, that another user can change (item 4)."""
    try:
        walk = list(_resolution(os.path.abspath(path)))
    except OSError as exc:
        return f"{path} cannot be checked: {exc.strerror or exc}"
    why = _untrusted_walk(walk[:-1], walk[-1][1].st_uid)
    if why is None:
        end, st = walk[-1]
        kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
        why = _not_roots_alone(st, f"{kind} {end}")
    return why


#: The kernel follows at most this many links in one path lookup (MAXSYMLINKS,
#: include/linux/namei.h); one more is ELOOP.
_MAX_LINKS = 40


def _resolution(path: str) -> Iterator[tuple[str, os.stat_result]]:
    """Each entry the kernel goes through to reach absolute ``path``, from / down, by its
    physical path, with its lstat: a link, then the entries of what it points to."""
    yield "/", os.lstat("/")
    todo = path.split("/")
    here, links = "/", 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":  # physical: ``here`` holds no link
            here = os.path.dirname(here)
            continue
        entry = os.path.join(here, name)
        st = os.lstat(entry)
        yield entry, st
        if not stat.S_ISLNK(st.st_mode):
            here = entry
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        target = os.readlink(entry)
        todo = target.split("/") + todo
        if target.startswith("/"):
            here = "/"


def _untrusted_walk(walk: list[tuple[str, os.stat_result]], end_uid: int) -> str | None:
    """Why root must not trust the entries of ``walk`` (all but the last of a resolution),
    the last of which holds an entry of ``end_uid``: an entry of another user's is named
    first, then a folder others may write."""
    for entry, st in walk:
        if st.st_uid != 0:
            kind = "link" if stat.S_ISLNK(st.st_mode) else "folder"
            return f"the {kind} {entry} is owned by uid {st.st_uid}, not root"
    for i, (entry, st) in enumerate(walk):
        held = walk[i + 1][1].st_uid if i + 1 < len(walk) else end_uid
        sticky_over_roots = st.st_mode & stat.S_ISVTX and held == 0
        if not stat.S_ISLNK(st.st_mode) and _others_may_write(st) and not sticky_over_roots:
            return f"the folder {entry} is writable by others"
    return None


def _others_may_write(st: os.stat_result) -> bool:
    return bool(st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0))


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
    return _not_roots_alone(st, "file")


def _not_roots_alone(st: os.stat_result, what: str) -> str | None:
    if st.st_mode & 0o002:
        return f"the {what} is writable by every user"
    if st.st_mode & 0o020 and st.st_gid != 0:
        return f"the {what} is writable by group {st.st_gid}"
    if st.st_uid != 0:
        return f"the {what} is owned by uid {st.st_uid}, not root"
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
