"""A profile is a TOML file that says what gputuned should do on a host.

Each table configures one tuner and is named after it (`[irq]`, `[cpuset]`, ...); a tuner whose
table is absent does nothing. CPUs are never written as numbers in the tuner tables: they name
sets defined under `[cpusets]`, which are resolved on each host (a GPU's local CPUs, a NUMA
node, ...), so one profile fits hosts of different shapes.

Includes: `include = ["base.toml"]` loads those files first (paths relative to the including
file, beside it or below its folder: not absolute, no `..`), then this file's keys override
theirs. An entry without `.toml` and without `/` (`include = ["shared-host"]`) is a profile's
name instead, looked up like `gputunectl plan NAME`: /etc/gputuned/profiles, then the shipped
profiles (gputuned/host/profiledirs.py); never the including file itself, so a user profile
named like a shipped one can include it and override a few keys. Tables are merged key by key, except that a set
under `[cpusets]` is replaced whole (a set is defined by exactly one base) and arrays, including
arrays of tables such as `[[process]]`, are replaced rather than appended to. An include cannot
remove a key; override it with `"keep"` where the key allows that. Include cycles are rejected.

Checking: every problem is reported at once, with its key path (`process[1].priority`) and what
is allowed there; nothing is changed while a profile is invalid. Unknown keys are errors, so a
misspelt key cannot be silently ignored. Checks that depend on the host (does GPU 0 exist, do
two sets overlap once resolved) run when the profile is planned on that host.

`gputunectl schema` prints the JSON schema of a profile, for editors that complete TOML.
"""

from __future__ import annotations

import inspect
import json
import posixpath
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    model_validator,
)

from gputuned import daemon_config
from gputuned.cpusets import PARTITION_MODES as _PARTITION_MODES
from gputuned.cpusets import CpuSetSpec, check_partitions, overlaps, set_refs, static_cpus
from gputuned.daemon_config import Config as DaemonConfig
from gputuned.errors import ProfileError
from gputuned.host.profiledirs import ProfileDirs, is_profile_name
from gputuned.host.userfiles import read_user_file
from gputuned.tuners import bootargs, cpuset, irq, pcie_aspm, pcie_payload, process
from gputuned.tuners.bootargs import Config as BootargsConfig
from gputuned.tuners.cpuset import Config as CpusetConfig
from gputuned.tuners.irq import Config as IrqConfig
from gputuned.tuners.pcie_aspm import Config as PcieAspmConfig
from gputuned.tuners.pcie_payload import Config as PciePayloadConfig
from gputuned.tuners.process import Config as ProcessConfig

_SET_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_MAX_INCLUDE_DEPTH = 16
#: Tables and arrays nest at most this deep: a real profile needs 4 (process[0].match.cmdline);
#: 5000 levels end tomllib and pydantic in RecursionError (issue 14, finding 11).
MAX_NESTING = 32

Problems = list[tuple[str, str]]


