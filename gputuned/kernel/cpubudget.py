"""Stop a computation that runs past a budget of CPU time: ITIMER_VIRTUAL and SIGVTALRM.

What it is for: regular expressions from a profile searched in command lines that other users
write (tuners/cmdmatch.py). Python's regex engine checks for signals while it matches, every
4096 steps (Modules/_sre/sre_lib.h, MAYBE_CHECK_SIGNALS), so an exception raised by a signal
handler ends a search that would otherwise run for minutes. The timer counts this process's
user CPU time (setitimer(2) ITIMER_VIRTUAL), not wall time: a loaded host does not make a
search look slow, and a search that is slow stays slow on an idle one.

Signal handlers can only be set from the main thread; elsewhere :meth:`CpuBudget.run` measures
instead (time.thread_time()) and raises :class:`Overrun` after the fact, so the answer is the
same, only not cut short.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Self, TypeVar

T = TypeVar("T")


class Overrun(Exception):
    """The computation ran past its CPU budget; it was stopped (or, measured, ended late)."""


class CpuBudget:
    """``with CpuBudget(0.05) as b: b.run(fn)``: each ``run`` gets ``seconds`` of CPU.

    The handler is set once for the ``with`` block (the previous one is put back at its end);
    each :meth:`run` arms a one-shot timer and disarms it again, two setitimer calls.
    """

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"a CPU budget must be positive, not {seconds}")
        self.seconds = seconds
        self._active = False
        self._armed = False
        self._old: Any = None

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGVTALRM, self._expired)
            self._armed = True
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._armed:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            signal.signal(signal.SIGVTALRM, self._old)
            self._armed = False

    def _expired(self, _sig: int, _frame: FrameType | None) -> None:
        # A signal that lands after run() has returned (generated just before the disarm) must
        # not end whatever runs next.
        if self._active:
            self._active = False
            raise Overrun(f"ran past its budget of {self.seconds * 1e3:.0f} ms of CPU")

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()``, or :class:`Overrun` once it has used ``seconds`` of CPU."""
        if not self._armed:
            t0 = time.thread_time()
            out = fn()
            if time.thread_time() - t0 > self.seconds:
                raise Overrun(f"took longer than its budget of {self.seconds * 1e3:.0f} ms of CPU")
            return out
        self._active = True
        signal.setitimer(signal.ITIMER_VIRTUAL, self.seconds)
        try:
            return fn()
        finally:
            self._active = False
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
