"""systemd integration: sd_notify, the watchdog interval, logging, and "is the system stopping".

All of it degrades quietly without systemd: no NOTIFY_SOCKET, no notifications; no
systemd-python, logs to stderr with syslog priority prefixes ("<3>...") that journald
understands when it captures stderr (SyslogLevelPrefix=yes, the default).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from typing import ClassVar

from gputuned.textsafe import printable

log = logging.getLogger(__name__)


class Notifier:
    """sd_notify(3) over the NOTIFY_SOCKET datagram socket (abstract "@..." names too)."""

    def __init__(self) -> None:
        addr = os.environ.get("NOTIFY_SOCKET", "")
        self.addr = "\0" + addr[1:] if addr.startswith("@") else addr

    @property
    def enabled(self) -> bool:
        return bool(self.addr)

    def send(self, *fields: str) -> None:
        msg = "\n".join(fields)
        if not self.addr:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.connect(self.addr)
                s.sendall(msg.encode())
        except OSError as exc:
            log.warning("daemon: sd_notify %r failed: %s", fields[0], exc)


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WatchdogSec=), or None when not asked for.

    sd_watchdog_enabled(3): WATCHDOG_USEC set, and WATCHDOG_PID unset or ours.
    """
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


#: Characters of a log message kept; the rest is counted.
MAX_MESSAGE = 2000


class _PriorityPrefix(logging.Formatter):
    """<N> syslog priority prefix, as sd-daemon(3) describes, for journald via stderr."""

    _LEVELS: ClassVar[dict[int, int]] = {
        logging.DEBUG: 7,
        logging.INFO: 6,
        logging.WARNING: 4,
        logging.ERROR: 3,
    }

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802  (logging's name)
        # ``%(where)s``: the logger under gputuned's own, ``engine.apply: ``; none for the
        # daemon's ``gputuned`` (journald names the line ``gputuned[PID]:`` already).
        where = record.name.removeprefix("gputuned").removeprefix(".")
        record.where = f"{where}: " if where else ""
        # The message quotes process names, command lines, profiles and peers' requests:
        # other users' text (textsafe), on one line (a newline there would start a line of
        # its own, with a priority prefix of the sender's choosing) and bounded.
        msg = printable(record.message)
        if len(msg) > MAX_MESSAGE:
            msg = f"{msg[:MAX_MESSAGE]}... ({len(msg) - MAX_MESSAGE} more characters)"
        return self._style.format(logging.makeLogRecord({**record.__dict__, "message": msg}))

    def format(self, record: logging.LogRecord) -> str:
        prio = self._LEVELS.get(record.levelno, 2)
        # A traceback's lines each get the record's own prefix: journald reads a priority only
        # at the start of a line, so text inside one stays text.
        lines = super().format(record).split("\n")
        return "\n".join(f"<{prio}>{printable(line)}" for line in lines)


def setup_logging(*, debug: bool, to_journal: bool) -> str:
    """Configure the root logger; returns "journal" or "stderr"."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    if to_journal:
        try:
            from systemd import journal  # type: ignore[attr-defined]  # optional: systemd-python

            root.addHandler(journal.JournalHandler(SYSLOG_IDENTIFIER="gputuned"))
            return "journal"
        except ImportError:
            pass
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(_PriorityPrefix("%(where)s%(message)s"))
    root.addHandler(h)
    return "stderr"


def system_stopping() -> bool:
    """True while systemd (PID 1) shuts the system down ("systemctl is-system-running":
    stopping), so a stop can skip the revert when the profile allows it."""
    exe = shutil.which("systemctl")
    if not exe or not os.path.isdir("/run/systemd/system"):
        return False
    try:
        out = subprocess.run(
            [exe, "is-system-running"], capture_output=True, text=True, timeout=2, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "stopping"


def own_pid() -> int:
    return os.getpid()
