"""Facts of this machine an integration test may need, each checked without changing anything.

A plain container is not CI's machine kind: its ``/proc/irq`` and ``/sys`` are read-only, its
network namespace has no proc connector (the kernel serves it to the initial one only), its
cgroups may be v1. A test that needs such a fact says so with ``@pytest.mark.needs("fact")``;
where the fact is missing, the test is reported as not run, with what was found, never as
passed and never as failed (tests/integration/conftest.py). Each check returns ``None`` where
the fact holds, else why it does not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from gputuned import errors


def _writes_back(path: str) -> str | None:
    """Write a file's own value back to it: the kernel takes it as a write (the same value
    changes nothing), or says why not (EROFS: a read-only mount; EPERM, EACCES)."""
    p = Path(path)
    try:
        text = p.read_text()
        with p.open("r+") as f:
            f.write(text)
    except OSError as exc:
        return f"writing {path} back unchanged: {exc.strerror} (errno {exc.errno})"
    return None


def movable_irq() -> str | None:
    """IRQ affinities can be written: the IRQ tuner's apply writes default_smp_affinity."""
    why = _writes_back("/proc/irq/default_smp_affinity")
    return why and f"no movable IRQ here: {why}"


def proc_connector() -> str | None:
    """The kernel's proc connector answers this process (the daemon's process events)."""
    from gputuned.service.procwatch import NetlinkWatcher

    try:
        NetlinkWatcher().close()
    except (errors.GputunedError, OSError) as exc:
        return f"no proc connector in this network namespace: {exc}"
    return None


def writable_workqueues() -> str | None:
    """The unbound workqueues' CPU mask can be written (/sys is read-only in a container)."""
    path = "/sys/devices/virtual/workqueue/cpumask"
    if not Path(path).exists():
        return f"this kernel has no {path} (Linux before 4.2)"
    why = _writes_back(path)
    return why and f"the workqueues' CPU mask cannot be written: {why}"


FACTS: dict[str, Callable[[], str | None]] = {
    "movable_irq": movable_irq,
    "proc_connector": proc_connector,
    "writable_workqueues": writable_workqueues,
}


@functools.cache
def missing(fact: str) -> str | None:
    """Why ``fact`` does not hold on this machine, or None; checked once a run."""
    if fact not in FACTS:
        raise ValueError(f"no fact {fact!r}; known: {', '.join(FACTS)}")
    return FACTS[fact]()
