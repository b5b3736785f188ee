"""The commands that tune and report on tuning: plan, apply, revert, verify, status, register,
unregister and bootargs. Each goes through a running daemon when there is one (the control
socket), else does the work itself (one-shot mode)."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputuned import errors, root
from gputuned.cli.args import add_active_profile, add_json, add_root, print_json, root_option
from gputuned.kernel import Kernel
from gputuned.store.state import ACTIVE, GRUB_DROPIN, check_state_files

if TYPE_CHECKING:
    from gputuned.profile.model import Profile
    from gputuned.store.profiledirs import ProfileDirs


def cmd_plan(args: argparse.Namespace) -> int:
    from gputuned.cli.render import render_plan
    from gputuned.engine.plan import plan_profile
    from gputuned.profile.load import load_profile

    kernel = root.open_kernel(args.root)
    path, dirs = _profile_path(kernel, args.profile)
    profile = load_profile(path, names=dirs)
    result = plan_profile(kernel, profile, allow_blocked=True)
    if not _daemon_runs(kernel):
        # The plan's notes say what the daemon does later; without one, nobody does it.
        later = "places the processes that start later or " if profile.process else ""
        result.notes.append(
            f"one-shot: no gputuned daemon runs here; after apply nobody {later}repairs drift "
            "unless it runs: systemctl enable --now gputuned"
        )
    if args.json:
        print_json(result.to_json())
    else:
        render_plan(result)
    # A blocked plan exits as apply would on it: PlanError's status, nothing to apply here.
    return result.blocked_error().exit_code if result.blocked else 0


def _daemon_runs(kernel: Kernel) -> bool:
    from gputuned.service.controlclient import daemon_running

    try:
        return daemon_running(kernel)
    except errors.HostError:
        return False  # its socket cannot be probed: said as if none ran (the safe reading)


def _profile_path(kernel: Kernel, arg: str) -> tuple[Path, ProfileDirs]:
    """PROFILE as given on the command line (the text: ``./shared-host`` is a path, which
    argparse's ``type=Path`` made ``shared-host``): a file, else a profile's name."""
    from gputuned.store.profiledirs import ProfileDirs

    dirs = ProfileDirs.for_host(kernel)
    return dirs.resolve(arg), dirs


def _profile_for(args: argparse.Namespace, kernel: Kernel) -> tuple[Profile, str]:
    """The profile named on the command line, else the one applied last on this host."""
    from gputuned.engine.applied import read_active
    from gputuned.profile.load import load_profile, parse_profile

    arg: str | None = args.profile
    if arg is not None:
        path, dirs = _profile_path(kernel, arg)
        return load_profile(path, names=dirs), str(path.absolute())
    active = read_active(kernel)
    if active is None:
        raise errors.GputunedError(
            "no profile given and none applied on this host; name one: "
            f"gputunectl {args.command} PROFILE{root_option(args)}"
        )
    return parse_profile(active["profile"], f"{ACTIVE} (copy of {active['source']})"), str(
        active["source"]
    )


def _daemon(kernel: Kernel, message: dict[str, Any]) -> dict[str, Any] | None:
    """Send ``message`` to a running gputuned; None when no daemon runs (one-shot mode)."""
    from gputuned.service.controlclient import daemon_running, request

    if not daemon_running(kernel):
        return None
    return request(kernel, message)


def _render_daemon_apply(resp: dict[str, Any]) -> None:
    from gputuned.cli.render import console, shown

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


def _apply_source(kernel: Kernel, arg: str) -> tuple[Profile | None, dict[str, Any], str]:
    """What to apply: (the profile when this side loads it, the daemon's request, the file).

    A path is loaded here, as the user running gputunectl (includes too), and its content sent
    to a daemon; a bare name (``shared-host``) names a profile in the profile directory, which
    the daemon reads itself. The daemon never opens a path a client names (issue 14, finding 7).
    """
    from gputuned.profile.load import load_profile

    path, dirs = _profile_path(kernel, arg)  # refuse an unknown name here, with the choices
    if path != Path(arg):
        return None, {"cmd": "apply", "name": arg}, str(path)
    profile = load_profile(path, names=dirs)  # refuse a bad profile here, with its key paths
    data = profile.model_dump(mode="json", by_alias=True, exclude_none=True)
    source = str(path.absolute())
    return profile, {"cmd": "apply", "profile": data, "source": source}, source


def cmd_apply(args: argparse.Namespace) -> int:
    from gputuned.cli.render import render_apply
    from gputuned.engine.apply import apply_profile
    from gputuned.profile.load import load_profile

    kernel = root.open_kernel(args.root)
    profile, message, path = _apply_source(kernel, args.profile)
    resp = _daemon(kernel, message)
    if resp is not None:
        if args.json:
            print_json(resp)
        else:
            _render_daemon_apply(resp)
        return 3 if resp["failed"] else 0
    if profile is None:
        named, dirs = _profile_path(kernel, path)
        profile = load_profile(named, names=dirs)
    # State files others could write are refused now, before plan and the first write, not
    # when apply records its result after every write is done.
    check_state_files(kernel)
    # An ApplyError's report goes into the error's JSON (gputuned/cli/output.py error_json).
    plan, report = apply_profile(
        kernel, profile, keep_going=args.keep_going, source=path, reload_path=path
    )
    if args.json:
        print_json({"ok": not report.failed, "profile": plan.profile, **report.to_json()})
    else:
        render_apply(plan, report, root_option(args))
    return 3 if report.failed else 0


def cmd_revert(args: argparse.Namespace) -> int:
    from gputuned.cli.render import render_revert
    from gputuned.engine.apply import RevertReport, revert_all

    kernel = root.open_kernel(args.root)
    resp = _daemon(kernel, {"cmd": "revert"})
    if resp is not None:
        report = RevertReport.from_json(resp)
    else:
        report = revert_all(kernel, boot_config=True)
    if args.json:
        print_json({"ok": not report.failed, **report.to_json()})
    else:
        render_revert(report, root_option(args))
    return 3 if report.failed else 0


def cmd_verify(args: argparse.Namespace) -> int:
    from gputuned.cli.markup import Lines
    from gputuned.cli.render import render_verify, shown
    from gputuned.engine.verify import VerifyReport
    from gputuned.store.userfiles import write_user_file_atomic

    kernel = root.open_kernel(args.root)
    resp = None if args.profile else _daemon(kernel, {"cmd": "verify", "strict": args.strict})
    if resp is not None:
        report = VerifyReport.from_json(resp, strict=args.strict)
    else:
        from gputuned.engine.apply import read_state
        from gputuned.engine.plan import plan_profile
        from gputuned.engine.verify import verify_plan

        profile, _source = _profile_for(args, kernel)
        plan = plan_profile(kernel, profile, allow_blocked=True)  # a blocked one shows as lines
        report = verify_plan(plan, read_state(kernel), strict=args.strict)
    edited = None if args.profile else _edited_since_apply(args, kernel)
    if args.prometheus:
        write_user_file_atomic(args.prometheus, report.prometheus().encode())
    if args.json:
        print_json({**report.to_json(), "profile_file_changed": edited})
    else:
        render_verify(report, verbose=args.verbose)
        if edited:
            Lines().print(f"[yellow]note[/] {shown(edited)}")
    return report.exit_code


def _edited_since_apply(args: argparse.Namespace, kernel: Kernel) -> str | None:
    """Why the profile file now says something else than the copy applied from it, or None.

    verify compares the host with the copy active.json keeps, so an edit made since apply
    passed unseen (issue 19, item 4). The file is loaded as apply loaded it (includes too) and
    compared with that copy: an edit that changes nothing gputuned reads (a comment) is none.
    """
    from gputuned.engine.applied import read_active
    from gputuned.store.profiledirs import ProfileDirs

    active = read_active(kernel)
    if active is None or not (active.get("path") or active.get("source")):
        return None
    where = str(active.get("path") or active["source"])
    again = f"gputunectl apply {where}{root_option(args)}"
    if _same_as_applied(where, active, kernel):
        return None
    from gputuned.profile.load import load_profile, parse_profile

    try:
        now = load_profile(where, names=ProfileDirs.for_host(kernel))
    except errors.ProfileError as exc:
        first = "; ".join(f"{k}: {m}" if k else m for k, m in exc.problems[:1])
        return (
            f"the profile file {where} no longer loads ({first}); verify compared the host with "
            "the copy applied from it"
        )
    except errors.GputunedError as exc:
        first = str(exc).splitlines()[0]
        return (
            f"the profile file {where} no longer loads ({first}); verify compared the host with "
            "the copy applied from it"
        )
    try:
        # The copy read through this version's model too: keys a newer gputuned added (with
        # their defaults) are on both sides, so an upgrade alone is no edit.
        then = parse_profile(active["profile"], ACTIVE)
    except errors.ProfileError:
        return None  # a copy this version cannot read: apply and verify say so themselves
    if now.model_dump(mode="json") == then.model_dump(mode="json"):
        return None
    return (
        f"the profile file {where} changed since it was applied; verify compared the host with "
        f"the copy applied then: to use the edit, {again}"
    )


def _same_as_applied(where: str, active: dict[str, Any], kernel: Kernel) -> bool:
    """Whether the file's data, includes merged, is exactly what was applied (its digest in
    active.json): then it has not changed, and neither pydantic nor the model is loaded (issue
    31, item 2). Anything else (a different digest, none recorded, a file that does not read)
    is left to the full comparison."""
    from gputuned.profile.files import digest, read_merged
    from gputuned.store.profiledirs import ProfileDirs

    recorded = active.get("source_digest")
    if not isinstance(recorded, str):
        return False
    try:
        return digest(read_merged(where, names=ProfileDirs.for_host(kernel))) == recorded
    except errors.GputunedError:
        return False


def cmd_status(args: argparse.Namespace) -> int:
    # state.json and active.json from engine.applied, not through engine.apply: status needs
    # neither the planner nor the profile's models (issue 31, item 2).
    from gputuned.cli.render import render_status
    from gputuned.engine.applied import read_active, read_state

    kernel = root.open_kernel(args.root)
    active = read_active(kernel)
    others = _neighbour_tools(kernel, active)
    grub = _grub_dropin(kernel)
    resp = _daemon(kernel, {"cmd": "status"})
    if resp is not None:
        resp.pop("v", None)
        resp.pop("ok", None)
        resp.update(coexistence=others, grub_dropin=grub)
        print_json(resp) if args.json else render_status(resp)
        return 0
    from gputuned.engine.journal import Journal

    state = read_state(kernel)
    journal = Journal(kernel)
    data = {
        "active_profile": active["profile"]["name"] if active else None,
        "source": active["source"] if active else None,
        "applied_at": state.get("applied_at"),
        "journal_entries": len(journal),
        "journal": [
            {"tuner": e.op.tuner, "target": e.op.target, "old": e.old} for e in journal.entries()
        ],
        "not_possible": state.get("not_possible", {}),
        "refused": state.get("refused", []),
        "coexistence": others,
        "grub_dropin": grub,
        "daemon": None,
    }
    if args.json:
        print_json(data)
    else:
        render_status(data)
    return 0


def _grub_dropin(kernel: Kernel) -> str | None:
    """The GRUB drop-in bootargs --write-grub wrote and revert would put back, if any."""
    from gputuned.engine.grub import read_record

    try:
        return GRUB_DROPIN if read_record(kernel) is not None else None
    except errors.GputunedError:
        return None  # not readable by this user, or damaged: revert says which


def _neighbour_tools(kernel: Kernel, active: dict[str, Any] | None) -> list[str]:
    """What TuneD and irqbalance do here that meets the active profile (engine/coexist.py)."""
    from gputuned.engine.coexist import coexistence_notes, irqbalance_runs
    from gputuned.kernel.proc import iter_processes

    processes = list(iter_processes(kernel, brief=True))
    profile: Profile | None = None
    # Only the irqbalance notes read the profile: without irqbalance, status loads no model.
    if active and irqbalance_runs(processes):
        from gputuned.profile.load import parse_profile

        # A copy this version no longer reads: said by verify and apply.
        with contextlib.suppress(errors.ProfileError):
            profile = parse_profile(active["profile"], ACTIVE)
    return coexistence_notes(kernel, profile, processes, plan=False)


def cmd_register(args: argparse.Namespace) -> int:
    from gputuned.cli.render import console, shown
    from gputuned.kernel.proc import read_identity

    kernel = root.open_kernel(args.root)
    if args.pid <= 0:
        raise errors.UsageError(f"{args.pid} is not a process ID; give a positive PID")
    try:
        # The daemon places a process by PID *and* start time: a PID alone may name another
        # process by the time the daemon reads it (PIDs are reused).
        start = read_identity(kernel, args.pid)[0]
    except errors.HostError:
        raise errors.GputunedError(f"there is no process {args.pid}") from None
    msg: dict[str, Any] = {"cmd": args.command, "pid": args.pid, "start": start}
    if args.command == "register" and args.rule:
        msg["rule"] = args.rule
    resp = _daemon(kernel, msg)
    if resp is None:
        raise errors.GputunedError(
            f"{args.command} needs the daemon (systemctl start gputuned): without it nothing "
            "would keep watching the process"
        )
    resp.pop("v", None)
    resp.pop("ok", None)
    print_json(resp) if args.json else console().print(shown(json.dumps(resp)))
    return 0


def cmd_bootargs(args: argparse.Namespace) -> int:
    from gputuned.cli.bootargs import bootargs

    kernel = root.open_kernel(args.root)
    profile, _source = _profile_for(args, kernel)
    return bootargs(
        kernel, profile, write_grub=args.write_grub, as_json=args.json, again=root_option(args)
    )


def add_tuning_commands(sub: Any) -> None:
    s = sub.add_parser("apply", help="make this host match PROFILE (one-shot without the daemon)")
    s.add_argument(
        "profile",
        metavar="PROFILE",
        help="a profile file, or a profile's name (shared-host; gputunectl list)",
    )
    add_root(s)
    add_json(s)
    s.add_argument(
        "--keep-going",
        action="store_true",
        help="on a failed setting, keep what was applied and continue (default: undo and stop)",
    )
    s.set_defaults(func=cmd_apply)

    s = sub.add_parser("revert", help="put back every value gputuned changed (from its journal)")
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_revert)

    s = sub.add_parser(
        "verify",
        help="compare the host with the applied profile (-v: the settings that passed too)",
    )
    add_active_profile(s)
    add_root(s)
    add_json(s)
    s.add_argument("--strict", action="store_true", help="'not possible here' fails verify too")
    s.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also list the settings that passed (without it: only the others, and the counts)",
    )
    s.add_argument(
        "--prometheus", type=Path, metavar="FILE", help="also write node_exporter textfile metrics"
    )
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("status", help="active profile, journal and what could not be applied")
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_status)

    for name, text in (
        ("register", "place process PID by a profile rule now and keep it placed (daemon)"),
        ("unregister", "put process PID's values back and stop placing it (daemon)"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("pid", type=int, metavar="PID")
        if name == "register":
            s.add_argument("--rule", help="name of the [[process]] rule (default: the first)")
        add_root(s)
        add_json(s)
        s.set_defaults(func=cmd_register)

    s = sub.add_parser("bootargs", help="kernel arguments the profile wants, for the bootloader")
    add_active_profile(s)
    add_root(s)
    add_json(s)
    s.add_argument(
        "--write-grub",
        action="store_true",
        help=f"write them to {GRUB_DROPIN} (gputunectl revert removes it, after a reboot too)",
    )
    s.set_defaults(func=cmd_bootargs)
