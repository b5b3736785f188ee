"""Text others wrote, made safe to show on a terminal (issue 14, finding 15).

Any user can name a process (``prctl(PR_SET_NAME)``, setproctitle) or put anything in its command
line; those strings reach root's terminal through ``plan``, ``apply``, ``verify``, ``status``
and ``top``. An escape sequence in them would be run by the terminal (retitle it, rewrite what
is shown, on some terminals answer back as typed input), and a bidirectional override would
reorder the line. Every character Python does not call printable (C0 and C1 controls, DEL,
formatting characters such as U+202E, line and paragraph separators) is shown as its escape
instead: ``\\x1b``, ``\\u202e``.
"""

from __future__ import annotations

import logging


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` with every non-printable character escaped (``newlines``: keep ``\\n``)."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() or (newlines and ch == "\n") else _escape(ch) for ch in text
    )


def _escape(ch: str) -> str:
    n = ord(ch)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


class PrintableFormatter(logging.Formatter):
    """Log lines quote process names and command lines: shown like everything else here."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), newlines=True)
