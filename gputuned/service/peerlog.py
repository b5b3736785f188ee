"""How many log lines one peer of the control socket may cause. A member of the control group
may send requests as fast as the socket answers them; each request the daemon logs is a line
in root's journal, so without a bound a peer fills it (2,244 requests wrote 146 MB in 5 s:
issue 30). Root's requests are not limited: root can write the journal anyway."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("gputuned")


class PeerLogLimit:
    """At most ``per_window`` lines per user in ``window_s`` seconds; the first line after a
    window in which some were left out says how many."""

    def __init__(
        self,
        per_window: int = 20,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_window = per_window
        self.window_s = window_s
        self.clock = clock
        #: uid -> (start of its window, lines in it, lines left out of it)
        self._seen: dict[int, tuple[float, int, int]] = {}

    def allow(self, uid: int) -> bool:
        """May a line caused by user ``uid`` be logged now?"""
        if uid == 0:
            return True
        now = self.clock()
        start, lines, left_out = self._seen.get(uid, (now, 0, 0))
        if now - start >= self.window_s:
            if left_out:
                log.info(
                    "control socket: %d log lines caused by uid %d in %.0f s were left out",
                    left_out,
                    uid,
                    now - start,
                )
            start, lines, left_out = now, 0, 0
        lines += 1
        allowed = lines <= self.per_window
        self._seen[uid] = (start, lines, left_out + (not allowed))
        if len(self._seen) > 4096:  # users who stopped long ago
            self._seen = {u: v for u, v in self._seen.items() if now - v[0] < self.window_s}
        return allowed


#: The daemon's: the control server's refusals and the daemon's request lines share it.
PEER_LOG = PeerLogLimit()
