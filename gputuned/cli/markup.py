"""Lines of rich markup, printed without loading rich where rich would print them plain.

Loading rich costs every command that prints tens of milliseconds (issue 31, item 2), while a
command whose output goes to a pipe or a file (a script, a monitoring check: where status and
verify run most) prints no colour: rich then prints the markup's text without its tags. That
is all :meth:`Lines.print` does itself, and only when it is sure to print what rich would: on
a terminal, with rich's colour switches in the environment, or for text rich might change
(control characters, tabs, ``:name:`` emoji codes, tags beyond plain style names, markup rich
refuses) it hands the line to rich. tests/unit/test_cli_markup.py compares the two.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, TextIO

from gputuned.kernel.stdio import environment_has

if TYPE_CHECKING:
    from rich.console import Console

# rich/markup.py's patterns: a tag with the backslashes before it, and what escape() escapes.
_TAGS = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")
_ESCAPE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
# An opening tag of style names only, as gputuned writes them: "[bold red]".
_STYLE = re.compile(r"[a-z]+(?: [a-z]+)*")
# rich/_emoji_replace.py's pattern: rich replaces a known :name: in printed text.
_EMOJI = re.compile(r"(:(\S*?)(?:(?:\-)(emoji|text))?:)")
# What makes rich print a terminal's output when there is none, or none when there is one.
_RICH_ENV = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "JUPYTER_COLUMNS")


def escape(text: str) -> str:
    """rich.markup.escape: ``text`` printed as it is, not read as markup."""

    def backslashes(match: re.Match[str]) -> str:
        slashes, tag = match.groups()
        return f"{slashes}{slashes}\\{tag}"

    text = _ESCAPE.sub(backslashes, text)
    if text.endswith("\\") and not text.endswith("\\\\"):
        return text + "\\"
    return text


def _control(c: str) -> bool:
    """A character rich drops, expands (a tab) or that a terminal would act on."""
    return (c < " " and c != "\n") or "\x7f" <= c <= "\x9f"


def plain(markup: str) -> str | None:
    """The text rich prints for ``markup`` without colour, or None when it is not sure to be
    this (rich then prints it)."""
    if _EMOJI.search(markup) or any(_control(c) for c in markup):
        return None
    if "[" not in markup:
        return markup
    out: list[str] = []
    open_tags = 0
    position = 0
    for match in _TAGS.finditer(markup):
        full, slashes, tag = match.groups()
        start, end = match.span()
        out.append(markup[position:start].replace("\\[", "["))
        position = end
        literal, escaped = divmod(len(slashes), 2)
        out.append("\\" * literal)
        if escaped:
            out.append(full[len(slashes) :])
        elif tag == "/":
            if not open_tags:
                return None  # rich refuses it (MarkupError): rich says so
            open_tags -= 1
        elif _STYLE.fullmatch(tag):
            open_tags += 1
        else:
            return None  # a named close, a link, a handler, a colour: rich's to read
    out.append(markup[position:].replace("\\[", "["))
    return "".join(out)


def console(*, stderr: bool = False) -> Console:
    """gputunectl's rich console: for tables, a terminal, and what :class:`Lines` hands on."""
    from rich.console import Console

    out = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not out.is_terminal:
        out.width = 160  # piped into a log or a file: rich would assume 80 columns
    return out


class Lines:
    """Prints lines of markup on stdout (or stderr), as ``console().print`` would."""

    def __init__(self, *, stderr: bool = False) -> None:
        self.stderr = stderr
        self._rich: Console | None = None

    @property
    def file(self) -> TextIO:
        return sys.stderr if self.stderr else sys.stdout

    def _plain_here(self) -> bool:
        if environment_has(_RICH_ENV):
            return False
        isatty = getattr(self.file, "isatty", None)
        try:
            return isatty is not None and not isatty()
        except ValueError:  # closed
            return False

    def print(self, markup: str) -> None:
        text = plain(markup) if self._plain_here() else None
        if text is not None:
            self.file.write(text + "\n")
            return
        if self._rich is None:
            self._rich = console(stderr=self.stderr)
        self._rich.print(markup)
