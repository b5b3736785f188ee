"""Profiles by name: where ``gputunectl plan NAME``, ``include = ["NAME"]`` and ``list`` look.

Two folders, as TuneD has /usr/lib/tuned (shipped) and /etc/tuned (the administrator's):

- shipped: the profiles that came with this installation of gputuned, its package data folder
  ``gputuned/data/profiles`` (the source tree's ``profiles/`` in a checkout; the Debian package
  makes it a link to /usr/share/gputuned/profiles). An upgrade replaces them.
- user: ``/etc/gputuned/profiles`` under the host root. A profile there overrides a shipped one
  of the same name, and an upgrade never touches it; to change a shipped profile, copy it here
  (or write one that includes it by name and overrides a few keys).

A name is letters, digits, ``_`` and ``-`` (``.toml`` may follow): never a path, so a name
resolves only to a file directly inside one of these folders, and the file is read with the
same owner and folder checks as any profile (host/userfiles.py; issue 14, finding 12).
"""

from __future__ import annotations

import difflib
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gputuned.errors import ProfileError, ProfileNotFound
from gputuned.kernel.oserrors import translate

if TYPE_CHECKING:
    from gputuned.kernel import Kernel

#: The administrator's profiles (under the host root).
USER_DIR = "/etc/gputuned/profiles"
#: Where the Debian package puts the shipped ones (scripts/build-deb); shown in messages.
SHIPPED_DIR = "/usr/share/gputuned/profiles"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}(\.toml)?")


def is_profile_name(text: str) -> bool:
    """A bare name such as ``shared-host`` (no directory, no ``..``), as opposed to a path."""
    return bool(_NAME.fullmatch(text))


def shipped_dir() -> Path:
    """This installation's folder of shipped profiles (links resolved, for messages)."""
    import importlib.resources

    base = importlib.resources.files("gputuned").joinpath("data", "profiles")
    return Path(os.path.realpath(str(base)))


@dataclass(frozen=True)
class Entry:
    """One profile file found by name: ``origin`` is "user" or "shipped"; ``overrides``: a user
    profile that hides a shipped one of the same name; ``hidden``: a shipped one so hidden."""

    name: str
    path: Path
    origin: str
    overrides: bool = False
    hidden: bool = False


@dataclass(frozen=True)
class ProfileDirs:
    user: Path
    shipped: Path

    @classmethod
    def for_host(cls, kernel: Kernel) -> ProfileDirs:
        return cls(kernel.path(USER_DIR), shipped_dir())

    def _names(self, folder: Path) -> dict[str, Path]:
        try:
            files = sorted(os.listdir(folder))
        except OSError:
            return {}  # no such folder (no user profiles yet): nothing named there
        out = {}
        for f in files:
            stem = f.removesuffix(".toml")
            if f.endswith(".toml") and is_profile_name(stem) and (folder / f).is_file():
                out[stem] = folder / f
        return out

    def entries(self) -> list[Entry]:
        """Every profile by name, user ones first, each list sorted by name."""
        user, shipped = self._names(self.user), self._names(self.shipped)
        out = [Entry(n, p, "user", overrides=n in shipped) for n, p in user.items()]
        out += [Entry(n, p, "shipped", hidden=n in user) for n, p in shipped.items()]
        return out

    def find(self, name: str, *, skip: Path | None = None) -> Path:
        """The file profile ``name`` means: the user's, else the shipped one.

        ``skip``: the file doing the looking up (an include), which never resolves to itself:
        a user profile ``shared-host`` that includes ``"shared-host"`` gets the shipped one.
        """
        if not is_profile_name(name):
            msg = "not a profile name: letters, digits, '_' and '-' (and '.toml'), no directory"
            raise ProfileError(name[:80], [("", msg)])
        stem = name.removesuffix(".toml")
        me = os.path.realpath(skip) if skip is not None else None
        for folder in (self.user, self.shipped):
            path = folder / f"{stem}.toml"
            if _is_file(path) and os.path.realpath(path) != me:
                return path
        have = sorted({e.name for e in self.entries()})
        known = f"known profiles: {', '.join(have)}" if have else "no profiles found"
        where = f"{self.user} (yours) or {self.shipped} (shipped)"
        msg = f"no such profile: {stem!r} is not in {where}; {known} (gputunectl list)"
        close = difflib.get_close_matches(stem, have, n=1)
        raise ProfileNotFound(stem, msg + (f"; did you mean {close[0]}?" if close else ""))

    def resolve(self, arg: str | Path) -> Path:
        """A command line's PROFILE: a path when it has a ``/`` or ends in ``.toml``, else a
        profile's name, never a file of the current folder: another user's link there
        (``/tmp/shared-host``) would send root's ``plan shared-host`` elsewhere (issue 30)."""
        text = str(arg)
        if "/" in text or text.endswith(".toml") or not is_profile_name(text):
            path = Path(text)
            try:
                os.stat(path)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise ProfileNotFound(text, self._missing_file(text)) from None
                # Any other reason (a folder closed to this user) is read_user_file's to say.
            return path
        return self.find(text)

    def _missing_file(self, text: str) -> str:
        """What a PROFILE given as a path that does not exist is: never a lookup of the name
        ``nosuch.toml`` seems to hold, but a hint when that name is a profile's."""
        try:
            folder = os.path.dirname(os.path.abspath(text))
        except OSError:  # the current folder was removed
            folder = os.path.dirname(text) or "the current folder"
        msg = f"{text} does not exist (no such file in {folder})"
        stem = text.removesuffix(".toml")
        if "/" not in text and is_profile_name(stem) and stem in {e.name for e in self.entries()}:
            msg += f"; the profile named {stem!r} is given by its name alone, without .toml"
        return msg


def _is_file(path: Path) -> bool:
    """``path`` is a regular file; a folder this user may not search is said, not a crash
    (a non-root user and /etc/gputuned, which gputuned makes 0700: issue 31, item 6)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return False
        raise translate(exc, "look for a profile at", str(path)) from exc
