"""The process's own standard streams, where the CLI needs a system call on them."""

from __future__ import annotations

import os


def discard(fd: int) -> None:
    """Point ``fd`` at /dev/null (dup2), so what is still written to it, and what the
    interpreter flushes at exit, goes nowhere: for a stdout whose reader went away (EPIPE),
    as Python's signal documentation recommends for SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def environment_has(names: tuple[str, ...]) -> bool:
    """Whether any of ``names`` is set in this process's environment (rich's colour switches,
    which decide how a line is printed)."""
    return any(name in os.environ for name in names)
