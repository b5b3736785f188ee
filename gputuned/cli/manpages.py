"""Man pages and bash completion, generated from the argument parsers and the profile models.

``python -m gputuned.cli.manpages DIR`` writes gputunectl.8, gputuned.8, gputuned-profile.5 and
gputunectl.bash-completion into DIR (scripts/build-deb puts them in the Debian package). They
are generated, never written by hand, so they cannot drift from ``--help`` and from
docs/profiles.md (the same text: ``render_profile_docs``).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from gputuned import __version__
from gputuned.userdocs import installed

_FILES = """\
.TP
.B /usr/share/gputuned/profiles/
Shipped profiles (replaced by upgrades).
.TP
.B /etc/gputuned/profiles/
Your profiles; one there overrides a shipped profile of the same name.
.TP
.B /etc/gputuned/active.json
The profile applied last; the service applies it at boot.
.TP
.B /run/gputuned/
Journal of every original value, lock, control socket.
"""

#: gputunectl(8)'s EXAMPLES, a day's commands in order (the tests parse each one).
EXAMPLES = (
    ("gputunectl recommend", "which shipped profile fits this host, and why"),
    (
        "gputunectl plan shared-host",
        "every change the shared-host profile would make; writes nothing",
    ),
    ("gputunectl apply shared-host", "make the host match it; every old value is journaled first"),
    ("gputunectl active", "the name of the profile applied here, or none"),
    ("gputunectl verify --strict", "compare the host with it: exit 1 when a setting drifted"),
    ("gputunectl status", "the journal, what could not be applied, the daemon's counters"),
    ("gputunectl register 4242", "place process 4242 by the first rule now (the daemon keeps it)"),
    ("gputunectl revert", "put back every value gputuned changed"),
    (
        "gputunectl plan shared-host --root /srv/trees/h200",
        "plan against a tree another host's gputunectl capture wrote",
    ),
)


def _esc(text: str) -> str:
    """Text for a roff line: backslashes doubled, a leading '.' or "'" made literal; the docs
    it cites named where the package installs them."""
    text = installed(text).replace("\\", "\\e")
    text = re.sub(r"(?m)^([.'])", r"\\&\1", text)
    return text.replace("-", "\\-")


def _inline(text: str) -> str:
    """Markdown's `code` as bold, **strong** as bold; everything else escaped."""
    parts = re.split(r"(`[^`]+`|\*\*[^*]+\*\*)", text)
    out = []
    for p in parts:
        if p.startswith("`") and p.endswith("`") and len(p) > 1:
            out.append(f"\\fB{_esc(p[1:-1])}\\fR")
        elif p.startswith("**") and p.endswith("**") and len(p) > 3:
            out.append(f"\\fB{_esc(p[2:-2])}\\fR")
        else:
            out.append(_esc(p))
    return "".join(out)


def _head(name: str, section: int, title: str) -> list[str]:
    date = time.strftime("%Y-%m-%d", time.gmtime())
    return [
        f'.TH {name.upper()} {section} "{date}" "gputuned {__version__}" "gputuned"',
        ".SH NAME",
        f"{_esc(name)} \\- {_esc(title)}",
    ]


def _actions(p: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for a in p._actions:
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction):
            yield a


def _options(p: argparse.ArgumentParser) -> list[str]:
    out = []
    for a in _actions(p):
        if a.help == argparse.SUPPRESS:
            continue
        # Each name in bold: "-v, --verbose" as \fB-v\fR, \fB--verbose\fR.
        names = a.option_strings or [str(a.metavar or a.dest.upper())]
        arg = f" {a.metavar or a.dest.upper()}" if a.option_strings and a.nargs != 0 else ""
        bold = ", ".join(f"\\fB{_esc(n)}\\fR" for n in names)
        out += [".TP", f"{bold}{_esc(arg)}", _inline(a.help or "")]
    return out


