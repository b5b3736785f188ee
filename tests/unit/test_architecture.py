"""The shape of the package: an import graph without cycles, rooms in a declared order that
imports only go down, and the simulator and the test machinery kept out of the live path.

Imports are read from the source (``ast``), at any depth: one inside a function counts as
much as one at the top, since it runs all the same (a cycle held apart by imports inside
functions is still a cycle). Imports under ``if TYPE_CHECKING:`` do not run; the run-time
graph leaves them out, the type graph counts them too (a type that sits one layer off is a
circle all the same). Importing ``gputuned.a.b`` runs ``gputuned/a/__init__.py`` first, so it
counts as an import of the package ``gputuned.a`` too.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "gputuned"

#: The one module that chooses the simulated kernel, where ``--root`` is parsed.
SIM_CHOOSER = "gputuned.root"

#: The rooms, bottom first: a module imports only from its own room or one below (types too).
#: "base" is the package's top-level modules (changes, cpulist, errors, exitcodes, textsafe,
#: userdocs);
#: "root" is gputuned/root.py, which picks the live or the simulated kernel.
ROOMS = (
    "base",
    "kernel",
    "sim",
    "root",
    "store",
    "settings",
    "profile",
    "tuners",
    "engine",
    "service",
    "watch",
    "daemon",
    "trial",
    "install",
    "cli",
)

#: Cycles left in the type graph, each to be taken apart (none in the run-time graph). The
#: last one (keeper runs placing's functions, which took the Keeper) went when placing took
#: the daemon's state by its description instead (gputuned/daemon/state.py).
KNOWN_TYPE_CYCLES: list[list[str]] = []


def module_name(path: Path, top: Path = PKG) -> str:
    parts = path.relative_to(top.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST, types: bool = False) -> Iterator[ast.AST]:
    """Every node, but not those under ``if TYPE_CHECKING:`` unless ``types``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if not types and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        yield node
        todo += list(ast.iter_child_nodes(node))


def imports_of(source: str, name: str, known: set[str], types: bool = False) -> set[str]:
    """The gputuned modules ``source`` (module ``name``) imports when it runs (with ``types``,
    for its type annotations too)."""
    out: set[str] = set()
    for node in _runtime_nodes(ast.parse(source), types):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{name}: a relative import; gputuned imports absolutely"
            base = node.module or ""
            # "from a import b" names module a.b when there is one, else a name in a.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for n in range(1, len(parts) + 1):  # a.b.c runs a/__init__, a/b/__init__ first
                prefix = ".".join(parts[:n])
                if prefix in known and prefix != name:
                    out.add(prefix)
    return out


def import_graph(top: Path = PKG, types: bool = False) -> dict[str, set[str]]:
    files = {module_name(p, top): p for p in top.rglob("*.py")}
    known = set(files)
    return {name: imports_of(p.read_text(), name, known, types) for name, p in files.items()}


def room_of(module: str, top: Path = PKG) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "base"
    if (top / parts[1]).is_dir():
        return parts[1]
    return "root" if parts[1] == "root" else "base"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 40, "expected the whole package"
    found = cycles(graph)
    assert found == [], "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_counting_type_only_imports_the_only_cycles_are_the_known_ones() -> None:
    found = cycles(import_graph(types=True))
    assert found == KNOWN_TYPE_CYCLES, "cycles counting TYPE_CHECKING imports:\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_imports_go_down_the_declared_order_of_rooms() -> None:
    graph = import_graph(types=True)
    rooms = {room_of(m) for m in graph}
    assert rooms == set(ROOMS), f"rooms not in ROOMS, or gone: {rooms ^ set(ROOMS)}"
    up = sorted(
        f"{m} ({room_of(m)}) imports {d} ({room_of(d)})"
        for m, deps in graph.items()
        for d in deps
        if ROOMS.index(room_of(d)) > ROOMS.index(room_of(m))
    )
    assert up == [], "imports up the order of rooms (ROOMS):\n" + "\n".join(up)


ARCH_DOC = PKG.parent / "docs" / "dev" / "architecture.md"


def missing_from_the_doc(doc: str, top: Path = PKG) -> list[str]:
    """Modules and rooms docs/dev/architecture.md does not name: each room has a row of its
    table (`` | `kernel/` | ... | ``) naming each of its modules in backquotes (``pci`` or
    ``pci.py``; in a folder of the room, the folder too: ``tables/``); a top-level module is
    named anywhere; every room of ROOMS has its place in the diagram."""
    rows = dict(re.findall(r"^\| `(\w+)/` \| (.*) \|$", doc, re.M))
    missing = [f"room {r}/ (no row)" for r in ROOMS if (top / r).is_dir() and r not in rows]
    missing += [f"room {r} (not in the diagram)" for r in ROOMS if r != "base" and
                f"{r}/" not in doc.split("## The rooms", maxsplit=1)[0] and f"{r}.py" not in doc]  # fmt: skip
    for path in sorted(top.rglob("*.py")):
        rel = path.relative_to(top)
        if rel.name in ("__init__.py", "__main__.py"):
            continue
        text = doc if len(rel.parts) == 1 else rows.get(rel.parts[0], "")
        named = f"`{rel.stem}`" in text or f"`{rel.name}`" in text
        if len(rel.parts) > 2:  # a folder inside a room: its own name too
            named = named and f"`{'/'.join(rel.parts[1:-1])}/`" in text
        if not named:
            missing.append(str(rel))
    return missing


def test_the_architecture_doc_names_every_room_and_module() -> None:
    assert missing_from_the_doc(ARCH_DOC.read_text()) == []


def test_the_doc_check_finds_what_is_missing() -> None:
    doc = ARCH_DOC.read_text()
    assert missing_from_the_doc(doc.replace("`tasks`", "tasks")) == [
        "kernel/tasks.py",
        "sim/tasks.py",
    ]
    without_row = re.sub(r"^\| `store/` \|.*$", "", doc, flags=re.M)
    assert "room store/ (no row)" in missing_from_the_doc(without_row)


def test_only_the_root_chooser_imports_the_simulator() -> None:
    graph = import_graph()
    importers = sorted(
        m
        for m, deps in graph.items()
        if not m.startswith("gputuned.sim") and any(d.startswith("gputuned.sim") for d in deps)
    )
    assert importers == [SIM_CHOOSER]


def imported_names(tree: ast.AST) -> list[str]:
    """The modules ``tree`` imports when it runs (``from a import b``: ``a``), at any depth."""
    names: list[str] = []
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
    return names


def test_nothing_in_gputuned_imports_the_test_machinery() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        names = imported_names(ast.parse(path.read_text()))
        bad += [f"{module_name(path)}: {n}" for n in names if n.split(".")[0] == "tests"]
    assert bad == []


def test_the_graph_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The detector itself: a cycle made only by an import inside a function is found, and an
    import under TYPE_CHECKING is not one."""
    pkg = tmp_path / "gputuned"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from gputuned.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from gputuned import a\n    return a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gputuned import d\n"
    )
    (pkg / "d.py").write_text("import gputuned.c\n")
    graph = import_graph(pkg)
    assert graph["gputuned.a"] == {"gputuned", "gputuned.sub", "gputuned.sub.b"}
    assert cycles(graph) == [["gputuned.a", "gputuned.sub.b"]]
    typed = import_graph(pkg, types=True)
    assert cycles(typed) == [["gputuned.a", "gputuned.sub.b"], ["gputuned.c", "gputuned.d"]]
    assert room_of("gputuned.sub.b", pkg) == "sub" and room_of("gputuned.c", pkg) == "base"
