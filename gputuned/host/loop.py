"""The daemon's event loop: one selector over signals, sockets and timers. Single-threaded.

Signals are turned into readable bytes with ``signal.set_wakeup_fd`` (PEP 475 style), so a
handler never runs inside the middle of an apply: the loop takes them in order, between tasks.
"""

from __future__ import annotations

import os
import selectors
import signal
import time
from collections.abc import Callable


class Loop:
    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._signals: dict[int, Callable[[int], None]] = {}
        self._readers: dict[int, Callable[[int], None]] = {}
        self.sel.register(self._r, selectors.EVENT_READ)

    def on_signal(self, signum: int, handler: Callable[[int], None]) -> None:
        self._signals[signum] = handler
        signal.signal(signum, lambda *_: None)  # the byte on the wakeup fd does the work
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)

    def add_reader(self, fd: int, handler: Callable[[int], None]) -> None:
        if fd in self._readers:
            self._readers[fd] = handler
            return
        self._readers[fd] = handler
        self.sel.register(fd, selectors.EVENT_READ)

    def remove_reader(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            self.sel.unregister(fd)

    def run_once(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds; dispatch signals first, then readable fds."""
        events = self.sel.select(max(0.0, timeout))
        for key, _ in events:
            if key.fd == self._r:
                try:
                    data = os.read(self._r, 512)
                except BlockingIOError:
                    data = b""
                # Each signal once per wake-up, as the kernel keeps a standard signal pending
                # only once: a storm of SIGHUPs is one reload, not fifty.
                for signum in dict.fromkeys(data):
                    h = self._signals.get(signum)
                    if h is not None:
                        h(signum)
        for key, _ in events:
            h2 = self._readers.get(int(key.fd))
            if h2 is not None:
                h2(int(key.fd))

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        self.sel.close()
        os.close(self._r)
        os.close(self._w)


def now() -> float:
    return time.monotonic()
