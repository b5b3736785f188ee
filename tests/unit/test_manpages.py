"""Man pages and bash completion generated from the parsers and the profile models (issue 19)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gputuned.cli.main import build_parser
from gputuned.cli.manpages import _subcommands, write_all
from gputuned.profile.model import Profile


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    dest = tmp_path_factory.mktemp("man")
    return {p.name: p.read_text() for p in write_all(dest)}


def test_gputunectl_page_has_every_command_and_option(pages: dict[str, str]) -> None:
    page = pages["gputunectl.8"]
    assert page.startswith(".TH GPUTUNECTL 8 ")
    for name, (_help, sub) in _subcommands(build_parser()).items():
        assert f".SS {name.replace('-', chr(92) + '-')}\n" in page, name
        for action in sub._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert f"\\fB{opt.replace('-', chr(92) + '-')}" in page, (name, opt)
    assert "/usr/share/gputuned/profiles/" in page


def test_daemon_page_says_what_each_signal_does(pages: dict[str, str]) -> None:
    page = pages["gputuned.8"]
    assert page.startswith(".TH GPUTUNED 8 ")
    for sig in ("SIGHUP", "SIGTERM", "SIGUSR1", "SIGUSR2"):
        assert sig in page, sig
    assert "\\fB\\-\\-profile\\fR" in page


def test_profile_page_documents_every_top_level_key(pages: dict[str, str]) -> None:
    page = pages["gputuned-profile.5"]
    assert page.startswith(".TH GPUTUNED-PROFILE 5 ")
    for key in Profile.model_fields:
        assert f"\\fB{key.replace('-', chr(92) + '-')}\\fR" in page, key
    assert "```" not in page and "<!--" not in page  # Markdown converted, not copied


def test_no_line_is_taken_for_a_roff_request(pages: dict[str, str]) -> None:
    """A text line starting with '.' or "'" would be read as a request and vanish."""
    requests = {".TH", ".SH", ".SS", ".TP", ".PP", ".IP", ".RS", ".RE", ".B", ".nf", ".fi", ".br"}
    for name, page in pages.items():
        if name.endswith("bash-completion"):
            continue
        for line in page.splitlines():
            if line.startswith((".", "'")):
                assert line.split(" ", 1)[0] in requests, (name, line)


def _complete(script: Path, *words: str) -> list[str]:
    cmd = (
        f"source {script}; COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; "
        '_gputunectl; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True)
    return sorted(filter(None, out.stdout.splitlines()))


def test_bash_completion(pages: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "gputunectl"
    script.write_text(pages["gputunectl.bash-completion"])
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert _complete(script, "gputunectl", "re") == ["recommend", "register", "revert"]
    assert "--strict" in _complete(script, "gputunectl", "verify", "--s")
    assert _complete(script, "gputunectl", "list", "--j") == ["--json"]
