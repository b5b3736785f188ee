"""``gputunectl list``, ``show NAME``, ``recommend`` and ``active``: profiles by name (issue
19, item 2; ``active``: issue 31).

The folders and the look-up are gputuned/store/profiledirs.py; what fits a host is
gputuned/engine/recommend.py. This module is the commands and their output only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputuned import errors
from gputuned.cli.args import root_option
from gputuned.kernel import Kernel
from gputuned.root import open_kernel
from gputuned.store.profiledirs import Entry, ProfileDirs

AddOption = Callable[[argparse.ArgumentParser], None]


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


# ---- list ---------------------------------------------------------------------------------------


def _active(kernel: Kernel) -> tuple[str | None, str | None]:
    """(name, file) of the profile applied last on this host, as active.json records them."""
    from gputuned.engine.applied import read_active

    active = read_active(kernel)
    if active is None:
        return None, None
    path = active.get("path") or active.get("source")
    name = active.get("profile", {}).get("name")
    return (str(name) if name else None), (str(path) if path else None)


def _describe(entry: Entry, dirs: ProfileDirs) -> tuple[str, str | None]:
    """(description, why it does not load or None)."""
    from gputuned.profile.load import load_profile

    try:
        profile = load_profile(entry.path, names=dirs)
    except errors.ProfileError as exc:
        return "", "; ".join(f"{k}: {m}" if k else m for k, m in exc.problems)
    except errors.GputunedError as exc:
        return "", str(exc).splitlines()[0]
    return profile.description or "", None


def cmd_list(args: argparse.Namespace) -> int:
    from gputuned.cli.markup import Lines
    from gputuned.cli.render import shown

    kernel = open_kernel(args.root)
    dirs = ProfileDirs.for_host(kernel)
    unknown = None  # why the active profile cannot be read by this user
    try:
        active_name, active_path = _active(kernel)
    except errors.PermissionDenied as exc:
        # /etc/gputuned is root's alone (0700): the profiles still list, as tuned-adm's do.
        active_name = active_path = None
        unknown = str(exc).splitlines()[0]
    rows: list[dict[str, Any]] = []
    for e in dirs.entries():
        desc, error = _describe(e, dirs)
        rows.append(
            {
                "name": e.name,
                "origin": e.origin,
                "path": str(e.path),
                "description": desc,
                "active": active_path is not None and str(e.path) == active_path,
                "overrides_shipped": e.overrides,
                "hidden_by_user": e.hidden,
                "error": error,
            }
        )
    if args.json:
        _print_json(
            {
                "user_dir": str(dirs.user),
                "shipped_dir": str(dirs.shipped),
                "active": {"name": active_name, "path": active_path} if active_name else None,
                "active_unknown": unknown,
                "profiles": rows,
            }
        )
        return 0
    out = Lines()
    width = max((len(r["name"]) for r in rows), default=4)
    out.print(f"  {'NAME':<{width}}  {'FROM':<7}  DESCRIPTION")
    for r in rows:
        mark = "*" if r["active"] else " "
        text = r["description"]
        if r["error"]:
            text = f"[red]does not load: {shown(r['error'])}[/]"
        elif r["hidden_by_user"]:
            text = f"[dim]{shown(text)} (yours of the same name is used)[/]"
        elif r["overrides_shipped"]:
            text = f"{shown(text)} (overrides the shipped one)"
        else:
            text = shown(text)
        out.print(f"{mark} {shown(r['name']):<{width}}  {r['origin']:<7}  {text}")
    out.print(f"yours: {shown(dirs.user)} (a name there wins); shipped: {shown(dirs.shipped)}")
    if unknown is not None:
        out.print(f"active: not known to this user ({shown(unknown)}); sudo gputunectl active")
    elif active_name is None:
        out.print(f"active: none (gputunectl apply NAME{shown(root_option(args))})")
    else:
        marked = any(r["active"] for r in rows)
        where = "" if marked else f", from {shown(active_path)}, not one listed here"
        out.print(f"active: {shown(active_name)}{where}" + (" (marked *)" if marked else ""))
    return 0


# ---- show ---------------------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    from gputuned.profile.load import load_profile

    kernel = open_kernel(args.root)
    dirs = ProfileDirs.for_host(kernel)
    path = dirs.resolve(args.profile)
    profile = load_profile(path, names=dirs)
    data = profile.model_dump(mode="json", by_alias=True, exclude_unset=True)
    includes = [
        {"include": name, "path": str(_include_path(dirs, path, name))} for name in profile.include
    ]
    if args.json:
        _print_json({"path": str(path), "includes": includes, "profile": data})
        return 0
    lines = [f"# {profile.name}: {path}"]
    lines += [f"# includes {i['include']}: {i['path']}" for i in includes]
    lines.append("# merged, as gputuned applies it (keys no file sets keep their defaults):")
    data.pop("include", None)
    sys.stdout.write("\n".join(lines) + "\n" + to_toml(data))
    return 0


def _include_path(dirs: ProfileDirs, path: Path, name: str) -> Path:
    from gputuned.store.profiledirs import is_profile_name

    if name.endswith(".toml") or not is_profile_name(name):
        return path.parent / name
    return dirs.find(name, skip=path)


def to_toml(data: dict[str, Any]) -> str:
    """``data`` (a profile as JSON data) as TOML that tomllib reads back to the same data."""
    lines: list[str] = []
    _table(lines, (), data, array=False)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(lines: list[str], at: tuple[str, ...], data: dict[str, Any], *, array: bool) -> None:
    from gputuned.profile.messages import key_path

    def is_table(v: object) -> bool:
        return isinstance(v, dict)

    def is_tables(v: object) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(i, dict) for i in v)

    scalars = any(not is_table(v) and not is_tables(v) for v in data.values())
    if at and (scalars or array or not data):
        name = key_path(at)
        lines += ["", f"[[{name}]]" if array else f"[{name}]"]
    for k, v in data.items():
        if not is_table(v) and not is_tables(v):
            lines.append(f"{key_path((k,))} = {_value(v)}")
    for k, v in data.items():
        if is_table(v):
            _table(lines, (*at, k), v, array=False)
    for k, v in data.items():
        if is_tables(v):
            for item in v:
                _table(lines, (*at, k), item, array=True)


def _value(v: object) -> str:
    from gputuned.profile.messages import basic_string, key_path

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return basic_string(v)
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(i) for i in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{key_path((k,))} = {_value(i)}" for k, i in v.items()) + "}"
    raise errors.GputunedError(f"cannot write {type(v).__name__} as TOML")


# ---- recommend ----------------------------------------------------------------------------------


def cmd_recommend(args: argparse.Namespace) -> int:
    from gputuned.cli.render import console, shown
    from gputuned.engine.recommend import recommend

    kernel = open_kernel(args.root)
    from gputuned.kernel.users import asking_uids

    rec = recommend(kernel, ignore_uids=asking_uids())
    if args.json:
        _print_json(rec.to_json())
        return 0 if rec.recommended else 1
    out = console()
    out.print(f"[bold]{shown(rec.verdict)}[/]")
    for why in rec.reasons:
        out.print(f"  - {shown(why)}")
    out.print("candidates:")
    for c in rec.candidates:
        state = "fits" if c.fits else "does not fit"
        out.print(f"  {shown(c.name):<20} {state}: {shown(c.why)}")
    if rec.recommended:
        out.print(f"next: gputunectl plan {shown(rec.recommended)}{shown(root_option(args))}")
    return 0 if rec.recommended else 1


# ---- active --------------------------------------------------------------------------------------


def cmd_active(args: argparse.Namespace) -> int:
    """One line, as ``tuned-adm active`` answers: the name of the profile applied here, or
    ``none``. Read from active.json, as ``status`` reads it without the daemon; exit 0 either
    way (``none`` is an answer, not an error)."""
    name, path = _active(open_kernel(args.root))
    if args.json:
        _print_json({"active_profile": name, "source": path})
    else:
        sys.stdout.write(f"{name or 'none'}\n")
    return 0


# ---- the parsers --------------------------------------------------------------------------------


def add_commands(sub: Any, add_root: AddOption, add_json: AddOption) -> None:
    s = sub.add_parser("list", help="profiles by name: shipped and yours, the active one marked")
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_list)

    s = sub.add_parser("show", help="a profile merged with its includes, as TOML")
    s.add_argument("profile", metavar="PROFILE", help="a profile's name (gputunectl list) or file")
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_show)

    s = sub.add_parser("recommend", help="which shipped profile fits this host, and why")
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_recommend)

    s = sub.add_parser("active", help="the name of the profile applied here, or none")
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_active)
