"""Bad input: 10,000 generated profiles through the real gate; garbage on the control socket.

Documents come from hypothesis: profiles built from every table's keys with plausible values,
then (most of the time) broken by one to three mutations: a wrong type, an unknown key, a value
out of range, a literal no table allows, a CPU list that does not parse, a set that does not
exist, an exclude cycle, a duplicate rule name, a missing required key; plus free-form tables of
random keys and a few documents that are not TOML or not UTF-8. They are rendered by the small
TOML writer below (tomllib only reads) and must read back equal.

For each document, written to a file:

- ``load_profile`` either returns a Profile (valid) or raises ProfileError (invalid); nothing
  else may escape;
- every problem of an invalid one names a key path that exists in the document, or a required
  key missing from a table that exists; only a document that is not TOML (or not UTF-8) gets a
  problem without a key;
- an invalid document goes through ``gputunectl apply --root TREE FILE`` (in-process): exit 4,
  and not one write, mkdir or thread operation reaches the Host (counted at ``FaultKernel._check_fault``,
  which every mutation passes), and the tree stays byte-identical.

The control socket of a real daemon process gets malformed requests (one of them, 60,000
nested "[", crashed the daemon with a RecursionError before gputuned/service/control.py caught
it), random byte lines, an oversized line, a client that never reads its answers, more clients
than the limit, and clients that stall or trickle: the daemon answers, drops whom it must, and
keeps serving status to everyone else.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import types
import typing
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import gputuned.root
from gputuned.cli import main as cli
from gputuned.errors import GputunedError, ProfileError
from gputuned.kernel import Kernel
from gputuned.profile import tables as declared
from gputuned.profile.load import load_profile
from gputuned.profile.messages import is_model, key_path, unwrap
from gputuned.service.control import daemon_running, request
from tests.faults import FaultKernel, tree_kernel
from tests.reliability.conftest import REPO, reap_daemon, stop_daemon, subprocess_env
from tests.unit.test_apply import PROFILES, digest, tree_copy

#: Documents per run (GPUTUNED_FUZZ_EXAMPLES overrides it, e.g. for a longer local run).
#: Shrinking a failure can take minutes here (each example runs the CLI); the failing document
#: is reported as generated instead.
NO_SHRINK = (Phase.explicit, Phase.generate)
EXAMPLES = int(os.environ.get("GPUTUNED_FUZZ_EXAMPLES", "10000"))

# -- a small TOML writer ----------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(k: str) -> str:
    return k if _BARE.fullmatch(k) else toml_str(k)


def toml_str(s: str) -> str:
    """A TOML basic string: quote, backslash and control characters (DEL too) escaped."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            repr(v)
            if math.isfinite(v)
            else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
        )
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def _is_aot(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def to_toml(doc: dict[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """Scalars and inline arrays first, then [tables], then [[arrays of tables]]."""
    lines = [
        f"{toml_key(k)} = {toml_value(v)}"
        for k, v in doc.items()
        if not isinstance(v, dict) and not _is_aot(v)
    ]
    for k, v in doc.items():
        if isinstance(v, dict):
            head = ".".join(toml_key(p) for p in (*prefix, k))
            lines += ["", f"[{head}]", to_toml(v, (*prefix, k))]
    for k, v in doc.items():
        if _is_aot(v):
            head = ".".join(toml_key(p) for p in (*prefix, k))
            for item in v:
                lines += ["", f"[[{head}]]", to_toml(item, (*prefix, k))]
    return "\n".join(lines) + "\n"


# -- generators ------------------------------------------------------------------------------
#
# One generator of documents, driven by a Chooser: either hypothesis's own draws (every choice a
# hypothesis choice: the native strategies, ~5 ms a document here) or a random.Random that
# hypothesis seeds (one draw a document, so that 10,000 fit in the suite's time budget).

SET_NAMES = [
    "housekeeping",
    "inference",
    "gpu0",
    "a",
    "b-2",
    "net_irqs",
    "x9",
    "rest",
    "io",
    "spare",
]
CPULISTS = ["0", "1", "0-3", "2-5", "1,3", "4-7", "0-1,8", "15", "1-4", "6"]
BAD_CPULISTS = ["", "3-1", "a", "0-", "1,,2", "-1", "0x3", "1-2-3", "9999999999"]
UNKNOWN_KEYS = ["colour", "Nice", "cpu", "mode2", "ünïcode key", "a.b", "", "include2"]
BAD_LITERALS = ["isolate", "Performance", "on", "", "KEEP", "max_safe"]
RANGE_BREAKERS = [
    ("process", "nice", 25), ("process", "nice", -21), ("process", "priority", 100),
    ("process", "priority", 0), ("pcie_payload", "mrrs", 100), ("pcie_payload", "mps", 8192),
    ("daemon", "drift_interval_s", 0.1), ("daemon", "nvml_interval_s", 1e9),
    ("cpusets", "count", 0), ("cpusets", "gpu_local", -1),
]  # fmt: skip
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
SCALAR = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    TEXT,
    st.floats(allow_nan=False, allow_infinity=False),
)
ANY_VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)
# A fresh container each draw (st.builds), never st.just(<list or dict>): st.just hands out one
# object, and a mutation in break_profile that lands inside it (an unknown key added to that
# table) changed every later draw of it. Generation then depended on earlier examples, which
# hypothesis reports as FlakyStrategyDefinition ("the second run stopped drawing earlier").
WRONG_VALUES = st.one_of(SCALAR, st.builds(lambda: [1, "a"]), st.builds(lambda: {"x": 1}))


class Chooser:
    """The choices a document is made of."""

    def pick(self, seq: list[Any]) -> Any:
        raise NotImplementedError

    def flip(self) -> bool:
        raise NotImplementedError

    def num(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def some(self, seq: list[Any], lo: int, hi: int) -> list[Any]:
        """Distinct items of ``seq``, between ``lo`` and ``hi`` of them."""
        raise NotImplementedError

    def value(self) -> Any:
        """Anything TOML can hold (for wrong types and free-form tables)."""
        raise NotImplementedError

    def table(self) -> dict[str, Any]:
        """A free-form table of random keys."""
        raise NotImplementedError


class Draws(Chooser):
    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def pick(self, seq: list[Any]) -> Any:
        return self.draw(st.sampled_from(seq))

    def flip(self) -> bool:
        return self.draw(st.booleans())

    def num(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def some(self, seq: list[Any], lo: int, hi: int) -> list[Any]:
        return self.draw(st.lists(st.sampled_from(seq), min_size=lo, max_size=hi, unique=True))

    def value(self) -> Any:
        return self.draw(WRONG_VALUES)

    def table(self) -> dict[str, Any]:
        return self.draw(st.dictionaries(TEXT, ANY_VALUE, max_size=4))


class Seeded(Chooser):
    _CHARS = "abcXYZ09 _-.\"'\\\t\n\x00\x7fé中😀="

    def __init__(self, rnd: random.Random) -> None:
        self.r = rnd

    def pick(self, seq: list[Any]) -> Any:
        return self.r.choice(seq)

    def flip(self) -> bool:
        return self.r.random() < 0.5

    def num(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def some(self, seq: list[Any], lo: int, hi: int) -> list[Any]:
        return self.r.sample(seq, self.r.randint(lo, min(hi, len(seq))))

    def text(self) -> str:
        return "".join(self.r.choice(self._CHARS) for _ in range(self.r.randint(0, 10)))

    def value(self, depth: int = 0) -> Any:
        kind = self.r.randrange(7 if depth < 2 else 5)
        if kind == 0:
            return self.flip()
        if kind == 1:
            return self.r.choice([0, -1, 1, 2**63 - 1, -(2**63), self.r.randint(-1000, 1000)])
        if kind == 2:
            return self.r.choice([0.0, -0.0, 1.5, 1e300, -2.5e-7, self.r.uniform(-1e6, 1e6)])
        if kind in (3, 4):
            return self.text()
        if kind == 5:
            return [self.value(depth + 1) for _ in range(self.r.randint(0, 3))]
        return {self.text(): self.value(depth + 1) for _ in range(self.r.randint(0, 3))}

    def table(self) -> dict[str, Any]:
        return {self.text(): self.value() for _ in range(self.r.randint(0, 4))}


def make_cpusets(c: Chooser) -> dict[str, Any]:
    names = c.some(SET_NAMES, 1, 4)
    out: dict[str, Any] = {}
    for i, name in enumerate(names):
        base = c.pick(["cpus", "gpu_local", "numa_node", "all"])
        value: Any = (
            c.pick(CPULISTS)
            if base == "cpus"
            else c.num(0, 8)
            if base == "gpu_local"
            else c.num(0, 2)
            if base == "numa_node"
            else True
        )
        spec: dict[str, Any] = {base: value}
        if i and c.flip():  # only earlier sets: no cycles unless a mutation adds one
            spec["exclude"] = c.some(names[:i], 0, 2)
        if c.flip():
            spec["count"] = c.num(1, 8)
        if base == "gpu_local" and c.flip():
            spec["fallback_all"] = c.flip()
        out[name] = spec
    return out


#: The tables make_profile writes by hand, with values that hang together. Every other declared
#: table (gputuned/profile/tables/) is generated from its model by from_model.
BY_HAND = {"pcie_aspm", "pcie_payload", "irq", "cpuset", "process", "bootargs", "daemon", "gpus"}


def from_model(c: Chooser, model: type[BaseModel], sets: list[str]) -> dict[str, Any]:
    """A table of ``model``: each optional key there or not, values its type allows (a string
    is a set's name or "keep", which most string keys of a table are)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if info.is_required() or c.flip():
            out[name] = _model_value(c, info.annotation, info.metadata, sets)
    return out


def _model_value(c: Chooser, annotation: Any, metadata: list[Any], sets: list[str]) -> Any:
    kind = unwrap(annotation)
    origin = typing.get_origin(kind)
    if origin is typing.Literal:
        return c.pick(list(typing.get_args(kind)))
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return _model_value(c, c.pick(options), metadata, sets)
    if origin in (tuple, list):
        return [_model_value(c, typing.get_args(kind)[0], [], sets) for _ in range(c.num(0, 2))]
    if is_model(kind):
        return from_model(c, kind, sets)
    lo = next((m.ge for m in metadata if hasattr(m, "ge")), -5)
    hi = next((m.le for m in metadata if hasattr(m, "le")), 1000)
    if kind is bool:
        return c.flip()
    if kind is int:
        return c.num(int(lo), int(min(hi, lo + 10**6)))
    if kind is float:
        return c.num(int(lo * 10), int(min(hi, lo + 1000) * 10)) / 10
    return c.pick([*sets, "keep"])


def make_profile(c: Chooser) -> dict[str, Any]:
    """A profile that is valid more often than not (cross checks can still refuse it)."""
    sets = make_cpusets(c)
    names = list(sets)
    doc: dict[str, Any] = {"name": c.pick(["shared-host", "a", "Dedicated Inference", "x-1", "é"])}
    if c.flip():
        doc["description"] = c.pick(["", "for vLLM", "multi\nline", 'quote " and \\'])
    doc["cpusets"] = sets
    # Partition and IRQ sets must not overlap: the partition takes one set, IRQs the others.
    part = c.pick(names)
    others = [n for n in names if n != part] or ["keep"]
    if c.flip():
        doc["cpuset"] = {"mode": c.pick(["isolated", "root", "affinity", "none"]), "cpus": part}
        if c.flip():
            doc["cpuset"]["cgroup"] = c.pick(["gputuned.inference", "a/b", "x"])
    if c.flip():
        doc["irq"] = {
            "gpu_cpus": c.pick([part, "keep"]),
            "others_cpus": c.pick([*others, "keep"]),
            "default_affinity": c.pick([*others, "keep"]),
            "spread": c.flip(),
            "irqbalance": c.pick(["coordinate", "report", "ignore"]),
        }
    if c.flip():
        doc["pcie_aspm"] = {
            "policy": c.pick(["keep", "default", "performance", "powersave", "powersupersave"]),
            "gpu_links": c.pick(["keep", "disable"]),
            "report_only": c.flip(),
        }
    if c.flip():
        doc["pcie_payload"] = {
            "mps": c.pick(["keep", "max-safe", 128, 256, 4096]),
            "mrrs": c.pick(["keep", 128, 512, 4096]),
            "allow_mps_change": c.flip(),
        }
    mode = doc.get("cpuset", {}).get("mode", "none")
    rules = []
    for i in range(c.num(0, 3)):
        policy = c.pick(["keep", "other", "batch", "idle", "fifo", "rr"])
        key = c.pick(["cmdline", "comm", "exe", "uses_gpu", "unit", "cgroup"])
        match_value = {
            "cmdline": "^python3? .*vllm",
            "comm": "python3",
            "exe": "/usr/bin/python3",
            "uses_gpu": 0,
            "unit": "vllm.service",
            "cgroup": "/system.slice/vllm.service",
        }[key]
        rule: dict[str, Any] = {
            "name": f"rule{i}",
            "match": {key: match_value},
            "cpus": c.pick([part, "keep"]),
            "policy": policy,
        }
        if c.flip():
            rule["nice"] = c.num(-20, 19)
        if policy in ("fifo", "rr"):
            rule["priority"] = c.num(1, 99)
        if mode in ("isolated", "root") and c.flip():
            rule["move_to_partition"] = True
            rule["spread_threads"] = mode == "isolated" and c.flip()
        # A rule that grants something and matches only by what every user chooses (exe,
        # comm, cmdline, uses_gpu) is refused unless it names who may have it (issue 14):
        # name the server's account, or allow any user, in most such rules.
        if key not in ("unit", "cgroup"):
            who = c.pick(["user", "any_user", "any_user", "neither"])
            if who == "user":
                rule["match"]["user"] = "vllm"
            elif who == "any_user":
                rule["any_user"] = True
        rules.append(rule)
    if rules:
        doc["process"] = rules
    if c.flip():
        doc["bootargs"] = {"extra": c.some(["quiet", "mitigations=off"], 0, 2)}
    if c.flip():
        doc["daemon"] = {
            "drift_interval_s": c.pick([0.5, 10, 10.0, 3600]),
            "revert_on_shutdown": c.flip(),
        }
    if c.flip():  # a GPU of the trees, one of no tree
        doc["gpus"] = {"skip": c.some(["0000:01:00.0", "0000:99:00.0"], 0, 2)}
    for table in declared.tables():
        if table.key not in BY_HAND and c.flip():
            value = from_model(c, table.model, names)
            doc[table.key] = [value] if table.many else value
    return doc


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path in a document (tables and array items)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*at, k)
            yield from _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield (*at, i)
            yield from _paths(v, (*at, i))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def break_profile(c: Chooser, doc: dict[str, Any]) -> dict[str, Any]:
    """Zero to three mutations, each of which (alone) nearly always makes a profile invalid."""
    rule = {"name": "r", "match": {"comm": "x"}}
    for _ in range(c.num(0, 3)):
        kind = c.pick(
            [
                "type",
                "unknown",
                "range",
                "literal",
                "cpulist",
                "dangling",
                "cycle",
                "dup",
                "missing",
            ]
        )
        # A mutation after a type change may meet a table that is no longer one: skip it.
        with contextlib.suppress(TypeError, KeyError, IndexError, AttributeError):
            if kind == "type":
                path = c.pick(list(_paths(doc)))
                _get(doc, path[:-1])[path[-1]] = c.value()
            elif kind == "unknown":
                tables = [p for p in [(), *_paths(doc)] if isinstance(_get(doc, p), dict)]
                _get(doc, c.pick(tables))[c.pick(UNKNOWN_KEYS)] = 1
            elif kind == "range":
                table, key, value = c.pick(RANGE_BREAKERS)
                if table == "process":
                    doc.setdefault("process", [dict(rule)])[0][key] = value
                elif table == "cpusets":
                    doc["cpusets"][c.pick(list(doc["cpusets"]))][key] = value
                else:
                    doc.setdefault(table, {})[key] = value
            elif kind == "literal":
                table, key = c.pick(
                    [("cpuset", "mode"), ("irq", "irqbalance"), ("pcie_aspm", "policy")]
                )
                doc.setdefault(table, {})[key] = c.pick(BAD_LITERALS)
            elif kind == "cpulist":
                doc["cpusets"][c.pick(list(doc["cpusets"]))] = {"cpus": c.pick(BAD_CPULISTS)}
            elif kind == "dangling":
                doc.setdefault("irq", {})["others_cpus"] = "no-such-set"
            elif kind == "cycle":
                names = list(doc["cpusets"])
                doc["cpusets"][names[0]]["exclude"] = [names[-1]]
                doc["cpusets"][names[-1]]["exclude"] = [names[0]]
            elif kind == "dup":
                doc["process"] = [{**rule, "name": "same"}, {**rule, "name": "same"}]
            elif kind == "missing":
                victim = c.pick(["name", "match", "rule name"])
                if victim == "name":
                    doc.pop("name", None)
                else:
                    doc.setdefault("process", [dict(rule)])[0].pop(victim.split()[-1], None)
    return doc


def make_document(c: Chooser) -> dict[str, Any]:
    """Three in four: a profile, broken or not; else a free-form table of random keys."""
    if c.num(0, 3):
        return break_profile(c, make_profile(c))
    return c.table()


@st.composite
def drawn_documents(draw: st.DrawFn) -> dict[str, Any]:
    return make_document(Draws(draw))


SEEDED_DOCUMENTS = st.builds(lambda r: make_document(Seeded(r)), st.randoms(use_true_random=True))
NOT_TOML = st.one_of(
    st.sampled_from(
        [b"name = ", b"[irq\n", b"= 1\n", b"name = 'a'\nname = 'b'\n", b"\xff\xfe name", b"a = 1 2"]
    ),
    st.binary(max_size=40),
)


# -- checks -----------------------------------------------------------------------------------


def key_problems(doc: dict[str, Any] | None, exc: ProfileError) -> list[str]:
    """Problems whose key names nothing in the document (should be none).

    A key is compared with every key path of the document, written as gputuned writes them
    (``process[1].match.exe``, quoted parts for keys that are not bare).
    """
    bad = []
    existing = {key_path(p) for p in _paths(doc)} if doc is not None else set()
    tables = (
        {""} | {key_path(p) for p in _paths(doc) if isinstance(_get(doc, p), dict)} if doc else {""}
    )
    for key, msg in exc.problems:
        if key == "":
            if doc is not None:
                bad.append(f"no key for a parsed document: {msg}")
            continue
        if doc is None:
            bad.append(f"a key {key!r} for a document that is not TOML: {msg}")
            continue
        if key in existing:
            continue
        parent, _, _last = key.rpartition(".")
        if "required key is missing" in msg and parent in tables:
            continue
        bad.append(f"{key}: {msg}")
    return bad


@contextlib.contextmanager
def count_mutations() -> Iterator[list[str]]:
    """Every write, mkdir, rmdir and thread operation any Host attempts (even refused ones)."""
    seen: list[str] = []
    real = FaultKernel._check_fault

    def check(self: FaultKernel, op: str, hpath: str) -> None:
        if op != "read":
            seen.append(f"{op} {hpath}")
        real(self, op, hpath)

    FaultKernel._check_fault = check  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        FaultKernel._check_fault = real  # type: ignore[method-assign]


@contextlib.contextmanager
def patched(obj: object, name: str, value: object) -> Iterator[None]:
    real = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, real)


def test_generated_values_are_fresh_objects() -> None:
    """Values drawn for mutations must not be shared between examples: break_profile mutates
    what it placed in a document, and a shared container would carry that into later draws."""
    drawn: list[Any] = []

    # The integer in front lets hypothesis draw the same container in many examples (a branch
    # without choices of its own would be drawn once and then counted as exhausted).
    @settings(max_examples=300, database=None, phases=NO_SHRINK)
    @given(st.integers(0, 10**6), WRONG_VALUES)
    def mutate(_n: int, value: Any) -> None:
        if isinstance(value, list):
            assert value == [1, "a"], value
            value.append("mutated")
        elif isinstance(value, dict):
            assert value == {"x": 1}, value
            value["mutated"] = 1
        drawn.append(value)

    mutate()
    containers = [v for v in drawn if isinstance(v, list | dict)]
    assert len(containers) >= 10, (
        "the strategy must draw containers often for this to test anything"
    )


def test_fuzz_profiles(tmp_path: Path, terminal: list[str], fault_kernels: None) -> None:
    tree = tree_copy("h200-captured", tmp_path)
    before = digest(tree)
    doc_file = tmp_path / "fuzz.toml"
    counts: Counter[str] = Counter()
    failures: list[str] = []
    # gputunectl apply, as cli.main runs it (parser built once; main only adds logging setup
    # and the printing of the error).
    apply_args = cli.build_parser().parse_args(["apply", "--root", str(tree), str(doc_file)])
    # The kernels the command opens are the tests' (fault_kernels), whose mutations are
    # counted: every apply opens one, or the count would see nothing.
    opened = [0]
    wrapped = gputuned.root.open_kernel

    def open_kernel(root: Path) -> Kernel:
        opened[0] += 1
        kernel = wrapped(root)
        assert isinstance(kernel, FaultKernel)
        return kernel

    def check(raw: bytes, doc: dict[str, Any] | None) -> None:
        doc_file.write_bytes(raw)
        try:
            load_profile(doc_file)
        except ProfileError as exc:
            counts["invalid"] += 1
            failures.extend(key_problems(doc, exc))
            with count_mutations() as seen, patched(gputuned.root, "open_kernel", open_kernel):
                try:
                    rc = apply_args.func(apply_args)
                except GputunedError as err:
                    rc = err.exit_code
            if rc != 4 or seen:
                failures.append(f"rejected document reached the host: rc {rc}, {seen[:3]}")
        else:
            counts["valid"] += 1
        if len(failures) > 20:
            pytest.fail("\n".join(failures))

    def one(doc: dict[str, Any]) -> None:
        text = to_toml(doc)
        assert tomllib.loads(text) == doc, "the TOML writer must round-trip"
        check(text.encode(), doc)

    quick = settings(
        deadline=None,
        database=None,
        phases=NO_SHRINK,
        suppress_health_check=list(HealthCheck),
    )
    native, not_toml_n = EXAMPLES // 10, EXAMPLES // 20

    @settings(quick, max_examples=native)
    @given(drawn_documents())
    def drawn(doc: dict[str, Any]) -> None:
        one(doc)

    @settings(quick, max_examples=EXAMPLES - native - not_toml_n)
    @given(SEEDED_DOCUMENTS)
    def seeded(doc: dict[str, Any]) -> None:
        one(doc)

    drawn()
    seeded()

    @settings(quick, max_examples=not_toml_n)
    @given(NOT_TOML)
    def not_toml(raw: bytes) -> None:
        try:
            doc = tomllib.loads(raw.decode())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            doc = None
        check(raw, doc)

    not_toml()
    total = counts["valid"] + counts["invalid"]
    terminal.append(
        f"profile fuzzing: {total} documents, {counts['valid']} valid (loaded), "
        f"{counts['invalid']} invalid (rejected, every problem naming its key; 0 host writes)"
    )
    assert not failures, "\n".join(failures[:20])
    assert total >= EXAMPLES
    assert counts["valid"] >= total // 10 and counts["invalid"] >= total // 10
    assert opened[0] == counts["invalid"], "every rejected apply counted on a kernel of its own"
    assert digest(tree) == before and not (tree / "run/gputuned").exists()


# -- bad input on the control socket ----------------------------------------------------------

GARBAGE = [
    b"\xff\xfe\x00garbage",
    b"not json at all",
    b"[]",
    b"null",
    b'"a string"',
    b'{"cmd": "status"}',
    b'{"v": 2, "cmd": "status"}',
    b'{"v": true, "cmd": "status"}',
    b'{"v": 1}',
    b'{"v": 1, "cmd": 5}',
    b'{"v": 1, "cmd": ""}',
    b'{"v": 1, "cmd": "no-such-command"}',
    b'{"v": 1, "cmd": "apply"}',
    b'{"v": 1, "cmd": "apply", "profile": "/no/such/profile.toml"}',
    b'{"v": 1, "cmd": "apply", "profile": "/dev/zero"}',
    b'{"v": 1, "cmd": "register", "pid": "x"}',
    b'{"v": 1, "cmd": "unregister", "pid": -1}',  # not a process ID: refused (issue 13)
    b'{"v": 1, "cmd": "register", "pid": true, "start": 1}',
    b'{"v": 1, "cmd": "register", "pid": 1, "start": 1}',
    b'{"v": 1, "cmd": "unregister", "pid": 99999999}',
    b'{"v": 1, "cmd": "status", "extra": ' + b"1" * 4000 + b"}",
    b"[" * 60000,  # deep nesting within the line limit: json.loads raises RecursionError
    b'{"a":' * 30000,
]


#: Malformed but harmless: a status with an extra field, an unregister of a process that
#: gputuned never placed.
_ACCEPTED = (b'{"v": 1, "cmd": "status", "extra"', b'{"v": 1, "cmd": "unregister", "pid": 999')


def _refused(junk: bytes, answer: dict[str, Any] | None) -> bool:
    if answer is None:
        return False
    if junk.startswith(_ACCEPTED):
        return answer["ok"] is True
    return answer["ok"] is False and bool(answer["error"])


_pending: dict[int, bytes] = {}  # bytes read past a line, per socket


def _line(sock: socket.socket, timeout: float = 15) -> dict[str, Any] | None:
    """One response line, or None when the daemon hung up without one."""
    sock.settimeout(timeout)
    buf = _pending.pop(id(sock), b"")
    while b"\n" not in buf:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    if rest:
        _pending[id(sock)] = rest
    out = json.loads(line)
    assert isinstance(out, dict)
    return out


def test_control_socket_garbage_keeps_the_daemon_serving(terminal: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="gtd-"))  # sun_path holds 108 bytes: a short path
    try:
        _garbage_run(work, terminal)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _garbage_run(work: Path, terminal: list[str]) -> None:
    root = tree_copy("degraded-link", work)
    before = digest(root)
    prof = work / "p.toml"
    shutil.copy(PROFILES / "shared-host.toml", prof)
    d = subprocess.Popen(
        [sys.executable, "-m", "gputuned.daemon", "--root", str(root), "--profile", str(prof)],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    host = tree_kernel(root)
    path = str(root / "run/gputuned/control.sock")

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        return s

    def serving() -> bool:
        assert d.poll() is None, f"the daemon died: {d.communicate()[1][-1500:]}"
        return bool(request(host, {"cmd": "status"})["ok"])

    try:
        deadline = time.monotonic() + 30
        while not daemon_running(host):
            assert d.poll() is None and time.monotonic() < deadline, d.communicate()[1][-800:]
            time.sleep(0.02)
        # Clients that stall: half a request, and one byte every half second.
        slow = connect()
        slow.sendall(b'{"v": 1, "cmd": "sta')
        trickle = connect()
        stop = threading.Event()

        def drip() -> None:
            for b in b'{"v": 1, "cmd": "status"}':
                if stop.wait(0.5):
                    return
                try:
                    trickle.send(bytes([b]))
                except OSError:
                    return

        dripper = threading.Thread(target=drip)
        dripper.start()
        t_stalled = time.monotonic()
        # Garbage, each on its own connection: one error line each, the daemon keeps serving.
        answers = []
        for junk in GARBAGE:
            with connect() as s:
                s.sendall(junk + b"\n")
                answers.append(_line(s))
            assert serving()
        wrong = [(j[:40], a) for j, a in zip(GARBAGE, answers, strict=True) if not _refused(j, a)]
        assert not wrong, wrong
        # Random bytes (hypothesis), pipelined on one connection with a status after each.
        sent = [0]
        with connect() as s:

            @settings(max_examples=300, deadline=None, database=None, phases=NO_SHRINK)
            @given(st.binary(max_size=300).filter(lambda b: b"\n" not in b and b.strip()))
            def random_line(junk: bytes) -> None:
                s.sendall(junk + b"\n" + b'{"v": 1, "cmd": "status"}\n')
                first, second = _line(s), _line(s)
                assert first is not None and first["ok"] is False, first
                assert second is not None and second["ok"] is True
                sent[0] += 1

            random_line()
        # An oversized line: error, hang up.
        with connect() as s:
            s.sendall(b"x" * (70 * 1024))
            big = _line(s)
        assert big is not None and "request too large" in big["error"]
        # A client that sends and never reads: dropped after the 1 s send timeout.
        mute = connect()
        mute.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            for _ in range(5000):
                mute.send(b'{"v": 1, "cmd": "status"}\n')
        t0 = time.monotonic()
        assert serving()
        mute_wait = time.monotonic() - t0
        mute.close()
        # 40 clients at once (the limit is 32): the extra ones are told to retry.
        crowd = [connect() for _ in range(40)]
        time.sleep(0.3)
        refused = 0
        for s in crowd:
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError, ConnectionResetError):
                refused += b"too many clients" in s.recv(4096)
            s.close()
        assert refused >= 8 - 1, refused  # 40 - 32 (one slot may be free of the stalled ones)
        assert serving()
        # The stalled clients are dropped 10 s after their first byte, with a reason.
        late = _line(slow, timeout=20)
        assert late is not None and "not finished within 10 s" in late["error"], late
        late2 = _line(trickle, timeout=20)
        stop.set()
        dripper.join()
        assert late2 is not None and "not finished within 10 s" in late2["error"], late2
        stalled_for = time.monotonic() - t_stalled
        slow.close()
        trickle.close()
        assert serving()
        stop_daemon(d)
    finally:
        reap_daemon(d)
    assert digest(root) == before
    terminal.append(
        f"control socket: {len(GARBAGE)} malformed requests (deep nesting, bad UTF-8, wrong "
        f"version, unknown commands, bad arguments) + {sent[0]} random byte lines answered with "
        f"errors; oversized line refused; 40 clients at once ({refused} told to retry); a client "
        f"that never reads delayed others {mute_wait:.1f} s; stalled and trickling clients dropped "
        f"after {stalled_for:.0f} s; the daemon served status after each and reverted exactly"
    )
