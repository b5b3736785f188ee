"""The exit status of every gputunectl command: one table, shown by ``gputunectl --help``, the
gputunectl(8) man page and docs/usage.md (issue 19, item 3).

A code means one thing whatever the command, so a script can act on it without knowing which
command ran: 1 and 2 are results (verify's "drifted", "pending reboot"), never errors; a usage
error is 64 (``EX_USAGE`` of sysexits.h), which no command returns as a result.
"""

from __future__ import annotations

from dataclasses import dataclass

OK = 0
DRIFTED = 1
PENDING_REBOOT = 2
ERROR = 3
REFUSED = 4
USAGE = 64
INTERNAL = 70
INTERRUPTED = 130


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str


TABLE = (
    ExitCode(OK, "done; verify: everything applied is in place"),
    ExitCode(
        DRIFTED,
        "verify: a setting drifted, or with --strict is not possible here; recommend: no "
        "shipped profile fits",
    ),
    ExitCode(PENDING_REBOOT, "verify: only boot arguments are pending; reboot with them"),
    ExitCode(
        ERROR,
        'error: what failed and what to do is on stderr (and in --json\'s "error"); apply, '
        "revert, install-system: a setting could not be written or put back",
    ),
    ExitCode(
        REFUSED,
        "no such profile, the profile is invalid, or this host cannot take it (plan's blocked "
        "line); "
        "install-system: a user other than root could change the gputuned it would run; "
        "nothing was changed",
    ),
    ExitCode(USAGE, "usage: an unknown command or option, or a bad argument; nothing was done"),
    ExitCode(INTERNAL, "a bug in gputunectl: run again with -v and report the traceback"),
    ExitCode(INTERRUPTED, "interrupted (Ctrl-C)"),
)

#: What the table cannot say in a row, said the same way everywhere it is printed.
NOTES = (
    "Under --json every error is also a JSON object on stdout: "
    '{"ok": false, "error": ..., "exit_code": ...}.',
    "Through the daemon a command exits with the code it has without one: the daemon's "
    "error reply carries it.",
    "A reader that stops early (| head) changes nothing: the output it leaves is dropped and "
    "the command exits with its own status (top stops, with 0).",
)


def help_text(width: int = 79) -> str:
    """The table for ``gputunectl --help`` (its epilog), wrapped to ``width`` columns."""
    import textwrap

    digits = max(len(str(c.code)) for c in TABLE)
    lines = ["exit status (every command):"]
    for c in TABLE:
        head = f"  {c.code:>{digits}}  "
        lines += textwrap.wrap(
            c.meaning, width, initial_indent=head, subsequent_indent=" " * len(head)
        )
    lines.append("")
    for note in NOTES:
        lines += textwrap.wrap(note, width)
    return "\n".join(lines)


def markdown_table() -> str:
    """The table as docs/usage.md prints it (a test compares the two)."""
    lines = ["| exit | meaning |", "|---|---|"]
    lines += [f"| {c.code} | {c.meaning} |" for c in TABLE]
    return "\n".join(lines)
