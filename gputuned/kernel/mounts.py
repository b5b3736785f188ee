"""Mounts: read /proc/self/mountinfo, and build the mount(2) call that gives a mounted
filesystem other super options.

The one mount gputuned changes is the cgroup v2 hierarchy's, for ``favordynmods``
(:mod:`gputuned.tuners.favordynmods`). The kernel port's ``remount`` is the public door
(:meth:`gputuned.kernel.base.KernelBase.start_remount`); it finds the mount and builds the
call here, then makes it: ``mount(2)`` with ``MS_REMOUNT`` through libc on the machine
(:mod:`gputuned.kernel.live`), a rewrite of the tree's mountinfo and /proc/mounts lines as the
kernel would show them after the same call on a tree (:mod:`gputuned.sim.mounts`).

Why the call is built the way it is (fs/namespace.c ``path_mount()`` and ``do_remount()``): a
remount without ``MS_BIND`` replaces *both* the superblock's options and the mount's own flags
(``set_mount_attributes()``), so ``nosuid``, ``nodev``, ``noexec`` and ``nosymfollow`` must be
passed again or they are lost; the atime flags are kept when none is passed. The superblock's
options are set to exactly those given: cgroup2 starts a reconfiguration from no flags
(kernel/cgroup/cgroup.c ``cgroup_init_fs_context()``, ``cgroup_reconfigure()`` ->
``apply_cgroup_root_flags()``), so every option to keep is passed with the new one, and the
original option string puts them back. ``rw``/``ro`` is one flag (``MS_RDONLY``) for both the
mount and the superblock, so a mount whose read-only state differs from its superblock's cannot
be remounted this way without changing one of them: refused.
"""

from __future__ import annotations

import errno as E
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gputuned import errors

if TYPE_CHECKING:
    from gputuned.kernel import Kernel

MOUNTINFO = "/proc/self/mountinfo"
#: cgroup v2 features of the running kernel, one a line (kernel/cgroup/cgroup.c features_show()).
CGROUP_FEATURES = "/sys/kernel/cgroup/features"
#: cgroup2 mount options in the order cgroup_show_options() prints them (kernel/cgroup/cgroup.c);
#: favordynmods since Linux 6.0, memory_hugetlb_accounting 6.6, pids_localevents 6.13.
CGROUP2_OPTIONS = (
    "nsdelegate",
    "favordynmods",
    "memory_localevents",
    "memory_recursiveprot",
    "memory_hugetlb_accounting",
    "pids_localevents",
)

