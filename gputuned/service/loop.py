"""The daemon's event loop: one selector over signals, sockets and timers. Single-threaded.

Signals are turned into readable bytes with ``signal.set_wakeup_fd`` (PEP 475 style), so a
handler never runs inside the middle of an apply: the loop takes them in order, between tasks.

Readers run in order of their ``priority`` (lowest first), so that process events are taken
before a burst of scrapes or control requests that became readable at the same time. Every
handler is guarded: an exception it raises is logged with its traceback and the loop goes on,
because no input, however malformed, may end a daemon that holds the host tuned (issue 14).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Handler = Callable[[int], None]


class Loop:
    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._signals: dict[int, Handler] = {}
        self._readers: dict[int, tuple[int, Handler]] = {}
        self._writers: dict[int, Handler] = {}
        self.sel.register(self._r, selectors.EVENT_READ)

    def on_signal(self, signum: int, handler: Handler) -> None:
        self._signals[signum] = handler
        signal.signal(signum, lambda *_: None)  # the byte on the wakeup fd does the work
        signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)

    def add_reader(self, fd: int, handler: Handler, *, priority: int = 0) -> None:
        self._readers[fd] = (priority, handler)
        self._update(fd)

    def remove_reader(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            self._update(fd)

    def add_writer(self, fd: int, handler: Handler) -> None:
        self._writers[fd] = handler
        self._update(fd)

    def remove_writer(self, fd: int) -> None:
        if self._writers.pop(fd, None) is not None:
            self._update(fd)

    def _update(self, fd: int) -> None:
        mask = (selectors.EVENT_READ if fd in self._readers else 0) | (
            selectors.EVENT_WRITE if fd in self._writers else 0
        )
        try:
            registered = self.sel.get_key(fd).events
        except KeyError:
            registered = 0
        if mask == registered:
            return
        if not registered:
            self.sel.register(fd, mask)
        elif not mask:
            self.sel.unregister(fd)
        else:
            self.sel.modify(fd, mask)

    def run_once(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds; dispatch signals first, then writers, then readers
        by priority."""
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
                        _guarded(h, signum, f"signal {signum}")
        ready = [(int(key.fd), mask) for key, mask in events if key.fd != self._r]
        for fd, mask in ready:
            if mask & selectors.EVENT_WRITE and (w := self._writers.get(fd)) is not None:
                _guarded(w, fd, f"fd {fd} (writable)")
        readable = [fd for fd, mask in ready if mask & selectors.EVENT_READ]
        readable.sort(key=lambda fd: self._readers.get(fd, (0, None))[0])
        for fd in readable:
            # Looked up again: a handler that ran before may have removed this one.
            entry = self._readers.get(fd)
            if entry is not None:
                _guarded(entry[1], fd, f"fd {fd}")

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        self.sel.close()
        os.close(self._r)
        os.close(self._w)


def _guarded(handler: Handler, arg: int, what: str) -> None:
    try:
        handler(arg)
    except Exception:
        log.exception("loop: the handler of %s failed; the daemon goes on", what)


def now() -> float:
    return time.monotonic()
