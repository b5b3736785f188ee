"""How a gputunectl command ends: its errors (on stderr, and as JSON on stdout under ``--json``),
usage errors (exit 64), and a stdout whose reader went away (issue 19, item 3).

The exit codes are gputuned/exitcodes.py's table; nothing here invents another.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO, cast

from gputuned import errors


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error raises :class:`errors.UsageError` (exit 64) instead of
    exiting 2, a code verify returns as a result ("pending reboot"). Subcommand parsers are of
    the same class (argparse makes them with ``type(parent)``)."""

    def error(self, message: str) -> NoReturn:
        raise ParseError(message, self.prog, self.format_usage().strip())


class ParseError(errors.UsageError):
    """What argparse refused, with the usage line of the (sub)command it was parsing."""

    def __init__(self, message: str, prog: str, usage: str) -> None:
        super().__init__(f"{message}\n{usage}")
        self.message = message
        self.usage = usage
        #: The command being parsed ("gputunectl plan" -> "plan"); None before one was named.
        self.command = prog.partition(" ")[2] or None


def wants_json(argv: Sequence[str]) -> bool:
    """``--json`` on the command line, also when it could not be parsed (argparse takes any
    unambiguous prefix, such as ``--js``)."""
    for arg in argv:
        if arg == "--":
            return False
        if len(arg) >= 4 and "--json".startswith(arg):
            return True
    return False


def error_json(command: str | None, exc: BaseException, code: int, text: str) -> dict[str, Any]:
    """The JSON object an error prints on stdout under ``--json``: what went wrong, the exit
    status, and what each kind of error carries (a profile's problems, apply's report)."""
    from gputuned.engine.apply import ApplyError

    out: dict[str, Any] = {
        "ok": False,
        "command": command,
        "error": text,
        "error_class": errors.class_name(exc),
        "exit_code": code,
    }
    if isinstance(exc, errors.ProfileError | errors.DaemonError) and exc.problems is not None:
        out["problems"] = [{"key": k, "message": m} for k, m in exc.problems]
    if isinstance(exc, ApplyError):
        out.update(exc.report.to_json())
    if isinstance(exc, errors.HostError) and exc.path:
        out["path"] = exc.path
    if isinstance(exc, ParseError):
        out.update(command=exc.command, error=exc.message, usage=exc.usage)
    return out


class ReaderGuard:
    """stdout, where a reader that stops reading (``| head``, ``grep -q``) ends the output and
    not the command: the command finishes and exits with its own status, so ``verify | head``
    still says whether something drifted.

    Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError. From then on
    stdout is /dev/null (dup2 over its file descriptor, the way Python's signal documentation
    recommends), so what is still buffered, and what the command writes later, goes nowhere
    instead of failing again when the interpreter flushes stdout at exit (status 120).
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        from gputuned.kernel.stdio import discard

        self.gone = True
        discard(self.stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def guard_stdout() -> TextIO:
    """Put a :class:`ReaderGuard` on sys.stdout; returns what to put back."""
    previous = sys.stdout
    if not isinstance(previous, ReaderGuard):
        sys.stdout = cast(TextIO, ReaderGuard(previous))
    return previous


def reader_gone() -> bool:
    """True once nobody reads stdout any more (a command that runs until stopped, like top,
    stops then)."""
    out: object = sys.stdout
    return isinstance(out, ReaderGuard) and out.gone
