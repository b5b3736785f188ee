"""docs/troubleshooting.md quotes every message a plan, apply or the daemon can give about what
it will not or cannot do here (issue 19, item 6), so the page cannot drift from the code.

The messages are read from the source, not from runs: every ``Refusal(...)`` reason, every
note a plan or the daemon adds (``notes.append``, ``setup_notes.append``), every reason
setting's ``not_possible`` returns (gputuned/settings/), and every error class in ``gputuned/errors.py``. A
reason built in an f-string is split at its placeholders; each literal piece of 10 characters
or more must appear in the page word for word (whitespace aside), so the page quotes it as it
prints, with ``<...>`` where the value goes. A reason held in a variable is followed to its
assignments in the same function (or the module); one that comes from elsewhere (an attribute,
an exception) must be in ``DYNAMIC`` below with where its text comes from, and that list is
checked both ways. Not covered: the text of errors raised elsewhere and shown inside a
placeholder (``not possible here: {exc}``); the page names their classes, which is checked.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "troubleshooting.md"
PACKAGE = REPO / "gputuned"
MIN_PIECE = 10
#: Functions (and properties) whose return values are reasons shown inside others: each
#: setting's "not possible here" reasons, why a cgroup layout has no partitions, why a PCI
#: function's registers cannot be used, the plan's line about a partition made in place and
#: why one is not.
_REASON_FUNCTIONS = (
    "not_possible",
    "why_no_partitions",
    "unusable",
    "why_not_in_place",
    "in_place_note",
    "why_no_cpu",
    "read_only_reason",
    "unused_keys_note",
)

#: Reasons that come from outside the call's function: (file, source text) -> where the text
#: they carry comes from (each of those is a literal this test checks, or an error class).
DYNAMIC: dict[tuple[str, str], str] = {
    (
        "gputuned/settings/threads.py",
        "str(exc)",
    ): "the PermissionDenied of a real-time policy write (kernel/tasks.py RT_REFUSED)",
    (
        "gputuned/tuners/daemon.py",
        "str(exc)",
    ): "resolve_metrics_allow()'s InvalidValue, quoted in the page",
    (
        "gputuned/settings/registry.py",
        "setting(op.kind).not_possible(op, exc)",
    ): "each setting's own not_possible (gputuned/settings/), whose reasons are checked here",
    (
        "gputuned/tuners/cpuset.py",
        "inplace.in_place_note(here, cpus, cfg.cgroup)",
    ): "tuners/inplace.py in_place_note() (with why_not_in_place()), quoted in the page",
    (
        "gputuned/kernel/pci.py",
        "self.config.unreadable[0][1]",
    ): "pciconfig._state(), quoted in the page",
    (
        "gputuned/tuners/neighbours.py",
        "why_no_cpu(layout.mode)",
    ): "why_no_cpu's returns, checked here (_REASON_FUNCTIONS)",
    (
        "gputuned/settings/sysfs.py",
        'read_only_reason("/proc/irq" if op.path.startswith("/proc/irq/") else op.path)',
    ): "read_only_reason's return, checked here (_REASON_FUNCTIONS)",
    (
        "gputuned/tuners/cpuset.py",
        "unused_keys_note(cfg)",
    ): "unused_keys_note's returns, checked here (_REASON_FUNCTIONS)",
}


def _templates(
    node: ast.expr, func: ast.AST | None, seen: frozenset[str], module: ast.Module
) -> Iterator[list[str] | ast.expr]:
    """Yield a list of literal pieces per message the expression can build, or the node itself
    when its text is not in this function."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield [node.value]
    elif isinstance(node, ast.JoinedStr):
        yield [
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        ]
    elif isinstance(node, ast.IfExp):
        yield from _templates(node.body, func, seen, module)
        yield from _templates(node.orelse, func, seen, module)
    elif isinstance(node, ast.Name) and node.id not in seen:
        found = False
        scopes = [func] if func is not None else []
        for sub in [s for scope in scopes for s in ast.walk(scope)] or module.body:
            if isinstance(sub, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == node.id for t in sub.targets
            ):
                found = True
                yield from _templates(sub.value, func, seen | {node.id}, module)
        if not found and func is not None:
            yield from _templates(node, None, seen, module)  # a module-level constant
        elif not found:
            yield node
    elif isinstance(node, ast.Name):
        yield []  # the variable itself inside its own reassignment: f"report only: {reason}"
    else:
        yield node