def _subcommands(p: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            helps = {c.dest: c.help or "" for c in a._choices_actions}
            return {name: (helps.get(name, ""), sub) for name, sub in a.choices.items()}
    return {}


def _usage(p: argparse.ArgumentParser) -> str:
    return " ".join(p.format_usage().removeprefix("usage: ").split())


def command_page(
    p: argparse.ArgumentParser, section: int, title: str, extra: list[str] | None = None
) -> str:
    name = p.prog
    out = _head(name, section, title)
    out += [".SH SYNOPSIS", f".B {_esc(_usage(p))}", ".SH DESCRIPTION"]
    out.append(_inline(p.description or title))
    out += extra or []
    opts = _options(p)
    if opts:
        out += [".SH OPTIONS", *opts]
    subs = _subcommands(p)
    if subs:
        out.append(".SH COMMANDS")
        for sub_name, (text, sub) in subs.items():
            out += [".SS " + _esc(sub_name), _inline(text), ".PP", f".B {_esc(_usage(sub))}"]
            out += [".RS", *_options(sub), ".RE"]
    if name == "gputunectl":
        out.append(".SH EXAMPLES")
        for command, meaning in EXAMPLES:
            out += [".TP", f".B {_esc(command)}", _inline(meaning)]
        out += exit_status()
    out += [".SH FILES", _FILES.rstrip("\n")]
    see = "gputuned (8), gputuned\\-profile (5)" if name == "gputunectl" else ""
    see = see or "gputunectl (8), gputuned\\-profile (5)"
    out += [".SH SEE ALSO", see.replace(" (", "(")]
    return "\n".join(out) + "\n"


def exit_status() -> list[str]:
    """The EXIT STATUS section: gputuned/exitcodes.py's table, as ``--help`` prints it."""
    from gputuned import exitcodes

    out = [".SH EXIT STATUS"]
    for c in exitcodes.TABLE:
        out += [".TP", f".B {c.code}", _inline(c.meaning)]
    for note in exitcodes.NOTES:
        out += [".PP", _inline(note)]
    return out


def markdown_page(markdown: str, name: str, section: int, title: str) -> str:
    """A man page from the Markdown of docs/profiles.md (headings, lists, code, tables)."""
    # The Markdown's opening paragraphs, before its first heading, say what the file is.
    return "\n".join([*_head(name, section, title), ".SH DESCRIPTION", *_roff(markdown)]) + "\n"


def _roff(markdown: str) -> list[str]:
    out: list[str] = []
    in_code = False
    for line in markdown.replace("``", "`").splitlines():
        if line.startswith("```"):
            out.append(".fi" if in_code else ".nf")
            in_code = not in_code
        elif in_code:
            out.append(_esc(line) or "\\&")
        elif line.startswith("<!--") or line.startswith("# "):
            continue
        elif line.startswith("## "):
            out.append(".SH " + _inline(line[3:].upper()))
        elif line.startswith("### "):
            out.append(".SS " + _inline(line[4:]))
        elif line.startswith("- "):
            out += [".IP \\(bu 2", _inline(line[2:])]
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                out += [".br", _inline("  |  ".join(cells))]
        elif not line.strip():
            out.append(".PP")
        else:
            out.append(_inline(line.strip()))
    return out


#: What a value is completed from (bash functions of the script below), by what the parser
#: calls it: folders, a file, a process, a profile's name or a .toml path.
_VALUE_KINDS = {"root": "dirs", "prefix": "dirs", "DIR": "dirs", "FILE": "files"}
_VALUE_KINDS |= {"PID": "pids", "pid": "pids", "PROFILE": "profiles"}


def _completes(a: argparse.Action) -> str:
    """The bash words that complete ``a``'s value: its choices, or a helper by
    :data:`_VALUE_KINDS`; ``return`` (nothing) for a value no list can guess (a number)."""
    if a.choices:
        return f'COMPREPLY=( $(compgen -W "{" ".join(map(str, a.choices))}" -- "$cur") )'
    kind = _VALUE_KINDS.get(str(a.metavar)) or _VALUE_KINDS.get(a.dest)
    return f"__gputunectl_{kind}" if kind else "return"


def _command_case(name: str, sub: argparse.ArgumentParser) -> str:
    """One command's case: an option's value after the option, else a positional's value
    (unless the word starts with ``-``), else the command's options."""
    actions = list(_actions(sub))
    opts = " ".join(o for a in actions for o in a.option_strings)
    values = [
        f"                {'|'.join(a.option_strings)}) "
        + ("return ;;" if then == "return" else f"{then}; return ;;")
        for a in actions
        if a.option_strings and a.nargs != 0
        for then in [_completes(a)]
    ]
    positional = next((_completes(a) for a in actions if not a.option_strings), "")
    lines = [f"        {name})"]
    if values:
        lines += ["            case $prev in", *values, "            esac"]
    if positional and positional != "return":
        lines.append(f"            [[ $cur == -* ]] || {{ {positional}; return; }}")
    lines += [f'            COMPREPLY=( $(compgen -W "{opts} --help" -- "$cur") ) ;;']
    return "\n".join(lines)


def bash_completion(p: argparse.ArgumentParser) -> str:
    """A bash completion for gputunectl: commands, each command's options, and their values:
    folders for ``--root``, PIDs for ``register``, profile names or ``.toml`` paths."""
    subs = _subcommands(p)
    top = " ".join(subs)
    body = "\n".join(_command_case(name, sub) for name, (_text, sub) in subs.items())
    return f"""# bash completion for gputunectl (generated by python -m gputuned.cli.manpages from its parser)

__gputunectl_dirs() {{
    compopt -o filenames 2>/dev/null
    COMPREPLY=( $(compgen -d -- "$cur") )
}}

__gputunectl_files() {{
    compopt -o filenames 2>/dev/null
    COMPREPLY=( $(compgen -f -- "$cur") )
}}

__gputunectl_pids() {{
    local p pids=()
    for p in /proc/[0-9]*; do pids+=( "${{p#/proc/}}" ); done
    COMPREPLY=( $(compgen -W "${{pids[*]}}" -- "$cur") )
}}

# A PROFILE is a path when it has a / or ends in .toml, else a name in the profile folders
# (gputunectl(8), FILES): names from those folders, .toml files and folders for paths.
__gputunectl_profiles() {{
    local d f names=()
    compopt -o filenames 2>/dev/null
    if [[ $cur != */* ]]; then
        for d in /etc/gputuned/profiles /usr/share/gputuned/profiles; do
            for f in "$d"/*.toml; do [ -e "$f" ] && f=${{f##*/}} && names+=( "${{f%.toml}}" ); done
        done
    fi
    COMPREPLY=( $(compgen -W "${{names[*]}}" -- "$cur") $(compgen -d -- "$cur") )
    COMPREPLY+=( $(compgen -f -X '!*.toml' -- "$cur") )
}}

_gputunectl() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} cmd=""
    local i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${{COMP_WORDS[i]}} in -*) ;; *) cmd=${{COMP_WORDS[i]}}; break ;; esac
    done
    if [[ -z $cmd ]]; then
        COMPREPLY=( $(compgen -W "{top} --help --version --verbose --json" -- "$cur") )
        return
    fi
    case $cmd in
{body}
    esac
}}
complete -F _gputunectl gputunectl
"""


def write_all(dest: Path) -> list[Path]:
    from gputuned.cli.main import build_parser
    from gputuned.daemon.main import build_parser as daemon_parser
    from gputuned.profile.schema import render_profile_docs

    ctl = build_parser()
    pages = {
        "gputunectl.8": command_page(ctl, 8, "tune a Linux host for GPU inference servers"),
        "gputuned.8": command_page(
            daemon_parser(),
            8,
            "the service that keeps a gputuned profile applied",
            [".PP", *_roff(_daemon_doc())],
        ),
        "gputuned-profile.5": markdown_page(
            render_profile_docs(), "gputuned-profile", 5, "gputuned profile files (TOML)"
        ),
        "gputunectl.bash-completion": bash_completion(ctl),
    }
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in pages.items():
        (dest / name).write_text(text)
        out.append(dest / name)
    return out


def _daemon_doc() -> str:
    import importlib

    doc = importlib.import_module("gputuned.daemon").__doc__ or ""  # the service's manual
    return doc.split("\n\n", 1)[1] if "\n\n" in doc else doc


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        sys.stderr.write("usage: python -m gputuned.cli.manpages DIR\n")
        return 64
    for path in write_all(Path(args[0])):
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
