"""The kernel port: the one door through which gputuned reads and changes the machine.

Every read and write of /sys, /proc, cgroup files and PCI config space, every change of a
thread's scheduling and every remount goes through a :class:`Kernel`. Two backends serve it:

- the **live** one (:class:`gputuned.kernel.live.LiveKernel`): the running machine, through
  files, system calls and libc;
- the **simulated** one (:mod:`gputuned.sim`): a captured or built host tree under a folder
  (``--root DIR``), whose files it edits as the kernel would show them after the same call.

Which one serves a command is decided once, where ``--root`` is parsed
(:func:`gputuned.root.open_kernel`); everything else takes "the kernel" as one parameter and
never asks which it got. What differs beyond files is named as a capability
(:attr:`Kernel.proc_connector`, :attr:`Kernel.udev`, ...) that the code needing it asks.

Paths are host paths (``/sys/...``), joined to the root component by component; ``..`` is
refused, and symbolic links inside the root are followed without ever leaving it (an absolute
link target is taken relative to the root, as ``chroot`` would). ``OSError`` becomes a
:mod:`gputuned.errors` error here, once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

#: Name of the metadata file at the top of a captured or built host tree (docs/dev/trees.md).
TREE_META = "gputuned-tree.json"


class Kernel(Protocol):
    """What gputuned may ask of a machine. Implemented by :class:`~gputuned.kernel.base.KernelBase`
    and its backends."""

    #: ``/`` for the running machine, else the folder of a host tree.
    root: Path

    # -- what this kernel offers besides files (asked once, by the code that needs it) -----------

    #: The process events connector (NETLINK_CONNECTOR, CN_IDX_PROC) reports this kernel's
    #: processes; without it process events come from polling /proc.
    proc_connector: bool
    #: udev announces this kernel's PCI devices (a netlink monitor).
    udev: bool
    #: NVML (the NVIDIA driver's library) answers for this kernel's GPUs.
    nvml: bool
    #: Abstract Unix sockets (``@name``) belong to this kernel's programs (irqbalance < 1.8).
    abstract_sockets: bool
    #: systemd and udevd of this root run, and may be told to reload what was installed.
    services: bool
    #: gputuned's own processes run on this kernel (the machine; not a tree): the daemon may
    #: set its own scheduling ([daemon] realtime_priority).
    runs_gputuned: bool
    #: The one user whose state files gputuned trusts under this root (root on a machine);
    #: None where any owner will do (a tree belongs to whoever made it).
    trusted_uid: int | None
    #: Writes this kernel is known to refuse, host path -> errno: what a captured tree's host
    #: refused at capture (``write_errors``). Plan relies on them as on knowledge of the host.
    recorded_refusals: Mapping[str, int]
    #: What NVML said when this tree was captured (``nvml`` of gputuned-tree.json), or None.
    recorded_nvml: Sequence[Mapping[str, Any]] | None

    # -- paths ----------------------------------------------------------------------------

    def path(self, hpath: str) -> Path:
        """The real path of host path ``hpath`` under the root (gputuned's own files, sockets)."""
        ...

    def resolve(self, hpath: str) -> str:
        """The canonical host path: links followed, never leaving the root."""
        ...

    # -- reads ----------------------------------------------------------------------------

    def exists(self, hpath: str) -> bool: ...

    def is_dir(self, hpath: str) -> bool: ...

    def is_link(self, hpath: str) -> bool: ...

    def listdir(self, hpath: str) -> list[str]:
        """Sorted entries of a directory."""
        ...

    def readlink(self, hpath: str) -> str: ...

    def char_device(self, hpath: str) -> tuple[int, int] | None:
        """(major, minor) of the character device ``hpath`` leads to (a descriptor under
        /proc/PID/fd); None for anything else, or when it is gone or not ours to read."""
        ...

    def mode(self, hpath: str) -> int:
        """Permission bits of a file."""
        ...

    def read_bytes(self, hpath: str, offset: int = 0, size: int = -1) -> bytes: ...

    def read_text(self, hpath: str) -> str: ...

    def read_value(self, hpath: str) -> str:
        """A one-value attribute without its trailing newline."""
        ...

    def read_optional(self, hpath: str) -> str | None:
        """Like :meth:`read_value`, None when the file does not exist."""
        ...

    # -- writes ---------------------------------------------------------------------------

    def write_bytes(self, hpath: str, data: bytes, offset: int | None = None) -> None:
        """One ``write(2)`` of ``data``; with ``offset``, in place (PCI config space)."""
        ...

    def write_text(self, hpath: str, text: str) -> None: ...

    def mkdir(self, hpath: str) -> None:
        """Make a directory (a cgroup comes with the files the kernel makes)."""
        ...

    def rmdir(self, hpath: str) -> None:
        """Remove a directory (a cgroup: Busy while it has processes or child cgroups)."""
        ...

    # -- processes and threads ------------------------------------------------------------

    def thread_group(self, tid: int) -> int:
        """The process (thread group ID) of thread ``tid``; TargetGone when there is none."""
        ...

    def set_nice(self, tid: int, nice: int) -> None:
        """Set one thread's nice value (-20..19)."""
        ...

    def set_affinity(self, tid: int, cpus: frozenset[int]) -> None:
        """Pin one thread to ``cpus``."""
        ...

    def set_scheduler(self, tid: int, policy: str, priority: int) -> None:
        """Set one thread's policy (other, fifo, rr, batch, idle) and real-time priority."""
        ...

    def move_to_cgroup(self, pid: int, cgroup_dir: str) -> None:
        """Move process ``pid`` with all its threads into the cgroup v2 directory."""
        ...

    def user_id(self, name: str) -> int | None:
        """The user ID of account ``name`` on this machine (or tree), None when there is none."""
        ...

    # -- systemd (PID 1: gputuned/kernel/systemd.py, gputuned/kernel/units.py) --------------

    @property
    def systemd(self) -> bool:
        """systemd is PID 1 here (sd_booted(3)): it owns its units' cgroups."""
        ...

    def unit_property(self, unit: str, name: str) -> str | None:
        """A unit's property as systemd holds it now: AllowedCPUs and Delegate as ``systemctl
        show`` prints them; CPUQuota and CPUWeight in the form an assignment takes ("" for the
        default: :mod:`gputuned.kernel.units`). None when no such unit is loaded."""
        ...

    def set_unit_property(self, unit: str, name: str, value: str) -> None:
        """``systemctl set-property --runtime UNIT NAME=VALUE``: systemd writes the cgroup;
        TargetGone when no such unit is loaded."""
        ...

    # -- mounts ---------------------------------------------------------------------------

    def remount(self, point: str, fstype: str, super_options: str) -> None:
        """Give the ``fstype`` filesystem at ``point`` exactly ``super_options``, keeping the
        mount's own flags."""
        ...

    def start_remount(self, point: str, fstype: str, super_options: str) -> Callable[[], None]:
        """Start :meth:`remount` in a thread; returns the function that waits for it and
        raises its error."""
        ...
