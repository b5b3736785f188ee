"""Problems in a profile as people read them: pydantic's errors turned into TOML key paths
(``process[1].priority``) and plain messages that say what is allowed there."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

#: (key path, message) pairs: every problem of a profile, reported at once.
Problems = list[tuple[str, str]]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_path(loc: tuple[int | str, ...]) -> str:
    """``("process", 1, "priority")`` -> ``process[1].priority``, as the key is written in TOML."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if _BARE_KEY.fullmatch(part) else basic_string(part)
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


def basic_string(text: str) -> str:
    """``text`` as a TOML basic string, so that a quoted key reads back as the same key."""
    body = "".join(
        _TOML_ESCAPES.get(ch) or (f"\\u{ord(ch):04X}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)
        for ch in text
    )
    return f'"{body}"'


def problems_from(exc: ValidationError, root: type[BaseModel]) -> Problems:
    """Each error of ``exc`` (validating model ``root``) as (key path, plain message)."""
    problems: Problems = []
    for err in exc.errors(include_url=False):
        loc = _key_loc(root, err["loc"])
        item = (key_path(loc), _message(root, err["type"], loc, err))
        if item not in problems:
            problems.append(item)
    return problems


def _message(
    root: type[BaseModel], kind: str, loc: tuple[int | str, ...], err: Mapping[str, Any]
) -> str:
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind in ("value_error", "assertion_error"):
        return str(ctx["error"])
    if kind == "extra_forbidden":
        parent = unwrap(_annotation_at(root, loc[:-1]))
        allowed = ", ".join(parent.model_fields) if is_model(parent) else ""
        return f"unknown key {loc[-1]!r}; allowed keys here: {allowed}"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "string_too_short":
        return "must not be empty"
    annotation = unwrap(_annotation_at(root, loc))
    if kind == "literal_error":
        return f"{show(value)} is not allowed; use {or_list(typing.get_args(annotation))}"
    if kind in ("greater_than_equal", "less_than_equal"):
        lo, hi = _bounds(root, loc)
        if lo is not None and hi is not None:
            return f"must be from {lo} to {hi}; got {value}"
        limit = f"at least {lo}" if lo is not None else f"at most {hi}"
        return f"must be {limit}; got {value}"
    if kind.endswith(("_type", "_parsing")):
        return f"expected {_expected(annotation)}, got {_toml_type(value)} {show(value)}"
    return str(err.get("msg", kind))


def _key_loc(root: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """``loc`` without the names pydantic gives the members of a union it tried
    (``cap_cpus.float``, ``cap_cpus.str``): a key path the profile has."""
    for i in range(len(loc)):
        annotation = unwrap(_annotation_at(root, loc[:i]))
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            return loc[:i]
    return loc


def _expected_union(annotation: Any) -> str:
    members = [a for a in typing.get_args(annotation) if a is not type(None)]
    return _or_words([_expected(unwrap(a)) for a in members])


def _or_words(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _annotation_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> Any:
    current: Any = root
    for part in loc:
        current = unwrap(current)
        origin = typing.get_origin(current)
        if is_model(current) and isinstance(part, str):
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


def _bounds(root: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[int | None, int | None]:
    parent = unwrap(_annotation_at(root, loc[:-1]))
    lo = hi = None
    if is_model(parent) and isinstance(loc[-1], str):
        for meta in parent.model_fields[loc[-1]].metadata:
            lo = getattr(meta, "ge", lo)
            hi = getattr(meta, "le", hi)
    return lo, hi


def unwrap(annotation: Any) -> Any:
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


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _expected(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return _expected_union(annotation)
    if origin in (tuple, list):
        return "an array"
    if origin is dict or is_model(annotation):
        return "a table"
    kinds = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return kinds.get(annotation, "a value")


def _toml_type(value: object) -> str:
    kinds: tuple[tuple[type, str], ...] = ((bool, "boolean"), (int, "integer"), (float, "float"))
    kinds += ((str, "string"), (list, "array"), (dict, "table"))
    return next((name for t, name in kinds if isinstance(value, t)), "date/time")


def show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def or_list(values: tuple[Any, ...] | list[Any]) -> str:
    shown = [show(v) for v in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


# -- checks across tables ----------------------------------------------------------------------
