"""What every gputunectl command shares: the ``--root`` and ``--json`` options, JSON output."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputuned import root

#: A command: its parsed arguments in, its exit status out.
Handler = Callable[[argparse.Namespace], int]


def add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        type=root.host_root,
        default=Path("/"),
        help="read (and write) a captured host tree instead of this machine (a folder; a "
        "relative path is taken from the current folder)",
    )


#: -v and --json: before the command (gputunectl -v plan) or after it (gputunectl plan -v).
VERBOSE_HELP = "debug logging on stderr (before or after the command)"
JSON_HELP = "print machine-readable JSON (before or after the command)"


def add_json(p: argparse.ArgumentParser, does: str = JSON_HELP) -> None:
    """``--json`` after the command; no default, so that one given before it (the top parser's)
    is kept."""
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=does)


def add_active_profile(p: argparse.ArgumentParser) -> None:
    """An optional PROFILE (file or name) that defaults to the applied one."""
    p.add_argument(
        "profile",
        nargs="?",
        metavar="PROFILE",
        help="a profile file or name; default: the active one",
    )


def root_option(args: argparse.Namespace) -> str:
    """`` --root DIR`` when the command ran on a tree, for the commands it suggests next: a hint
    that drops it would send the user to this machine instead (issue 19, item 4)."""
    at = getattr(args, "root", None)
    return "" if at is None or Path(at) == Path("/") else f" --root {shlex.quote(str(at))}"


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
