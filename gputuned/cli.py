"""``gputunectl``: inspect, capture, plan (and later apply, verify, revert)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputuned import __version__, errors
from gputuned.host import Host
from gputuned.host.state import ACTIVE, GRUB_DROPIN, check_state_files
from gputuned.render import (
    console,
    render_apply,
    render_inspect,
    render_plan,
    render_revert,
    render_status,
    render_verify,
    shown,
)
from gputuned.textsafe import PrintableFormatter

if TYPE_CHECKING:
    from gputuned.host.profiledirs import ProfileDirs
    from gputuned.profile import Profile


log = logging.getLogger("gputunectl")

Handler = Callable[[argparse.Namespace], int]


def host_root(text: str) -> Path:
    """``--root``: ``/`` or an existing host tree, given by an absolute path. A relative or
    mistyped one was made on the first write instead of refused (issue 14, finding 17)."""
    from gputuned.host.fs import TREE_META

    path = Path(text)
    if not path.is_absolute():
        raise argparse.ArgumentTypeError(
            f"{text!r} is relative; give the tree's absolute path, such as {Path(text).absolute()}"
        )
    if path == Path("/"):
        return path
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder; check the path")
    if not ((path / TREE_META).is_file() or (path / "sys").is_dir() or (path / "proc").is_dir()):
        raise argparse.ArgumentTypeError(
            f"{text} is not a host tree (no {TREE_META}, sys/ or proc/ in it); make one with "
            "gputunectl capture, or check the path"
        )
    return path


def _add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        type=host_root,
        default=Path("/"),
        help="read (and write) a captured host tree instead of this machine (absolute path)",
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
        stable=args.stable,
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

    host = Host(args.root)
    path, dirs = _profile_path(host, args.profile)
    profile = load_profile(path, names=dirs)
    result = plan_profile(host, profile, allow_blocked=True)
    if args.json:
        _print_json(result.to_json())
    else:
        render_plan(result)
    # A blocked plan exits as apply would on it: PlanError's status, nothing to apply here.
    return result.blocked_error().exit_code if result.blocked else 0


def _profile_path(host: Host, arg: Path) -> tuple[Path, ProfileDirs]:
    """PROFILE as given on the command line: a file, else a profile's name (gputunectl list)."""
    from gputuned.host.profiledirs import ProfileDirs

    dirs = ProfileDirs.for_host(host)
    return dirs.resolve(arg), dirs


def _profile_for(host: Host, arg: Path | None) -> tuple[Profile, str]:
    """The profile named on the command line, else the one applied last on this host."""
    from gputuned.apply import read_active
    from gputuned.profile import load_profile, parse_profile

    if arg is not None:
        path, dirs = _profile_path(host, arg)
        return load_profile(path, names=dirs), str(path.absolute())
    active = read_active(host)
    if active is None:
        raise errors.GputunedError(
            "no profile given and none applied on this host; name one: gputunectl verify PROFILE"
        )
    return parse_profile(active["profile"], f"{ACTIVE} (copy of {active['source']})"), str(
        active["source"]
    )


def _daemon(host: Host, message: dict[str, Any]) -> dict[str, Any] | None:
    """Send ``message`` to a running gputuned; None when no daemon runs (one-shot mode)."""
    from gputuned.host.control import daemon_running, request

    if not daemon_running(host):
        return None
    return request(host, message)


def _render_daemon_apply(resp: dict[str, Any]) -> None:
    out = console()
    out.print(
        f"Applied {shown(resp['profile'])} through the daemon: {len(resp['written'])} write(s), "
        f"{len(resp['not_possible'])} not possible here, {len(resp['failed'])} failed"
    )
    for w in resp["written"]:
        out.print(f"  set {shown(w['target'])}: {shown(w['old'])} → {shown(w['new'])}")
    for np in resp["not_possible"].values():
        out.print(f"  not possible here {shown(np['target'])}: {shown(np['reason'])}")
    for f in resp["failed"]:
        out.print(f"  failed {shown(f['target'])}: {shown(f['error'])}")


def _apply_source(host: Host, arg: Path) -> tuple[Profile | None, dict[str, Any], str]:
    """What to apply: (the profile when this side loads it, the daemon's request, the file).

    A path is loaded here, as the user running gputunectl (includes too), and its content sent
    to a daemon; a bare name (``shared-host``) names a profile in the profile directory, which
    the daemon reads itself. The daemon never opens a path a client names (issue 14, finding 7).
    """
    from gputuned.profile import load_profile

    path, dirs = _profile_path(host, arg)  # refuse an unknown name here, with the choices
    if path != arg:
        return None, {"cmd": "apply", "name": str(arg)}, str(path)
    profile = load_profile(arg, names=dirs)  # refuse a bad profile here, with its key paths
    data = profile.model_dump(mode="json", by_alias=True, exclude_none=True)
    source = str(arg.absolute())
    return profile, {"cmd": "apply", "profile": data, "source": source}, source


