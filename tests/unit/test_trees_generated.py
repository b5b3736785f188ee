"""The committed host trees are exactly what their generator makes from the captures.

The trees under tests/data/hosts are the unit suite's machines, and gputuned's own code
(``gputuned.cpulist`` among it) helped build them: a change there that also changed the trees
would be mirrored, not caught. The committed bytes are the fixed point: the generator, run again
now with this checkout's code, must give them back file for file, link for link.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
BUILDERS = (
    "build_h200_vm",
    "build_ci_vm",
    "build_dual_socket",
    "build_degraded_link",
    "build_four_gpu",
    "build_two_gpu",
)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_trees", DATA / "build_trees.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["build_trees"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _committed(root: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}
    for p in root.rglob("*"):
        rel = "/" + str(p.relative_to(root))
        if p.is_symlink():
            links[rel] = str(p.readlink())
        elif p.is_file():
            files[rel] = p.read_bytes()
    return files, links


@pytest.mark.parametrize("builder", BUILDERS)
def test_committed_tree_is_what_the_generator_makes(builder: str) -> None:
    gen = _generator()
    candidates = [gen.REPO / "shared" / "hosts", gen.REPO.parent / "shared" / "hosts"]
    if not any((c / "h200-vm.json").is_file() for c in candidates):
        pytest.skip("not run: no shared/hosts captures beside the checkout (CI has them)")
    tree = getattr(gen, builder)(gen.shared_hosts_dir())
    files, links = _committed(DATA / "hosts" / tree.name)
    meta = json.loads(files.pop("/gputuned-tree.json"))
    assert meta == {
        "name": tree.name,
        "source": tree.source,
        "note": tree.note,
        "write_errors": tree.write_errors,
    }
    assert sorted(set(files) ^ set(tree.files)) == [], "files only on one side"
    differ = sorted(k for k in files if files[k] != tree.files[k])
    assert differ == [], f"{tree.name}: committed bytes differ from the generator's"
    assert links == tree.links
