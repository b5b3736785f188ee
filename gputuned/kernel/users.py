"""Users and groups of this machine (NSS: /etc/passwd, /etc/group, LDAP ...), by name and id.

The groups and users a profile names under ``[daemon]`` (``control_group``, ``admin_group``,
``metrics_allow``) are those of the machine the daemon runs on, also with ``--root`` (the
sockets it serves are this machine's), so they are looked up here, not in the tree.
"""

from __future__ import annotations

import grp
import os
import pwd
import time


def group_gid(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def user_uid(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


class GroupCache:
    """The groups of a uid (primary and supplementary), looked up at most once a minute each:
    a scrape must not wait for a directory service every time."""

    ttl_s = 60.0

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, frozenset[int]]] = {}

    def groups(self, uid: int) -> frozenset[int]:
        now = time.monotonic()
        hit = self._seen.get(uid)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        try:
            pw = pwd.getpwuid(uid)
            gids = frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except (KeyError, OSError):
            gids = frozenset()
        if len(self._seen) > 4096:  # users come and go; the cache must not grow for ever
            self._seen.clear()
        self._seen[uid] = (now, gids)
        return gids


def asking_uids() -> frozenset[int]:
    """The user running this command, and the one sudo ran it for (SUDO_UID): an admin's own
    shell is not other work on the host (gputunectl recommend)."""
    uids = {os.getuid()}
    sudo = os.environ.get("SUDO_UID", "")
    if sudo.isdigit():
        uids.add(int(sudo))
    return frozenset(uids)
