"""The forked children of the crash-point gauntlet report their exit status exactly.

The gauntlet starts and waits for children from several threads at once. multiprocessing's
``Process.start()`` polls every live child of the process (``_cleanup``), and two threads that
poll one child at once both read its status pipe: the second reads end-of-file and takes the
status as 255. A SIGKILL that fired then looked like ``exit 255`` (a CI run failed on it).
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

from tests.reliability import forked

CHILDREN = 600
THREADS = 8


def test_exit_statuses_are_exact_with_many_threads() -> None:
    def one(i: int) -> tuple[int, int]:
        want = -signal.SIGKILL if i % 2 else i % 7
        arg = "kill" if i % 2 else str(i % 7)
        child = forked.Forked("tests.reliability.exit_as", [arg], {})
        child.communicate(timeout=60)
        assert child.returncode is not None
        return want, child.returncode

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(one, range(CHILDREN)))
    wrong = [(i, want, got) for i, (want, got) in enumerate(results) if want != got]
    assert not wrong, f"{len(wrong)} of {CHILDREN} children: (index, wanted, got) {wrong[:10]}"
