"""Files a user names on the command line or in a profile (profiles and their includes).

These are not part of the tuned host tree, so they are read directly rather than through
:class:`~gputuned.host.Host` and its root; this module keeps the one ``open`` out of the
profile layer, which never touches the machine itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from gputuned.errors import ProfileError


def read_user_file(path: str | Path) -> bytes:
    """Return the bytes of ``path``; a failure becomes a :class:`ProfileError` naming it.

    Run as root, a file that another user could have written is refused (see
    :func:`untrusted_reason`): whoever can change a profile decides what gputuned writes.
    """
    try:
        with Path(path).open("rb") as f:
            why = untrusted_reason(os.fstat(f.fileno()))  # the file read, not a path re-checked
            if why is None:
                return f.read()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ProfileError(str(path), [("", f"cannot read: {reason}; check the path")]) from exc
    fix = f"chown root {path} && chmod go-w {path}"
    msg = f"refused: {why}; gputuned runs as root and would apply what another user wrote: {fix}"
    raise ProfileError(str(path), [("", msg)])


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
    textfile collector requires: it must never read a half-written file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ProfileError(str(path), [("", f"cannot write: {exc.strerror or exc}")]) from exc
