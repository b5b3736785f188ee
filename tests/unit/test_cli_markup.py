"""gputuned/cli/markup.py prints what rich prints, without rich where there is no terminal."""

from __future__ import annotations

import io
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.markup import escape as rich_escape

from gputuned.cli import markup
from gputuned.cli.render import console, shown


def rich_prints(text: str) -> str:
    """What gputunectl's rich console prints for ``text`` into a pipe or a file."""
    out = io.StringIO()
    con = console()
    con.file = out
    con.print(text)
    return out.getvalue()


def lines_print(text: str, monkeypatch: pytest.MonkeyPatch) -> str:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    markup.Lines().print(text)
    return out.getvalue()


PIECES = st.sampled_from(
    ["[", "]", "\\", "/", ":", " ", "\n", "\t", "\x1b", "\r", "a", "bold", "[/]", "[bold]",
     "[yellow]", "[/bold]", "[link=x]", "[@click]", "[#ff0000]", ":smile:", ":x:", "é", "→",
     "漢", "\u200b", "\x85", "note", "="]
)  # fmt: skip
TEXT = st.lists(PIECES | st.text(max_size=5), max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_escape_is_riches(text: str) -> None:
    assert markup.escape(text) == rich_escape(text)


@settings(max_examples=400, deadline=None)
@given(TEXT, TEXT)
def test_plain_text_is_what_rich_prints(user: str, raw: str) -> None:
    """Other users' text shown inside gputunectl's tags, and raw markup of any shape: where
    plain() answers, rich prints the same (where rich refuses the markup, plain() must not
    answer)."""
    for text in (f"[yellow]note[/] {shown(user)}", f"[bold]{shown(user)}[/] x {shown(raw)}", raw):
        ours = markup.plain(text)
        try:
            theirs = rich_prints(text)
        except Exception:
            assert ours is None, text
            continue
        if ours is not None:
            assert ours + "\n" == theirs, text


@pytest.mark.parametrize(
    "text",
    [
        "No profile applied; the journal is empty.",
        "Active profile: [bold]shared-host[/] (/etc/gputuned/profiles/shared-host.toml)",
        "  [yellow]not possible here[/] pcie 0000\\[1]: firmware owns ASPM",
        "[bold red]          drifted[/] irq 42 live 0-3, wanted 1 — moved",
        "a" * 300,
        "ends in a backslash\\\\",
    ],
)
def test_gputunectl_lines_take_the_plain_way(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert markup.plain(text) is not None
    assert lines_print(text, monkeypatch) == rich_prints(text)


def test_a_terminal_or_rich_switches_go_to_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdout", Tty())
    assert not markup.Lines()._plain_here()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert markup.Lines()._plain_here()
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not markup.Lines()._plain_here()
