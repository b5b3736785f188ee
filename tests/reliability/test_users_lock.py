"""Test accounts exist in one suite at a time (tests/users.py, USERS_LOCK).

Two suites on one kernel (the quick-start lane's roots beside the outer suite) each made
``gputuned-test2`` with ``useradd --system``, both got uid 999, and one suite's ``userdel``
failed on the other's process ("currently used by process N"), leaving the account behind
(seen in a full ``scripts/test`` run with the lane beside the rest).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests import users
from tests.users import users_lock


def test_an_account_is_held_against_other_suites_until_it_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lock file of this test's own: the shared one may be held by a suite running beside.
    lock = tmp_path / "users.lock"
    monkeypatch.setattr(users, "USERS_LOCK", lock)
    if shutil.which("flock") is None:
        pytest.skip("flock (util-linux) is missing")

    def _other_suite_gets_lock() -> bool:
        """Whether another process could take the lock right now (flock -n)."""
        return subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode == 0

    assert _other_suite_gets_lock(), "nobody holds the lock before"
    with users_lock():
        assert not _other_suite_gets_lock()
        with users_lock():  # a second account in the same suite: no deadlock
            assert not _other_suite_gets_lock()
        assert not _other_suite_gets_lock(), "still held by the outer account"
    assert _other_suite_gets_lock(), "released with the last account"
