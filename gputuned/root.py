"""``--root``: the machine, or a host tree; and the kernel backend that serves it.

``gputunectl`` and ``gputuned`` take ``--root DIR`` to work on a captured or built host tree
instead of this machine. This is the one place that chooses the backend of the kernel port
for it: :class:`~gputuned.kernel.live.LiveKernel` for ``/``, the simulated kernel
(:mod:`gputuned.sim`) for a tree. Everything past the command line takes the kernel it got.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gputuned.kernel.port import TREE_META, Kernel


def open_kernel(root: Path) -> Kernel:
    """The kernel of the machine (``/``) or of the host tree at ``root``."""
    # Imported here, each only when chosen: a command on a tree never loads the live backend,
    # one on this machine never the simulator, and --help neither (issue 31, item 2).
    if Path(root) == Path("/"):
        from gputuned.kernel.live import LiveKernel

        return LiveKernel()
    from gputuned.sim.tree import SimKernel

    return SimKernel(root)


def host_root(text: str) -> Path:
    """``--root``: ``/`` or an existing host tree. A relative path is taken from the current
    folder, here, once (``--root tree``, as docs/multi-gpu.md writes it: issue 31, item 5);
    a mistyped one is refused, never made on the first write (issue 14, finding 17)."""
    given = Path(text)
    try:
        path = given if given.is_absolute() else Path.cwd() / given
    except OSError as exc:  # the current folder was removed
        raise argparse.ArgumentTypeError(
            f"{text!r} is relative and the current folder is gone ({exc.strerror}); give the "
            "tree's absolute path"
        ) from None
    shown = text if given.is_absolute() else f"{text} ({path})"
    if path == Path("/"):
        return path
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{shown} is not a folder; check the path")
    if not ((path / TREE_META).is_file() or (path / "sys").is_dir() or (path / "proc").is_dir()):
        raise argparse.ArgumentTypeError(
            f"{shown} is not a host tree (no {TREE_META}, sys/ or proc/ in it); make one with "
            "gputunectl capture, or check the path"
        )
    return path
