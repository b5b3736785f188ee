"""The one exception tree of gputuned.

The code that touches the machine (the kernel port, gputuned's own files, its sockets) turns
``OSError`` into these exactly once (:func:`gputuned.kernel.oserrors.translate`); everything
above it raises and catches only these. Every message says what the user can do about it.
"""

from __future__ import annotations

from gputuned import exitcodes


class GputunedError(Exception):
    """Base of every error gputuned raises on purpose."""

    #: CLI exit status when this error ends a command (gputuned/exitcodes.py).
    exit_code = exitcodes.ERROR


class HostError(GputunedError):
    """A read or write of the machine failed. ``path`` names the file, ``errno`` the cause,
    ``op`` what was done ("read", "write", "mkdir", ...; empty where it does not apply)."""

    def __init__(
        self, message: str, *, path: str = "", errno: int | None = None, op: str = ""
    ) -> None:
        super().__init__(message)
        self.path = path
        self.errno = errno
        self.op = op


class NotSupported(HostError):
    """The kernel interface does not exist or does not support this operation here."""


class PermissionDenied(HostError):
    """The kernel (or file mode) refused the operation."""


class TargetGone(HostError):
    """The device, IRQ, process or cgroup disappeared between look-up and use."""


class InvalidValue(HostError):
    """The kernel rejected the value written."""


class Busy(HostError):
    """The target is busy (EBUSY); retry later or stop what holds it."""


class NoSpace(HostError):
    """ENOSPC: a filesystem gputuned writes to is full, or (an IRQ's affinity) no interrupt
    vector is free on the CPUs asked for."""


class PathEscape(GputunedError):
    """A path given to the kernel port tried to leave its root (``..`` or similar)."""


class ProfileError(GputunedError):
    """A profile is invalid. ``problems`` lists ``(key path, message)`` pairs; a problem of the
    whole file (a TOML syntax error, a file that cannot be read) has the key ``""``."""

    exit_code = exitcodes.REFUSED

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"{source}: invalid profile; nothing was changed."]
        lines += [f"  {key}: {msg}" if key else f"  {msg}" for key, msg in problems]
        super().__init__("\n".join(lines))


class ProfileNotFound(ProfileError):
    """No profile of that name, or no file at that path: nothing was read, so nothing is
    called invalid. The message says what exists (issue 31, item 6)."""

    def __init__(self, source: str, message: str) -> None:
        GputunedError.__init__(self, message)
        self.source = source
        self.problems = [("", message)]


class PlanError(GputunedError):
    """The profile cannot be planned on this host at all (for example: no CPU left)."""

    exit_code = exitcodes.REFUSED


class UnsafeInstall(GputunedError):
    """install-system would point root's unit at a program, interpreter or package that a user
    other than root could change; nothing was changed."""

    exit_code = exitcodes.REFUSED


class DaemonError(GputunedError):
    """An error the daemon answered a control request with: its message, and the class and
    exit status it had in the daemon, so the client ends as the one-shot path would (issue 31,
    item 3). ``problems``: a ProfileError's key paths, as the daemon sent them."""

    def __init__(
        self,
        message: str,
        *,
        error_class: str = "GputunedError",
        exit_code: int = exitcodes.ERROR,
        problems: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.exit_code = exit_code
        self.problems = problems


class UsageError(GputunedError):
    """The command line is wrong (an unknown option, a bad argument): nothing was done."""

    exit_code = exitcodes.USAGE


def class_name(exc: BaseException) -> str:
    """The class this module names for ``exc`` (docs/troubleshooting.md lists them; the
    daemon's, for its error replies), else Python's."""
    if isinstance(exc, DaemonError):
        return exc.error_class
    ours = [c.__name__ for c in type(exc).__mro__ if c.__module__ == __name__]
    return ours[0] if ours else type(exc).__name__
