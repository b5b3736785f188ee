"""`[workqueues]` against this machine's real kernel: the unbound workqueues' mask and each
WQ_SYSFS workqueue's own move to CPU 0, read back as the kernel prints them, verify passes, and
revert puts every mask back (the test puts them back itself if anything fails on the way)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned.cpulist import parse_mask
from gputuned.engine.apply import apply_profile, read_state, revert_all
from gputuned.engine.plan import plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.kernel.masks import WORKQUEUES
from gputuned.profile.load import parse_profile
from gputuned.store.state import ETC_DIR, JOURNAL
from tests.faults import live_kernel

pytestmark = pytest.mark.usefixtures("as_root")

PROFILE = {
    "name": "workqueues-live",
    "cpusets": {"housekeeping": {"cpus": "0"}},
    "workqueues": {"cpus": "housekeeping"},
}


def masks() -> dict[Path, str]:
    root = Path(WORKQUEUES)
    return {p: p.read_text() for p in [root / "cpumask", *sorted(root.glob("*/cpumask"))]}


@pytest.fixture
def before() -> Iterator[dict[Path, str]]:
    if not Path(WORKQUEUES, "cpumask").exists():
        pytest.skip(f"this kernel has no {WORKQUEUES}/cpumask (Linux before 4.2)")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: the masks must change for the test to mean anything")
    etc_existed = Path(ETC_DIR).exists()
    was = masks()
    try:
        yield was
    finally:
        if Path(JOURNAL).exists():
            revert_all(live_kernel())
        for path, text in was.items():  # in case revert itself failed
            if path.read_text() != text:
                path.write_text(text)
        if not etc_existed:
            import shutil

            shutil.rmtree(ETC_DIR, ignore_errors=True)


def test_unbound_work_moves_to_cpu_0_and_back(before: dict[Path, str]) -> None:
    profile = parse_profile(PROFILE, "test")
    _plan, report = apply_profile(live_kernel(), profile)
    assert report.failed == []
    after = masks()
    assert set(after) == set(before)
    assert {parse_mask(v) for v in after.values()} == {frozenset({0})}
    assert len(report.written) == len(before), "the global mask and each workqueue's own"
    rep = verify_plan(plan_profile(live_kernel(), profile), read_state(live_kernel()))
    assert rep.exit_code == 0, rep.to_json()

    rev = revert_all(live_kernel())
    assert rev.failed == []
    assert masks() == before
