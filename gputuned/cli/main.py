"""``gputunectl``: the command line. The parser and the commands that need no profile
(inspect, capture, schema, install-system, uninstall-system, top); the tuning commands are in
:mod:`gputuned.cli.tuning`."""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gputuned import __version__, errors, exitcodes, root
from gputuned.cli.args import JSON_HELP, VERBOSE_HELP, Handler, add_json, add_root, print_json
from gputuned.cli.output import ParseError, Parser, error_json, guard_stdout, wants_json
from gputuned.cli.trial import add_trial_command
from gputuned.cli.tuning import add_tuning_commands, cmd_plan
from gputuned.textsafe import PrintableFormatter

log = logging.getLogger("gputunectl")


def cmd_inspect(args: argparse.Namespace) -> int:
    from gputuned.cli.render import render_inspect
    from gputuned.engine.inspect import inspect

    data = inspect(root.open_kernel(args.root), all_functions=args.all)
    if args.json:
        print_json(data)
    else:
        render_inspect(data, all_functions=args.all)
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    from gputuned.cli.render import console
    from gputuned.kernel.capture import capture

    err = console(stderr=True)
    meta = capture(
        root.open_kernel(args.root),
        args.dir,
        probe_writes=args.probe_writes,
        stable=args.stable,
        progress=lambda m: err.print(f"capture: {m}"),
    )
    if args.json:
        print_json(meta)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from gputuned.profile.schema import profile_schema

    print_json(profile_schema())
    return 0


# ---- install-system / uninstall-system (gputuned/install/) ---------------------------------------


def cmd_install_system(args: argparse.Namespace) -> int:
    from gputuned.cli.install import render
    from gputuned.install.system import find_gputuned, install_system

    report = install_system(
        root.open_kernel(args.prefix), exe=find_gputuned(), dry_run=args.dry_run
    )
    if args.json:
        print_json(report.to_json())
    else:
        render(report)
    return report.exit_code


def cmd_uninstall_system(args: argparse.Namespace) -> int:
    from gputuned.cli.install import render
    from gputuned.install.system import uninstall_system

    report = uninstall_system(root.open_kernel(args.prefix), dry_run=args.dry_run)
    if args.json:
        print_json(report.to_json())
    else:
        render(report)
    return report.exit_code


def _add_install_commands(sub: Any) -> None:
    for name, text, func in (
        ("install-system", "install the systemd unit, udev rule and profiles", cmd_install_system),
        ("uninstall-system", "remove what install-system installed", cmd_uninstall_system),
    ):
        s = sub.add_parser(name, help=text)
        under = "install under" if name == "install-system" else "remove what was installed under"
        s.add_argument("--prefix", type=Path, default=Path("/"), help=f"{under} DIR (default: /)")
        s.add_argument(
            "--dry-run", action="store_true", help="say what would change; change nothing"
        )
        add_json(s)
        s.set_defaults(func=func)


# ---- end of install-system / uninstall-system --------------------------------------------------


# ---- top (gputuned/watch/top.py) ------------------------------------------------------------------


def cmd_top(args: argparse.Namespace) -> int:
    from gputuned.cli.top import run_top

    return run_top(
        root.open_kernel(args.root),
        pids=args.pid,
        once=args.once,
        as_json=args.json,
        interval=args.interval,
    )


def _add_top_command(sub: Any) -> None:
    s = sub.add_parser(
        "top",
        help="live view per placed process: run-queue delay, context switches, IRQs, GPU load",
    )
    s.add_argument(
        "--pid",
        type=int,
        action="append",
        default=[],
        metavar="PID",
        help="watch this process (repeatable; default: the daemon's placed and registered "
        "processes, else those matching the applied profile's rules)",
    )
    s.add_argument("--once", action="store_true", help="print one view after one interval")
    s.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_top)


