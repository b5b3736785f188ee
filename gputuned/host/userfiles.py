"""Files a user names on the command line or in a profile (profiles and their includes).

These are not part of the tuned host tree, so they are read directly rather than through
:class:`~gputuned.host.Host` and its root; this module keeps the one ``open`` out of the
profile layer, which never touches the machine itself.
"""

from __future__ import annotations

from pathlib import Path

from gputuned.errors import ProfileError


def read_user_file(path: str | Path) -> bytes:
    """Return the bytes of ``path``; a failure becomes a :class:`ProfileError` naming it."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ProfileError(str(path), [("", f"cannot read: {reason}; check the path")]) from exc


def write_user_file_atomic(path: str | Path, data: bytes) -> None:
    """Replace ``path`` atomically (temporary file beside it, then rename), as node_exporter's
    textfile collector requires: it must never read a half-written file."""
    import os

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ProfileError(str(path), [("", f"cannot write: {exc.strerror or exc}")]) from exc
