"""``gputunectl``: inspect, capture, plan (and later apply, verify, revert)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gputuned import __version__, errors
from gputuned.host import Host
from gputuned.render import console, render_inspect, render_plan

log = logging.getLogger("gputunectl")

Handler = Callable[[argparse.Namespace], int]


def _add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="read (and write) a captured host tree instead of this machine",
    )


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def cmd_inspect(args: argparse.Namespace) -> int:
    from gputuned.inspect import inspect

    data = inspect(Host(args.root), all_functions=args.all)
    if args.json:
        _print_json(data)
    else:
        render_inspect(data, all_functions=args.all)
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    from gputuned.host.capture import capture

    err = console(stderr=True)
    meta = capture(
        Host(args.root),
        args.dir,
        probe_writes=args.probe_writes,
        progress=lambda m: err.print(f"capture: {m}"),
    )
    if args.json:
        _print_json(meta)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from gputuned.profile import profile_schema

    _print_json(profile_schema())
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from gputuned.engine import plan_profile
    from gputuned.profile import load_profile

    profile = load_profile(args.profile)
    result = plan_profile(Host(args.root), profile)
    if args.json:
        _print_json(result.to_json())
    else:
        render_plan(result)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gputunectl",
        description="Tune a Linux host for GPU inference: PCIe, IRQs, cpusets, processes.",
    )
    p.add_argument("--version", action="version", version=f"gputunectl {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("inspect", help="show PCIe links, payload sizes, ASPM and IRQs per GPU")
    _add_root(s)
    _add_json(s)
    s.add_argument("--all", action="store_true", help="every PCIe function, not only GPUs")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("plan", help="list every change PROFILE would make here; writes nothing")
    s.add_argument("profile", type=Path, metavar="PROFILE")
    _add_root(s)
    _add_json(s)
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("capture", help="copy what gputuned reads from this host into DIR")
    s.add_argument("dir", type=Path, metavar="DIR")
    _add_root(s)
    _add_json(s)
    s.add_argument(
        "--probe-writes",
        action="store_true",
        help="write each IRQ affinity and the ASPM policy back unchanged to record which the "
        "kernel refuses (the tree then refuses them too)",
    )
    s.set_defaults(func=cmd_capture)

    s = sub.add_parser("schema", help="print the profile JSON schema")
    s.set_defaults(func=cmd_schema)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    func: Handler = args.func
    try:
        return func(args)
    except errors.GputunedError as exc:
        console(stderr=True).print(
            f"[bold red]gputunectl {args.command}:[/] {exc}", highlight=False
        )
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
