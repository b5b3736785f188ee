"""A script of ``benchmarks/`` loaded as a module, for the tests of its arithmetic and output
(the scripts are not a package: they run as ``python3 benchmarks/NAME.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str, *, register: bool = False) -> ModuleType:
    """``benchmarks/NAME.py`` as a fresh module. Its folder goes on ``sys.path``, as when it
    runs (the scripts import the harness beside them, benchmarks/harness/); ``register`` also
    puts it in ``sys.modules`` under NAME (dataclasses look their module up there)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
