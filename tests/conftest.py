"""Shared fixtures for the whole suite."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gputuned.host.fs import Host

# ---- host trees (tests/data/hosts, built by tests/data/build_trees.py) ---------------------

TREES_DIR = Path(__file__).resolve().parent / "data" / "hosts"

#: Every tree under tests/data/hosts; docs/trees.md describes the layout. All but h200-captured
#: (a `gputunectl capture` of the lent H200 VM) are built by tests/data/build_trees.py.
ALL_TREES = (
    "h200-vm",
    "h200-captured",
    "ci-vm",
    "dual-socket-8gpu",
    "degraded-link",
    "four-gpu-one-socket",
    "two-gpu-one-node",
)


@pytest.fixture
def tree_host() -> Callable[[str], Host]:
    """``tree_host("h200-vm")`` -> a ``Host`` rooted at that committed tree (read it, don't
    write it: copy the tree to ``tmp_path`` first for tests that apply changes)."""

    def make(name: str) -> Host:
        if name not in ALL_TREES:
            raise ValueError(f"no host tree {name!r}; known: {', '.join(ALL_TREES)}")
        return Host(TREES_DIR / name)

    return make


# ---- end of host trees ----------------------------------------------------------------------
