"""A remount of a tree's cgroup2 hierarchy: its lines in /proc/self/mountinfo and /proc/mounts
rewritten as the kernel shows them after the same mount(2) call (flags and data built by
:func:`gputuned.kernel.mounts.remount_call`, as for the machine).
"""

from __future__ import annotations

import errno as E

from gputuned.kernel import mounts as mt
from gputuned.sim.files import TreeFiles, fail


def remount(tf: TreeFiles, point: str, flags: int, data: str) -> None:
    """mount(2) with MS_REMOUNT of the cgroup2 hierarchy at ``point`` (fs/namespace.c
    path_mount() -> do_remount(), kernel/cgroup/cgroup.c cgroup2_parse_param()).

    The super options become exactly ``data``, printed in cgroup_show_options() order; an
    option the kernel does not know is EINVAL (the tree's kernel knows those its
    /sys/kernel/cgroup/features lists, else all of CGROUP2_OPTIONS). The mount's own options
    follow ``flags``; its atime options are kept when ``flags`` gives none. Both the
    mountinfo line and the /proc/mounts line change. Simplified: only cgroup2 is modelled,
    and a remount from a cgroup namespace other than the initial one is not ignored as the
    kernel ignores it (apply_cgroup_root_flags()).
    """
    info = (tf.get(mt.MOUNTINFO) or "").splitlines(keepends=True)
    at = [i for i, ln in enumerate(info) if (m := mt.parse_line(ln)) and m.point == point]
    if not at:
        raise fail(E.EINVAL, f"{point} is not a mount point")  # do_remount(): not the root
    line = info[at[-1]]
    mount = mt.parse_line(line)
    assert mount is not None
    if mount.fstype != "cgroup2":
        raise fail(E.EINVAL, f"the tree's kernel remounts cgroup2 only, not {mount.fstype}")
    known = (tf.get(mt.CGROUP_FEATURES) or "").split() or mt.CGROUP2_OPTIONS
    given = [o for o in data.split(",") if o]
    for opt in given:
        if opt not in known:
            raise fail(E.EINVAL, f"cgroup2: Unknown parameter '{opt}'")  # fs_parse()
    rw = "ro" if flags & mt.MS_RDONLY else "rw"
    fs_opts = [o for o in mt.CGROUP2_OPTIONS if o in given]
    own = [rw, *_mount_flags(flags, mount.options)]
    pre, _sep, post = line.rstrip("\n").partition(" - ")
    head, tail = pre.split(" "), post.split(" ")
    head[5], tail[2] = ",".join(own), ",".join([rw, *fs_opts])
    info[at[-1]] = " ".join(head) + " - " + " ".join(tail) + "\n"
    tf.put_whole(mt.MOUNTINFO, "".join(info))
    # /proc/mounts (show_vfsmnt()): rw/ro, the mount's options, then the filesystem's.
    lines = (tf.get("/proc/mounts") or "").splitlines(keepends=True)
    hits = [
        i
        for i, ln in enumerate(lines)
        if ln.split()[2:3] == ["cgroup2"] and mt.unescape(ln.split()[1]) == point
    ]
    if hits:
        f = lines[hits[-1]].rstrip("\n").split(" ")
        f[3] = ",".join([*own, *fs_opts])
        lines[hits[-1]] = " ".join(f) + "\n"
        tf.put_whole("/proc/mounts", "".join(lines))


def _mount_flags(flags: int, before: tuple[str, ...]) -> list[str]:
    """The mount's own options after path_mount() with ``flags`` (show_mnt_opts() order).

    relatime is the default unless MS_NOATIME, MS_STRICTATIME clears both, and a remount that
    names no atime flag keeps the mount's ("The default atime for remount is preservation").
    """
    atime = ("noatime", "nodiratime", "relatime")
    given = flags & (mt.MS_NOATIME | mt.MS_NODIRATIME | mt.MS_RELATIME | mt.MS_STRICTATIME)
    out = []
    for name, bit in mt.MOUNT_FLAGS.items():
        if name in atime and not given:
            on = name in before
        elif name == "relatime":
            on = not flags & (mt.MS_NOATIME | mt.MS_STRICTATIME)
        elif name == "noatime":
            on = bool(flags & bit) and not flags & mt.MS_STRICTATIME
        else:
            on = bool(flags & bit)
        if on:
            out.append(name)
    return out