# ---- end of top --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="gputunectl",
        description="Tune a Linux host for GPU inference: PCIe, IRQs, cpusets, processes.",
        epilog=exitcodes.help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"gputunectl {__version__}")
    # -v and --json go before the command or after it (issue 31, item 4): here, and on each
    # command (add_json, _verbose_everywhere) with no default, so a command's parser leaves
    # what was given before it as it was.
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("inspect", help="show PCIe links, payload sizes, ASPM and IRQs per GPU")
    add_root(s)
    add_json(s)
    s.add_argument(
        "--all",
        action="store_true",
        help="every PCIe function (and any whose config space is unreadable), not only GPUs",
    )
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("plan", help="list every change PROFILE would make here; writes nothing")
    s.add_argument(
        "profile", metavar="PROFILE", help="a profile file (a / or .toml), or a profile's name"
    )
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_plan)

    add_tuning_commands(sub)
    add_trial_command(sub)

    s = sub.add_parser("capture", help="copy what gputuned reads from this host into DIR")
    s.add_argument("dir", type=Path, metavar="DIR")
    add_root(s)
    add_json(s)
    s.add_argument(
        "--probe-writes",
        action="store_true",
        help="write each IRQ affinity and the ASPM policy back unchanged to record which the "
        "kernel refuses (the tree then refuses them too)",
    )
    s.add_argument(
        "--stable",
        action="store_true",
        help="leave out what changes by itself (interrupt counts, effective IRQ targets, NVML "
        "load), so two captures of an unchanged host compare equal with diff -r",
    )
    s.set_defaults(func=cmd_capture)

    s = sub.add_parser("schema", help="print the profile JSON schema")
    add_json(s, "the schema is JSON with or without it")
    s.set_defaults(func=cmd_schema)

    _add_install_commands(sub)
    _add_top_command(sub)
    from gputuned.cli.profilecmds import add_commands

    add_commands(sub, add_root, add_json)
    _verbose_everywhere(p)
    _describe(sub)
    return p


def _verbose_everywhere(p: argparse.ArgumentParser) -> None:
    """``-v`` after the command too, on each command that does not say what it does there."""
    for s in _commands(p).values():
        if "-v" not in s._option_string_actions:
            s.add_argument(
                "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
            )


def _describe(sub: argparse._SubParsersAction[Parser]) -> None:
    """Each command's ``--help`` opens with what it does: its line of the command list, as a
    sentence (a command that has a longer description keeps it)."""
    for choice in sub._choices_actions:
        parser = sub.choices[choice.dest]
        if parser.description is None and choice.help:
            parser.description = f"{choice.help[0].upper()}{choice.help[1:]}."


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status is one of gputuned/exitcodes.py's, whatever happens."""
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = guard_stdout()
    try:
        return _run(argv)
    finally:
        # What is still buffered goes out through the guard, also after --help (SystemExit):
        # flushed later, at the interpreter's exit, a reader gone would make it status 120.
        sys.stdout.flush()
        sys.stdout = previous


def _run(argv: list[str]) -> int:
    as_json = wants_json(argv)
    command = None
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        command, as_json = args.command, args.json
        handler = logging.StreamHandler()
        handler.setFormatter(PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.WARNING, handlers=[handler]
        )
        func: Handler = args.func
        return func(args)
    except ParseError as exc:
        if exc.command is None:
            # "unrecognized arguments" comes from the top parser, after the command's was
            # done: name that command, and show its usage rather than the top one's.
            subs = _commands(parser)
            exc.command = next((a for a in argv if a in subs), None)
            if exc.command is not None:
                exc.usage = subs[exc.command].format_usage().strip()
        text = f"{exc.message}\n{exc.usage}"
        return _failed(exc.command, exc, exc.exit_code, text, as_json)
    except errors.GputunedError as exc:
        return _failed(command, exc, exc.exit_code, str(exc), as_json)
    except KeyboardInterrupt as exc:
        if as_json:
            print_json(error_json(command, exc, exitcodes.INTERRUPTED, "interrupted"))
        return exitcodes.INTERRUPTED
    except Exception as exc:  # no input ends in a traceback; -v shows it (a bug to report)
        log.debug("gputunectl %s failed", command, exc_info=True)
        again = shlex.join(["gputunectl", "-v", *argv])
        what = f"internal error ({type(exc).__name__}: {exc}); this is a bug in gputunectl: " + (
            f"run it again with -v ({again}) and report the traceback"
        )
        return _failed(command, exc, exitcodes.INTERNAL, what, as_json)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for a in parser._actions
        if isinstance(a, argparse._SubParsersAction)
        for name, sub in a.choices.items()
    }


def _failed(command: str | None, exc: BaseException, code: int, text: str, as_json: bool) -> int:
    from gputuned.cli.render import console, shown

    # Escaped: messages carry profile keys such as "[cpusets.inference]", not markup.
    name = f"gputunectl {command}" if command else "gputunectl"
    console(stderr=True).print(f"[bold red]{name}:[/] {shown(text)}", highlight=False)
    if as_json:
        print_json(error_json(command, exc, code, text))
    return code


if __name__ == "__main__":
    sys.exit(main())
