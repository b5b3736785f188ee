"""Run gputunectl or gputuned with a crash point: ``GPUTUNED_FAILPOINT`` from the environment.

    GPUTUNED_FAILPOINT=kill-after-write:6 python3 -m tests.failpoint gputuned.cli apply ...

:func:`install` makes every kernel that gputuned opens for ``--root`` (:func:`gputuned.root.
open_kernel`) a :class:`tests.faults.FaultKernel` with that failpoint: the process SIGKILLs
itself just before or just after its N-th write. Then the module named first runs as
``__main__``, exactly as ``python3 -m`` would run it. The crash-point gauntlet
(tests/reliability/test_crash_points.py) runs its subprocesses this way; the QEMU lane installs
it in the guest's shipped daemon through a ``sitecustomize`` (tests/e2e/vm/failpoint/).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import gputuned.root
from gputuned.kernel.port import Kernel
from tests.faults import FAILPOINT_ENV, FaultKernel, parse_failpoint


def install(failpoint: str) -> None:
    """From now on, :func:`gputuned.root.open_kernel` gives kernels with ``failpoint``."""
    parse_failpoint(failpoint)  # refuses a malformed one before anything runs
    real = gputuned.root.open_kernel

    def open_kernel(root: Path) -> Kernel:
        return FaultKernel(real(root), failpoint=failpoint)

    gputuned.root.open_kernel = open_kernel


def install_from_env() -> None:
    failpoint = os.environ.get(FAILPOINT_ENV, "")
    if failpoint:
        install(failpoint)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python3 -m tests.failpoint MODULE [ARGS...] (GPUTUNED_FAILPOINT set)")
    install_from_env()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