class Profile(BaseModel):
    """A whole profile, after includes are merged. Every instance has passed the cross checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr = Field(min_length=1, description="Name of the profile, shown in reports.")
    description: StrictStr = Field(default="", description="What the profile is for.")
    include: tuple[StrictStr, ...] = Field(
        default=(),
        description="Profiles loaded first (paths relative to this file); this one overrides them.",
    )
    cpusets: dict[str, CpuSetSpec] = Field(
        default_factory=dict,
        description="Named CPU sets ([cpusets.<name>]); the tuner tables refer to them by name.",
    )
    pcie_aspm: PcieAspmConfig | None = Field(default=None, description="PCIe ASPM on GPU links.")
    pcie_payload: PciePayloadConfig | None = Field(
        default=None, description="PCIe MPS and MRRS on GPU paths."
    )
    irq: IrqConfig | None = Field(default=None, description="IRQ affinity.")
    cpuset: CpusetConfig | None = Field(default=None, description="cgroup v2 CPU partition.")
    process: tuple[ProcessConfig, ...] = Field(
        default=(), description="Process rules, one [[process]] table each."
    )
    bootargs: BootargsConfig | None = Field(default=None, description="Kernel boot arguments.")
    daemon: DaemonConfig = Field(
        default_factory=DaemonConfig, description="How the gputuned service keeps the profile."
    )

    @model_validator(mode="after")
    def _cross_check(self) -> Profile:
        # Raised as ProfileError, which pydantic lets through; parse_profile adds the file name.
        problems = _check_profile(self)
        if problems:
            raise ProfileError("<profile>", problems)
        return self


# -- loading ---------------------------------------------------------------------------------


def load_profile(path: str | Path, *, names: ProfileDirs | None = None) -> Profile:
    """Read, merge (includes) and check the profile at ``path``; raise ProfileError if invalid.

    ``names``: where includes by name are looked up (default: this machine's folders)."""
    path = Path(path)
    data, includes = _load_tree(path, read_user_file(path), (), names)
    if includes:
        data["include"] = includes
    return parse_profile(data, str(path))


def parse_profile(data: Mapping[str, Any], source: str) -> Profile:
    """Check already-parsed TOML data; problems become one ProfileError naming ``source``."""
    if _too_deep(data):
        raise ProfileError(source, [("", _TOO_DEEP)])
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(source, _problems_from(exc)) from None
    except ProfileError as exc:
        raise ProfileError(source, exc.problems) from None


def _load_tree(
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
        sub, _ = _load_tree(target, sub_raw, here, names)
        merged = _merge(merged, sub)
    return _merge(merged, data), includes


def _include_target(path: Path, name: str, names: ProfileDirs | None) -> Path:
    """The file ``include`` entry ``name`` of ``path`` means: a profile's name (no ``.toml``,
    no folder) is looked up by name, anything else is a file beside ``path`` or below."""
    if name.endswith(".toml") or not is_profile_name(name):
        return path.parent / name
    if names is None:
        from gputuned.host import Host

        names = ProfileDirs.for_host(Host(Path("/")))
    try:
        return names.find(name, skip=path)
    except ProfileError as exc:
        raise ProfileError(name, [("", f"{name!r}: {exc.problems[0][1]}")]) from None


_TOO_DEEP = f"tables and arrays nest deeper than {MAX_NESTING} levels; no profile needs that"


def _too_deep(data: object) -> bool:
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
    except RecursionError:
        msg = _TOO_DEEP
    else:
        if not _too_deep(data):
            return data
        msg = _TOO_DEEP
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


# -- turning pydantic errors into key paths and plain messages --------------------------------


def key_path(loc: tuple[int | str, ...]) -> str:
    """``("process", 1, "priority")`` -> ``process[1].priority``, as the key is written in TOML."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if _BARE_KEY.fullmatch(part) else _basic_string(part)
            out += f".{name}" if out else name
    return out


#: TOML's short escapes (toml.io, "String"); other control characters are written \uXXXX.
_TOML_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def _basic_string(text: str) -> str:
    """``text`` as a TOML basic string, so that a quoted key reads back as the same key."""
    body = "".join(
        _TOML_ESCAPES.get(ch) or (f"\\u{ord(ch):04X}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)
        for ch in text
    )
    return f'"{body}"'


def _problems_from(exc: ValidationError) -> Problems:
    problems: Problems = []
    for err in exc.errors(include_url=False):
        item = (key_path(err["loc"]), _message(err["type"], err["loc"], err))
        if item not in problems:
            problems.append(item)
    return problems


def _message(kind: str, loc: tuple[int | str, ...], err: Mapping[str, Any]) -> str:
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind in ("value_error", "assertion_error"):
        return str(ctx["error"])
    if kind == "extra_forbidden":
        parent = _unwrap(_annotation_at(loc[:-1]))
        allowed = ", ".join(parent.model_fields) if _is_model(parent) else ""
        return f"unknown key {loc[-1]!r}; allowed keys here: {allowed}"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "string_too_short":
        return "must not be empty"
    annotation = _unwrap(_annotation_at(loc))
    if kind == "literal_error":
        return f"{_show(value)} is not allowed; use {_or_list(typing.get_args(annotation))}"
    if kind in ("greater_than_equal", "less_than_equal"):
        lo, hi = _bounds(loc)
        if lo is not None and hi is not None:
            return f"must be from {lo} to {hi}; got {value}"
        limit = f"at least {lo}" if lo is not None else f"at most {hi}"
        return f"must be {limit}; got {value}"
    if kind.endswith(("_type", "_parsing")):
        return f"expected {_expected(annotation)}, got {_toml_type(value)} {_show(value)}"
    return str(err.get("msg", kind))


def _annotation_at(loc: tuple[int | str, ...]) -> Any:
    current: Any = Profile
    for part in loc:
        current = _unwrap(current)
        origin = typing.get_origin(current)
        if _is_model(current) and isinstance(part, str):
            info = current.model_fields.get(part)
            if info is None:
                return None
            current = info.annotation
        elif origin in (tuple, list) and isinstance(part, int):
            current = typing.get_args(current)[0]
        elif origin is dict:
            current = typing.get_args(current)[1]
        else:
            return None
    return current


def _bounds(loc: tuple[int | str, ...]) -> tuple[int | None, int | None]:
    parent = _unwrap(_annotation_at(loc[:-1]))
    lo = hi = None
    if _is_model(parent) and isinstance(loc[-1], str):
        for meta in parent.model_fields[loc[-1]].metadata:
            lo = getattr(meta, "ge", lo)
            hi = getattr(meta, "le", hi)
    return lo, hi


def _unwrap(annotation: Any) -> Any:
    """Strip ``Annotated[...]`` and ``X | None`` down to the type that matters."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _expected(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (tuple, list):
        return "an array"
    if origin is dict or _is_model(annotation):
        return "a table"
    kinds = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return kinds.get(annotation, "a value")


def _toml_type(value: object) -> str:
    kinds: tuple[tuple[type, str], ...] = ((bool, "boolean"), (int, "integer"), (float, "float"))
    kinds += ((str, "string"), (list, "array"), (dict, "table"))
    return next((name for t, name in kinds if isinstance(value, t)), "date/time")


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _or_list(values: tuple[Any, ...] | list[Any]) -> str:
    shown = [_show(v) for v in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


# -- checks across tables ----------------------------------------------------------------------


def _check_profile(p: Profile) -> Problems:
    problems: Problems = []
    names = list(p.cpusets)
    for name in names:
        if name == "keep":
            problems.append(
                ("cpusets.keep", "'keep' is reserved (it means 'leave as is'); choose another name")
            )
        elif not _SET_NAME.fullmatch(name):
            problems.append(
                (
                    key_path(("cpusets", name)),
                    f"{name!r} is not a set name; use lowercase letters, digits, '_' and '-', "
                    "starting with a letter",
                )
            )
    refs = set_refs(p)
    for name, spec in p.cpusets.items():
        refs += [
            (key_path(("cpusets", name, "exclude", i)), ex, False)
            for i, ex in enumerate(spec.exclude)
        ]
    for key, name, keep_ok in refs:
        if name not in p.cpusets:
            choices = [*names, "keep"] if keep_ok else names
            hint = f"use {_or_list(choices)}" if choices else f"define it first as [cpusets.{name}]"
            problems.append((key, f"unknown CPU set {name!r}; {hint}"))
    problems += _exclude_cycles(p)
    problems += _check_process_rules(p)
    problems += _check_aspm_bootargs(p)
    problems += check_partitions(p)
    if not problems:
        problems += overlaps(p, lambda name: static_cpus(p, name))
    return problems


def _exclude_cycles(p: Profile) -> Problems:
    problems: Problems = []
    reported: set[frozenset[str]] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name) :]
            if frozenset(cycle) not in reported:
                reported.add(frozenset(cycle))
                chain = " -> ".join([*cycle, name])
                key = key_path(("cpusets", cycle[0], "exclude"))
                problems.append((key, f"exclude cycle: {chain}; a set cannot subtract itself"))
            return
        spec = p.cpusets.get(name)
        for ex in spec.exclude if spec else ():
            visit(ex, [*path, name])

    for name in p.cpusets:
        visit(name, [])
    return problems


def _check_process_rules(p: Profile) -> Problems:
    problems: Problems = []
    mode = p.cpuset.mode if p.cpuset else "none"
    part = p.cpuset.cpus if p.cpuset else None
    seen: dict[str, int] = {}
    for i, rule in enumerate(p.process):
        at = f"process[{i}]"
        if rule.name in seen:
            msg = f"{rule.name!r} is already the name of process[{seen[rule.name]}]; rename one"
            problems.append((f"{at}.name", msg))
        seen.setdefault(rule.name, i)
        if rule.move_to_partition and mode not in _PARTITION_MODES:
            where = (
                "there is no [cpuset] table" if p.cpuset is None else f"[cpuset] mode is {mode!r}"
            )
            msg = (
                f"there is no partition to move into: {where}; set [cpuset] mode = 'isolated' "
                "or 'root', or move_to_partition = false"
            )
            problems.append((f"{at}.move_to_partition", msg))
        elif rule.move_to_partition and rule.cpus not in ("keep", part):
            msg = (
                f"{rule.cpus!r} is not the partition set {part!r} ([cpuset] cpus), and a process "
                f"moved into the partition can run only on its CPUs; use cpus = {part!r} or "
                "'keep', or move_to_partition = false"
            )
            problems.append((f"{at}.cpus", msg))
        if rule.by_gpu and rule.cpus == "keep":
            msg = "places each process on its GPU's CPUs of a set: give cpus = a [cpusets] name"
            problems.append((f"{at}.by_gpu", msg))
        if rule.by_gpu and rule.spread_threads:
            msg = (
                "spread_threads plans one CPU a thread over one set for the whole tree, and "
                "by_gpu gives each process its own GPU's CPUs: the two are not combined yet; "
                "use [cpuset] mode = 'root' (the scheduler balances inside each partition)"
            )
            problems.append((f"{at}.spread_threads", msg))
        if rule.without_gpu != "tree" and not rule.by_gpu:
            msg = "only has a meaning with by_gpu = true; remove it or set by_gpu"
            problems.append((f"{at}.without_gpu", msg))
        if rule.spread_threads and not (rule.move_to_partition and mode == "isolated"):
            msg = (
                "works only inside an isolated partition: needs move_to_partition = true and "
                "[cpuset] mode = 'isolated'"
            )
            problems.append((f"{at}.spread_threads", msg))
        problems += _check_who(rule, at)
    return problems


def _check_who(rule: ProcessConfig, at: str) -> Problems:
    """A rule that gives something worth having must say who may have it (issue: any local
    user got nice -10 and the server's CPUs by naming a script vllm.py)."""
    problems: Problems = []
    ex = rule.exclude
    if rule.children == "ignore" and (ex.comm or ex.cmdline is not None):
        msg = "has no effect with children = 'ignore' (no child is placed); remove it"
        problems.append((f"{at}.exclude", msg))
    grants = []
    if rule.nice is not None and rule.nice < 0:
        grants.append(f"nice {rule.nice}")
    if rule.policy in ("fifo", "rr"):
        grants.append(f"real-time policy {rule.policy!r}")
    if rule.cpus != "keep":
        grants.append(f"CPUs (set {rule.cpus!r})")
    if rule.move_to_partition:
        grants.append("the partition")
    if not grants or rule.any_user or rule.report_only or process.owner_key(rule.match):
        return problems
    msg = (
        f"any local user can start a process this rule matches (exe, comm, cmdline and "
        f"uses_gpu are every user's to choose: a script named vllm.py, exec -a), and it grants "
        f"{', '.join(grants)}; add match.user or match.uid (the account the server runs as), "
        "match.unit (its systemd system unit) or a match.cgroup outside /user.slice, or set "
        "any_user = true if every local user may have it"
    )
    problems.append((f"{at}.match", msg))
    return problems


def _check_aspm_bootargs(p: Profile) -> Problems:
    aspm = p.pcie_aspm
    if not (p.bootargs and p.bootargs.pcie_aspm == "off" and aspm):
        return []
    if aspm.policy == "keep" and aspm.gpu_links == "keep":
        return []
    msg = (
        "'off' leaves ASPM as firmware set it and removes the runtime controls [pcie_aspm] "
        "writes; to boot with ASPM off use extra = ['pcie_aspm.policy=performance'], or set "
        "[pcie_aspm] policy and gpu_links to 'keep'"
    )
    return [("bootargs.pcie_aspm", msg)]


# -- schema and generated docs -----------------------------------------------------------------


def profile_schema() -> dict[str, Any]:
    """JSON schema of a profile (by TOML key names), for ``gputunectl schema`` and editors."""
    schema = Profile.model_json_schema(by_alias=True)
    # Every tuner's model is called Config, so pydantic names them by module path
    # (gputuned__tuners__irq__Config); name them after their table instead (IrqConfig).
    renames = {
        old: "".join(w.capitalize() for w in old.split("__")[-2].removesuffix("_config").split("_"))
        + "Config"
        for old in schema.get("$defs", {})
        if old.endswith("__Config")
    }
    text = json.dumps(schema)
    for old, new in renames.items():
        text = text.replace(f'"#/$defs/{old}"', f'"#/$defs/{new}"')
    renamed: dict[str, Any] = json.loads(text)
    defs: dict[str, Any] = renamed.get("$defs", {})
    renamed["$defs"] = {
        renames.get(k, k): v | {"title": renames.get(k, k)} for k, v in defs.items()
    }
    return renamed


#: (TOML table heading, model, module whose docstring is that tuner's manual)
_SECTIONS: tuple[tuple[str, type[BaseModel], types.ModuleType | None], ...] = (
    ("[cpusets.<name>]", CpuSetSpec, None),
    ("[pcie_aspm]", PcieAspmConfig, pcie_aspm),
    ("[pcie_payload]", PciePayloadConfig, pcie_payload),
    ("[irq]", IrqConfig, irq),
    ("[cpuset]", CpusetConfig, cpuset),
    ("[[process]]", ProcessConfig, process),
    ("[bootargs]", BootargsConfig, bootargs),
    ("[daemon]", DaemonConfig, daemon_config),
)


def render_profile_docs() -> str:
    """docs/profiles.md, built from this module's and the tuners' docstrings and field docs."""
    out = [
        "# Profiles",
        "",
        "<!-- Generated by scripts/gen-docs from gputuned/profile.py and gputuned/tuners/; "
        "edit those, not this file. -->",
        "",
        inspect.cleandoc(__doc__ or ""),
        "",
        "Shipped profiles, commented line by line: `profiles/shared-host.toml`, "
        "`profiles/dedicated-inference.toml`, `profiles/latency-critical.toml`.",
        "",
        "## Top-level keys",
        "",
        *_field_lines(Profile, nested=False),
    ]
    for heading, model, module in _SECTIONS:
        out += ["", f"## `{heading}`", ""]
        doc = module.__doc__ if module else model.__doc__
        out += [inspect.cleandoc(doc or ""), "", "Keys:", "", *_field_lines(model)]
    return "\n".join(out) + "\n"


def _field_lines(model: type[BaseModel], prefix: str = "", nested: bool = True) -> list[str]:
    """One list item per key; with ``nested``, a sub-table's keys (`match.exe`) follow it."""
    lines: list[str] = []
    for name, info in model.model_fields.items():
        kind = _unwrap(info.annotation)
        default = info.get_default(call_default_factory=True)
        if info.is_required():
            default_text = "required"
        else:
            shown = "not set" if default is None else f"`{_toml_value(default)}`"
            default_text = f"default: {shown}"
        bounds = [
            f"{op} {getattr(m, attr)}"
            for m in info.metadata
            for attr, op in (("ge", ">="), ("le", "<="))
            if hasattr(m, attr)
        ]
        kind_text = _type_text(kind) + (f" ({', '.join(bounds)})" if bounds else "")
        lines.append(f"- `{prefix}{name}`: {kind_text}; {default_text}. {info.description}")
        if nested and _is_model(kind):
            lines += ["  " + line for line in _field_lines(kind, f"{prefix}{name}.")]
    return lines


def _type_text(annotation: Any) -> str:
    annotation = _unwrap(annotation)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " | ".join(f"`{_toml_value(v)}`" for v in typing.get_args(annotation))
    if origin in (tuple, list):
        return "array of " + _type_text(typing.get_args(annotation)[0]) + "s"
    if origin is dict:
        return "table of tables"
    if _is_model(annotation):
        return "table"
    # A float key takes an integer too (pydantic's lax mode): "number", as a profile writes it.
    kinds = {int: "integer", float: "number", bool: "boolean", str: "string"}
    return kinds.get(annotation, str(annotation))


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}"
    return str(value)
