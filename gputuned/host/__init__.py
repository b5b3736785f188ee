"""The only door to the machine.

Every read and write of /sys, /proc, /etc, /run, cgroup files and PCI config space goes through a
:class:`Host` rooted at a directory: ``/`` for the live machine, or a captured tree for tests and
``--root``. Paths are joined component by component and may not contain ``..``; symbolic links
inside the tree are followed without ever leaving the root (an absolute link target is taken
relative to the root, as ``chroot`` would).

``OSError`` is translated here, once, into :mod:`gputuned.errors`.
"""

from __future__ import annotations

from gputuned.host.fs import Fault, Host, WriteRecord

__all__ = ["Fault", "Host", "WriteRecord"]