def cmd_apply(args: argparse.Namespace) -> int:
    from gputuned.apply import ApplyError, apply_profile
    from gputuned.profile import load_profile

    host = Host(args.root)
    profile, message, path = _apply_source(host, args.profile)
    resp = _daemon(host, message)
    if resp is not None:
        if args.json:
            _print_json(resp)
        else:
            _render_daemon_apply(resp)
        return 3 if resp["failed"] else 0
    if profile is None:
        named, dirs = _profile_path(host, Path(path))
        profile = load_profile(named, names=dirs)
    # State files others could write are refused now, before plan and the first write, not
    # when apply records its result after every write is done.
    check_state_files(host)
    try:
        plan, report = apply_profile(
            host, profile, keep_going=args.keep_going, source=path, reload_path=path
        )
    except ApplyError as exc:
        if args.json:
            _print_json({"ok": False, "error": str(exc), **exc.report.to_json()})
        raise
    except errors.PlanError as exc:
        if args.json:
            _print_json({"ok": False, "error": str(exc), "written": []})
        raise
    if args.json:
        _print_json({"ok": not report.failed, "profile": plan.profile, **report.to_json()})
    else:
        render_apply(plan, report)
    return 3 if report.failed else 0


def cmd_revert(args: argparse.Namespace) -> int:
    from gputuned.apply import RevertReport, revert_all

    host = Host(args.root)
    resp = _daemon(host, {"cmd": "revert"})
    if resp is not None:
        report = RevertReport(
            resp["restored"], resp["failed"], resp.get("notes", []), resp["seconds"]
        )
    else:
        report = revert_all(host)
    if args.json:
        _print_json({"ok": not report.failed, **report.to_json()})
    else:
        render_revert(report)
    return 3 if report.failed else 0


def cmd_verify(args: argparse.Namespace) -> int:
    from gputuned.apply import read_state
    from gputuned.engine import plan_profile
    from gputuned.host.userfiles import write_user_file_atomic
    from gputuned.verify import VerifyReport, verify_plan

    host = Host(args.root)
    resp = None if args.profile else _daemon(host, {"cmd": "verify", "strict": args.strict})
    if resp is not None:
        report = VerifyReport.from_json(resp, strict=args.strict)
    else:
        profile, _source = _profile_for(host, args.profile)
        plan = plan_profile(host, profile, allow_blocked=True)  # a blocked one shows as lines
        report = verify_plan(plan, read_state(host), strict=args.strict)
    if args.prometheus:
        write_user_file_atomic(args.prometheus, report.prometheus().encode())
    if args.json:
        _print_json(report.to_json())
    else:
        render_verify(report, verbose=args.verbose)
    return report.exit_code


def cmd_status(args: argparse.Namespace) -> int:
    from gputuned.apply import read_active, read_state
    from gputuned.journal import Journal

    host = Host(args.root)
    resp = _daemon(host, {"cmd": "status"})
    if resp is not None:
        resp.pop("v", None)
        resp.pop("ok", None)
        _print_json(resp) if args.json else render_status(resp)
        return 0
    active = read_active(host)
    state = read_state(host)
    journal = Journal(host)
    data = {
        "active_profile": active["profile"]["name"] if active else None,
        "source": active["source"] if active else None,
        "applied_at": state.get("applied_at"),
        "journal_entries": len(journal),
        "journal": [
            {"tuner": e.op.tuner, "target": e.op.target, "old": e.old} for e in journal.entries()
        ],
        "not_possible": state.get("not_possible", {}),
        "daemon": None,
    }
    if args.json:
        _print_json(data)
    else:
        render_status(data)
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    from gputuned.host.proc import read_identity

    host = Host(args.root)
    if args.pid <= 0:
        raise errors.GputunedError(f"{args.pid} is not a process ID; give a positive PID")
    try:
        # The daemon places a process by PID *and* start time: a PID alone may name another
        # process by the time the daemon reads it (PIDs are reused).
        start = read_identity(host, args.pid)[0]
    except errors.HostError:
        raise errors.GputunedError(f"there is no process {args.pid}") from None
    msg: dict[str, Any] = {"cmd": args.command, "pid": args.pid, "start": start}
    if args.command == "register" and args.rule:
        msg["rule"] = args.rule
    resp = _daemon(host, msg)
    if resp is None:
        raise errors.GputunedError(
            f"{args.command} needs the daemon (systemctl start gputuned): without it nothing "
            "would keep watching the process"
        )
    resp.pop("v", None)
    resp.pop("ok", None)
    _print_json(resp) if args.json else console().print(shown(json.dumps(resp)))
    return 0


def cmd_bootargs(args: argparse.Namespace) -> int:
    from gputuned.bootargs_cmd import bootargs

    host = Host(args.root)
    profile, _source = _profile_for(host, args.profile)
    return bootargs(host, profile, write_grub=args.write_grub, as_json=args.json)


