"""Integration tests touch this machine's real kernel as root and put back what they change."""

from __future__ import annotations

import os

import pytest

from tests.integration.machine import missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: run scripts/test as root (CI does)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs("fact")`` (tests/integration/machine.py): not run, with the reason,
    on a machine without it (as root only: a user's run skips these tests for root anyway)."""
    if os.geteuid() != 0:
        return
    for mark in item.iter_markers("needs"):
        for fact in mark.args:
            why = missing(fact)
            if why:
                pytest.skip(f"not run on this machine: {why}")