# include/uapi/linux/mount.h
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOSYMFOLLOW, MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 256, 1024, 2048, 1 << 21
MS_STRICTATIME = 1 << 24
#: Per-mount options as show_mnt_opts() (fs/proc_namespace.c) prints them, in its order, and
#: the mount(2) flag that keeps each. "ro"/"rw" comes first and is MS_RDONLY.
MOUNT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "nosymfollow": MS_NOSYMFOLLOW,
}
_ESCAPED = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo (proc(5)): the fields gputuned needs."""

    point: str  # the mount point, unescaped
    options: tuple[str, ...]  # per-mount options, e.g. ("rw", "nosuid", "relatime")
    fstype: str
    source: str
    super_options: str  # the superblock's, as the kernel prints them: "rw,nsdelegate"

    @property
    def read_only(self) -> bool:
        return "ro" in self.options

    @property
    def super_read_only(self) -> bool:
        return "ro" in self.super_options.split(",")

    @property
    def refuses_writes(self) -> bool:
        """Does the kernel refuse every write under it (EROFS)? A read-only mount or a
        read-only superblock (fs/namespace.c __mnt_is_readonly()): a container's /proc/irq,
        bind-mounted read-only (Docker's ReadonlyPaths), or a /sys mounted read-only."""
        return self.read_only or self.super_read_only


def unescape(field: str) -> str:
    """Mount points are printed with space, tab, newline and backslash as \\ooo (seq_escape)."""
    return _ESCAPED.sub(lambda m: chr(int(m[1], 8)), field)


def parse_line(line: str) -> Mount | None:
    """A mountinfo line: ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER."""
    pre, sep, post = line.partition(" - ")
    head, tail = pre.split(), post.split()
    if not sep or len(head) < 6 or len(tail) < 3:
        return None
    return Mount(unescape(head[4]), tuple(head[5].split(",")), tail[0], unescape(tail[1]), tail[2])


def parse_table(text: str) -> tuple[Mount, ...]:
    """Every mount of a mountinfo text, in its order."""
    return tuple(m for m in map(parse_line, text.splitlines()) if m is not None)


def covering(table: tuple[Mount, ...], path: str) -> Mount | None:
    """The mount path lookup of the canonical ``path`` ends in: the one whose point is the
    longest at or above it, the last listed of equal ones (a later mount on a point covers
    the earlier). None where the table lists none (a tree's mountinfo has few lines)."""
    best: Mount | None = None
    for m in table:
        point = m.point.rstrip("/")
        above = path == m.point or path.startswith(point + "/")
        if above and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


class MountTable:
    """/proc/self/mountinfo, read once when first asked (a plan that changes no file never
    reads it); unreadable is empty: nothing is known to be read-only."""

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel
        self._table: tuple[Mount, ...] | None = None

    def covering(self, path: str) -> Mount | None:
        if self._table is None:
            try:
                self._table = parse_table(self._kernel.read_optional(MOUNTINFO) or "")
            except errors.GputunedError:
                self._table = ()
        return covering(self._table, path)


def find(kernel: Kernel, point: str, fstype: str) -> Mount:
    """The mount at ``point`` of type ``fstype`` that path lookup reaches (the last one listed:
    a later mount on the same point covers the earlier). TargetGone when there is none."""
    try:
        text = kernel.read_text(MOUNTINFO)
    except errors.TargetGone as exc:
        raise errors.TargetGone(
            f"read {MOUNTINFO}: not there; a tree needs proc/self/mountinfo "
            "(gputunectl capture writes it)",
            path=MOUNTINFO,
            errno=E.ENOENT,
        ) from exc
    hits = [m for m in map(parse_line, text.splitlines()) if m and m.point == point]
    if not hits or hits[-1].fstype != fstype:
        raise errors.TargetGone(
            f"{MOUNTINFO}: no {fstype} mount at {point}", path=MOUNTINFO, errno=E.ENOENT
        )
    return hits[-1]


def with_option(super_options: str, name: str) -> str:
    """``super_options`` with ``name`` added, in the order the kernel prints cgroup2's."""
    opts = super_options.split(",")
    if name in opts:
        return super_options
    rank = {o: i for i, o in enumerate(CGROUP2_OPTIONS)}
    at = next(
        (i for i, o in enumerate(opts) if rank.get(o, -1) > rank.get(name, len(rank))), len(opts)
    )
    return ",".join([*opts[:at], name, *opts[at:]])


def remount_call(mount: Mount, super_options: str) -> tuple[int, str]:
    """The mount(2) flags and data that give ``mount`` these super options and keep its own.

    Refused (NotSupported) where the mount's read-only state differs from its superblock's: one
    MS_RDONLY sets both (see the module docstring).
    """
    want_ro = "ro" in super_options.split(",")
    if mount.read_only != mount.super_read_only:
        raise errors.NotSupported(
            f"remount {mount.point}: the mount is {'ro' if mount.read_only else 'rw'} and its "
            f"hierarchy {'ro' if mount.super_read_only else 'rw'}; one remount cannot keep both "
            "(is it a read-only bind mount, such as systemd's ProtectControlGroups=yes?)",
            path=mount.point,
            errno=E.EOPNOTSUPP,
        )
    if want_ro != mount.read_only:
        raise errors.NotSupported(
            f"remount {mount.point}: {super_options!r} would change its read-only state too",
            path=mount.point,
            errno=E.EOPNOTSUPP,
        )
    flags = MS_REMOUNT | (MS_RDONLY if want_ro else 0)
    for opt in mount.options:
        flags |= MOUNT_FLAGS.get(opt, 0)
    data = ",".join(o for o in super_options.split(",") if o and o not in ("rw", "ro"))
    return flags, data