def _add_engine_commands(sub: Any) -> None:
    s = sub.add_parser("apply", help="make this host match PROFILE (one-shot without the daemon)")
    s.add_argument(
        "profile",
        type=Path,
        metavar="PROFILE",
        help="a profile file, or a profile's name (shared-host; gputunectl list)",
    )
    _add_root(s)
    _add_json(s)
    s.add_argument(
        "--keep-going",
        action="store_true",
        help="on a failed setting, keep what was applied and continue (default: undo and stop)",
    )
    s.set_defaults(func=cmd_apply)

    s = sub.add_parser("revert", help="put back every value gputuned changed (from its journal)")
    _add_root(s)
    _add_json(s)
    s.set_defaults(func=cmd_revert)

    s = sub.add_parser("verify", help="compare the host with the applied profile")
    s.add_argument(
        "profile",
        type=Path,
        nargs="?",
        metavar="PROFILE",
        help="a profile file or name; default: the active one",
    )
    _add_root(s)
    _add_json(s)
    s.add_argument("--strict", action="store_true", help="'not possible here' fails verify too")
    s.add_argument(
        "--prometheus", type=Path, metavar="FILE", help="also write node_exporter textfile metrics"
    )
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("status", help="active profile, journal and what could not be applied")
    _add_root(s)
    _add_json(s)
    s.set_defaults(func=cmd_status)

    for name, text in (
        ("register", "place process PID by a profile rule now and keep it placed (daemon)"),
        ("unregister", "put process PID's values back and stop placing it (daemon)"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("pid", type=int, metavar="PID")
        if name == "register":
            s.add_argument("--rule", help="name of the [[process]] rule (default: the first)")
        _add_root(s)
        _add_json(s)
        s.set_defaults(func=cmd_register)

    s = sub.add_parser("bootargs", help="kernel arguments the profile wants, for the bootloader")
    s.add_argument(
        "profile",
        type=Path,
        nargs="?",
        metavar="PROFILE",
        help="a profile file or name; default: the active one",
    )
    _add_root(s)
    _add_json(s)
    s.add_argument(
        "--write-grub",
        action="store_true",
        help=f"write them to {GRUB_DROPIN} (journaled; gputunectl revert removes it)",
    )
    s.set_defaults(func=cmd_bootargs)


# ---- install-system / uninstall-system (gputuned/install.py) ---------------------------------


def cmd_install_system(args: argparse.Namespace) -> int:
    from gputuned.install import find_gputuned, install_system, render

    report = install_system(Host(args.prefix), exe=find_gputuned(), dry_run=args.dry_run)
    if args.json:
        _print_json(report.to_json())
    else:
        render(report)
    return report.exit_code


def cmd_uninstall_system(args: argparse.Namespace) -> int:
    from gputuned.install import render, uninstall_system

    report = uninstall_system(Host(args.prefix), dry_run=args.dry_run)
    if args.json:
        _print_json(report.to_json())
    else:
        render(report)
    return report.exit_code


def _add_install_commands(sub: Any) -> None:
    for name, text, func in (
        ("install-system", "install the systemd unit, udev rule and profiles", cmd_install_system),
        ("uninstall-system", "remove what install-system installed", cmd_uninstall_system),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument(
            "--prefix", type=Path, default=Path("/"), help="install under DIR (default: /)"
        )
        s.add_argument(
            "--dry-run", action="store_true", help="say what would change; change nothing"
        )
        _add_json(s)
        s.set_defaults(func=func)


# ---- end of install-system / uninstall-system --------------------------------------------------


# ---- top (gputuned/top.py) ------------------------------------------------------------------


def cmd_top(args: argparse.Namespace) -> int:
    from gputuned.top import run_top

    return run_top(
        Host(args.root), pids=args.pid, once=args.once, as_json=args.json, interval=args.interval
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
    _add_root(s)
    _add_json(s)
    s.set_defaults(func=cmd_top)


# ---- end of top --------------------------------------------------------------------------------


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
    s.add_argument(
        "--all",
        action="store_true",
        help="every PCIe function (and any whose config space is unreadable), not only GPUs",
    )
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("plan", help="list every change PROFILE would make here; writes nothing")
    s.add_argument(
        "profile", type=Path, metavar="PROFILE", help="a profile file, or a profile's name"
    )
    _add_root(s)
    _add_json(s)
    s.set_defaults(func=cmd_plan)

    _add_engine_commands(sub)

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
    s.add_argument(
        "--stable",
        action="store_true",
        help="leave out what changes by itself (interrupt counts, effective IRQ targets, NVML "
        "load), so two captures of an unchanged host compare equal with diff -r",
    )
    s.set_defaults(func=cmd_capture)

    s = sub.add_parser("schema", help="print the profile JSON schema")
    s.set_defaults(func=cmd_schema)

    _add_install_commands(sub)
    _add_top_command(sub)
    from gputuned.profilecmds import add_commands

    add_commands(sub, _add_root, _add_json)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, handlers=[handler]
    )
    func: Handler = args.func
    try:
        return func(args)
    except errors.GputunedError as exc:
        # Escaped: messages carry profile keys such as "[cpusets.inference]", not markup.
        console(stderr=True).print(
            f"[bold red]gputunectl {args.command}:[/] {shown(exc)}", highlight=False
        )
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
