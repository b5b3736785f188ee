"""Every doc a message or a man page cites is one the Debian package ships (issue 31, item 10).

The package ships README.md and docs/*.md in /usr/share/doc/gputuned (scripts/build-deb's
``user_docs``); a message names the installed copy where there is one, docs/PAGE in a clone
(``gputuned.userdocs.cite``); the man pages, shipped only in the package, name installed paths
and no file of the repository. The deb lane checks the same against the real package.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from gputuned import userdocs
from gputuned.cli.manpages import write_all

TOP = Path(__file__).resolve().parents[2]
PKG = TOP / "gputuned"
INSTALLED = re.compile(r"/usr/share/doc/gputuned/([\w.-]+)")


def _build_deb() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("build_deb", str(TOP / "scripts" / "build-deb"))
    spec = importlib.util.spec_from_loader("build_deb", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shipped() -> set[str]:
    """The names of the docs build-deb puts in /usr/share/doc/gputuned."""
    return {p.name for p in _build_deb().user_docs()}


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    dest = tmp_path_factory.mktemp("man")
    # roff's "\-" and a line broken inside a path read back as the text a reader sees
    return {p.name: p.read_text().replace("\\-", "-") for p in write_all(dest)}


def test_the_package_ships_the_user_docs_not_the_developers(shipped: set[str]) -> None:
    assert {"README.md", "usage.md", "systemd.md", "troubleshooting.md"} <= shipped
    assert shipped == {"README.md", *(p.name for p in (TOP / "docs").glob("*.md"))}


def test_man_pages_cite_installed_docs_only(pages: dict[str, str], shipped: set[str]) -> None:
    for name, page in pages.items():
        bare = [m.group(0) for m in re.finditer(r"(?<![\w/])docs/[\w/.-]*", page)]
        assert bare == [], f"{name} cites docs by their place in a clone: {bare}"
        sources = re.findall(r"\b[\w.-]+/[\w/.-]*\.py\b", page)
        assert sources == [], f"{name} cites files of the repository: {sources}"
        cited = set(INSTALLED.findall(page))
        assert cited <= shipped, f"{name} cites docs the package does not ship: {cited - shipped}"
    assert INSTALLED.search(pages["gputuned-profile.5"]), "the profile page cites no doc at all?"


def _messages() -> list[tuple[str, str]]:
    """Every string of gputuned/ that is not a docstring: (where, text)."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "userdocs.py":  # where cite() spells the clone's path
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and (id(node) not in docstrings)
            ):
                found.append((f"{path.relative_to(TOP)}:{node.lineno}", node.value))
    return found


def test_messages_cite_docs_through_cite(shipped: set[str]) -> None:
    """A message names a doc with ``cite(PAGE)``, never as a path of the clone; and PAGE is
    one the package ships."""
    bare = [(where, text[:80]) for where, text in _messages() if re.search(r"\bdocs/", text)]
    assert bare == [], f"messages naming docs/ directly: {bare}"
    cited = set()
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name | ast.Attribute)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "cite"
            ):
                (arg,) = node.args
                assert isinstance(arg, ast.Constant), f"{path}: cite() of a computed name"
                cited.add(arg.value)
    assert cited, "no message cites a doc: is this test still looking at the right calls?"
    assert cited <= shipped, f"cited, not shipped: {cited - shipped}"


def test_cite_names_the_installed_copy_where_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(userdocs, "DOC_DIR", tmp_path)
    assert userdocs.cite("usage.md") == "docs/usage.md"  # a clone, the package not installed
    (tmp_path / "usage.md").write_text("# usage\n")
    assert userdocs.cite("usage.md") == f"{tmp_path}/usage.md"


def test_installed_rewrites_the_citations_of_a_text() -> None:
    text = "see docs/systemd.md and docs/multi-gpu.md#x, not docs/dev/trees.md"
    assert userdocs.installed(text) == (
        "see /usr/share/doc/gputuned/systemd.md and /usr/share/doc/gputuned/multi-gpu.md#x, "
        "not docs/dev/trees.md"
    )