def _message_exprs(tree: ast.Module) -> Iterator[tuple[ast.expr, ast.AST | None]]:
    funcs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]

    def owner(node: ast.AST) -> ast.AST | None:
        inner = [f for f in funcs if node in set(ast.walk(f))]
        return min(inner, key=lambda f: len(list(ast.walk(f))), default=None)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "AspmPolicy" and len(node.args) > 3:
                yield node.args[3], owner(node)  # why the ASPM policy cannot change
            elif isinstance(f, ast.Name) and f.id == "Refusal":
                arg = (
                    node.args[2]
                    if len(node.args) > 2
                    else next(k.value for k in node.keywords if k.arg == "reason")
                )
                yield arg, owner(node)
            elif (
                isinstance(f, ast.Attribute)
                and f.attr == "append"
                and (
                    (
                        isinstance(f.value, ast.Attribute)
                        and f.value.attr in ("notes", "setup_notes")
                    )
                    or (isinstance(f.value, ast.Name) and f.value.id == "notes")
                )
            ):
                yield node.args[0], owner(node)
        elif isinstance(node, ast.FunctionDef) and node.name in _REASON_FUNCTIONS:
            for sub in ast.walk(node):
                value = sub.value if isinstance(sub, ast.Return) else None
                if value is not None and not (
                    isinstance(value, ast.Constant) and value.value is None
                ):
                    yield value, node


def messages() -> tuple[list[tuple[str, list[str]]], set[tuple[str, str]]]:
    """(where, literal pieces) per message template, and the dynamic sources."""
    found: list[tuple[str, list[str]]] = []
    dynamic: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if "data" in path.relative_to(PACKAGE).parts:
            continue
        text = path.read_text()
        rel = str(path.relative_to(REPO))
        tree = ast.parse(text)
        for expr, func in _message_exprs(tree):
            for t in _templates(expr, func, frozenset(), tree):
                if isinstance(t, list):
                    found.append((f"{rel}:{expr.lineno}", t))
                else:
                    dynamic.add((rel, ast.get_source_segment(text, t) or ast.dump(t)))
    return found, dynamic


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def missing(page: str) -> list[str]:
    """The literal pieces of the code's messages that ``page`` does not quote."""
    flat = _flat(page)
    found, _ = messages()
    return [
        f"{where}: {piece.strip()!r}"
        for where, pieces in found
        for piece in pieces
        if len(piece.strip()) >= MIN_PIECE and _flat(piece.strip()) not in flat
    ]


def test_the_page_quotes_every_refusal_and_note() -> None:
    gone = missing(PAGE.read_text())
    assert not gone, "docs/troubleshooting.md does not quote:\n" + "\n".join(gone)


def test_the_check_fails_on_a_page_without_the_quotes() -> None:
    # The scan finds the messages (at least one per tuner, apply and the daemon), so a page
    # that drops them fails the test above.
    found, _ = messages()
    files = {where.split(":")[0] for where, _ in found}
    for module in (
        "settings/sysfs.py",
        "daemon/core.py",
        "irq.py",
        "cpuset.py",
        "pcie_payload.py",
        "pcie_aspm.py",
    ):
        assert any(f.endswith(module) for f in files), module
    assert len(missing("")) > 50


def test_every_reason_from_elsewhere_is_accounted_for() -> None:
    _, dynamic = messages()
    assert dynamic == set(DYNAMIC), (
        f"new: {sorted(dynamic - set(DYNAMIC))}; gone: {sorted(set(DYNAMIC) - dynamic)}"
    )


def test_the_page_names_every_error_class() -> None:
    page = PAGE.read_text()
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert len(classes) >= 10
    assert not [c for c in classes if f"`{c}`" not in page]
