"""A profile's files as data: read (owner checked), parsed as TOML, its includes merged, before
any check of what the keys mean (gputuned/profile/load.py checks them with the model). Nothing
here needs pydantic: verify asks it whether a profile file still says what was applied without
loading the model (issue 31, item 2).

Includes are relative to the including file, beside it or below its folder; tables merge key by
key, a set under ``[cpusets]`` and arrays are replaced whole (see :mod:`gputuned.profile`).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from gputuned.errors import ProfileError
from gputuned.store.profiledirs import ProfileDirs, is_profile_name
from gputuned.store.userfiles import read_user_file

_MAX_INCLUDE_DEPTH = 16
#: Tables and arrays nest at most this deep: a real profile needs 4 (process[0].match.cmdline);
#: 5000 levels end tomllib and pydantic in RecursionError (issue 14, finding 11).
MAX_NESTING = 32


def read_merged(path: str | Path, *, names: ProfileDirs | None = None) -> dict[str, Any]:
    """The profile at ``path`` with its includes merged, as the model is given it."""
    path = Path(path)
    data, includes = load_tree(path, read_user_file(path), (), names)
    if includes:
        data["include"] = includes
    return data


def digest(data: Any) -> str:
    """A profile's data, merged, as one SHA-256: equal digests, equal profiles. TOML's dates and
    times are written as text, the keys sorted."""
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def load_tree(
    path: Path, raw: bytes, chain: tuple[Path, ...], names: ProfileDirs | None
) -> tuple[dict[str, Any], list[str]]:
    data = _parse_toml(path, raw)
    includes = data.pop("include", [])
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ProfileError(
            str(path), [("include", "expected an array of file names, e.g. ['shared-host.toml']")]
        )
    here = (*chain, path)
    merged: dict[str, Any] = {}
    for i, name in enumerate(includes):
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or ".." in parts or "\0" in name:
            # Absolute or '..': the file would lie outside the folder whose trust was checked
            # with the including one (issue 14, finding 12).
            msg = (
                f"{name[:80]!r}: name a file beside this profile or below its folder, without '..'"
            )
            raise ProfileError(str(path), [(f"include[{i}]", msg)])
        try:
            target = _include_target(path, name, names)
        except ProfileError as exc:
            raise ProfileError(str(path), [(f"include[{i}]", exc.problems[0][1])]) from None
        if _identity(target) in {_identity(p) for p in here}:
            cycle = " -> ".join(str(p) for p in (*here, target))
            raise ProfileError(
                str(path), [(f"include[{i}]", f"include cycle: {cycle}; remove one of these")]
            )
        if len(here) >= _MAX_INCLUDE_DEPTH:
            raise ProfileError(
                str(path),
                [(f"include[{i}]", f"includes nest deeper than {_MAX_INCLUDE_DEPTH} files")],
            )
        try:
            sub_raw = read_user_file(target)
        except ProfileError as exc:
            problem = (f"include[{i}]", f"{target}: {exc.problems[0][1]}")
            raise ProfileError(str(path), [problem]) from exc
        sub, _ = load_tree(target, sub_raw, here, names)
        merged = _merge(merged, sub)
    return _merge(merged, data), includes


def _include_target(path: Path, name: str, names: ProfileDirs | None) -> Path:
    """The file ``include`` entry ``name`` of ``path`` means: a profile's name (no ``.toml``,
    no folder) is looked up by name, anything else is a file beside ``path`` or below."""
    if name.endswith(".toml") or not is_profile_name(name):
        return path.parent / name
    if names is None:
        from gputuned.kernel.live import LiveKernel

        names = ProfileDirs.for_host(LiveKernel())
    try:
        return names.find(name, skip=path)
    except ProfileError as exc:
        raise ProfileError(name, [("", f"{name!r}: {exc.problems[0][1]}")]) from None


TOO_DEEP = f"tables and arrays nest deeper than {MAX_NESTING} levels; no profile needs that"


def too_deep(data: object) -> bool:
    """Whether ``data`` nests deeper than MAX_NESTING (iterative: no recursion to run out of)."""
    todo: list[tuple[object, int]] = [(data, 0)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_NESTING:
            return True
        if isinstance(item, dict):
            todo += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list | tuple):
            todo += [(v, depth + 1) for v in item]
    return False


def _parse_toml(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        msg = f"not UTF-8 text (byte {exc.start}); save the profile as UTF-8"
    except tomllib.TOMLDecodeError as exc:
        msg = f"TOML syntax error: {exc}"
    except ValueError:
        # int() refuses a literal of more than sys.get_int_max_str_digits() digits (4300).
        limit = sys.get_int_max_str_digits()
        msg = f"a number of more than {limit} digits; no key takes one so long"
    except RecursionError:
        msg = TOO_DEEP
    else:
        if not too_deep(data):
            return data
        msg = TOO_DEEP
    raise ProfileError(str(path), [("", msg)])


def _identity(path: Path) -> str:
    # Lexical, so that no file system call is made outside host/; symlinked cycles still end
    # at the depth limit.
    return posixpath.normpath(path.absolute())


def _merge(base: dict[str, Any], over: dict[str, Any], at: tuple[str, ...] = ()) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        # A set under [cpusets] is one unit: merging two bases would make it invalid.
        if isinstance(old, dict) and isinstance(value, dict) and at != ("cpusets",):
            out[key] = _merge(old, value, (*at, key))
        else:
            out[key] = value
    return out
