"""[cpuset] favordynmods through the engine on this machine's real cgroup2 mount (root only).

apply → /proc/self/mountinfo shows the option → apply again writes nothing → verify passes →
revert → the mount's options (the superblock's and the mount's own) are back byte for byte.
Whatever fails, the original options are put back (finally). The host lock is held for the whole
test, so that an apply or benchmark of someone else cannot interleave; a busy lock or another
profile's journal is waited for a while rather than failed on or touched.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.engine.apply import apply_profile, read_state, revert_all
from gputuned.engine.plan import plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.kernel.mounts import MOUNTINFO, parse_line
from gputuned.kernel.system import read_cgroup_layout
from gputuned.profile.load import parse_profile
from gputuned.store.state import ACTIVE, JOURNAL, STATE, HostLock
from tests.faults import FaultKernel, live_kernel

pytestmark = pytest.mark.usefixtures("as_root")

WAIT_S = 300.0  # for another apply, revert or benchmark holding /run/gputuned/lock
PROFILE = {"name": "it-favordynmods", "cpuset": {"mode": "none", "favordynmods": True}}


def cgroup2_line(point: str) -> str:
    """The mountinfo line of the cgroup2 mount at ``point`` (the last one: it is on top)."""
    lines = [
        ln
        for ln in Path(MOUNTINFO).read_text().splitlines()
        if (m := parse_line(ln)) and m.point == point and m.fstype == "cgroup2"
    ]
    assert lines, f"no cgroup2 mount at {point} in {MOUNTINFO}"
    return lines[-1]


@pytest.fixture
def locked_host() -> Iterator[FaultKernel]:
    """The live host, its lock held, with no other profile's journal on it."""
    host = live_kernel()
    deadline = time.monotonic() + WAIT_S
    while True:
        lock = HostLock(host)
        try:
            lock.__enter__()
        except errors.Busy:
            why = "another gputuned apply, revert or benchmark holds /run/gputuned/lock"
        else:
            if not Path(JOURNAL).exists():
                break
            lock.__exit__()
            why = f"another profile is applied here ({JOURNAL} exists); not touching it"
        if time.monotonic() > deadline:
            pytest.skip(f"waited {WAIT_S:.0f} s: {why}")
        time.sleep(2)
    try:
        yield host
    finally:
        lock.__exit__()


@pytest.fixture
def saved_state() -> Iterator[None]:
    """apply records state.json and active.json; put both back as they were."""
    saved = {p: Path(p).read_bytes() if Path(p).exists() else None for p in (STATE, ACTIVE)}
    try:
        yield
    finally:
        for p, data in saved.items():
            if data is None:
                Path(p).unlink(missing_ok=True)
            else:
                Path(p).write_bytes(data)


def test_favordynmods_apply_verify_revert_on_the_real_mount(
    locked_host: FaultKernel, saved_state: None
) -> None:
    host = locked_host
    point = read_cgroup_layout(host).v2_mount
    if point is None:
        pytest.skip("no cgroup2 hierarchy mounted on this machine")
    before = cgroup2_line(point)
    options = parse_line(before)
    assert options is not None
    if "favordynmods" in options.super_options.split(","):
        pytest.skip(f"{point} is mounted with favordynmods already: nothing to apply")
    prof = parse_profile(PROFILE, "it")
    try:
        _plan, report = apply_profile(host, prof, lock=False)
        assert report.failed == [] and report.not_possible == {}, report.to_json()
        assert [w["target"] for w in report.written] == [f"cgroup2 mount options ({point})"]
        during = parse_line(cgroup2_line(point))
        assert during is not None
        assert set(during.super_options.split(",")) == {
            *options.super_options.split(","),
            "favordynmods",
        }
        assert during.options == options.options, "the mount's own flags were kept"

        _plan, again = apply_profile(host, prof, lock=False)
        assert again.written == [], "re-applying writes nothing"
        rep = verify_plan(plan_profile(host, prof), read_state(host))
        assert [ln.status for ln in rep.lines] == ["passed"], rep.to_json()

        rev = revert_all(host, lock=False)
        assert rev.failed == [], rev.to_json()
        assert cgroup2_line(point) == before, "the original options are back exactly"
        assert not Path(JOURNAL).exists()
    finally:
        if Path(JOURNAL).exists():
            revert_all(host, lock=False)
        if cgroup2_line(point) != before:  # the engine could not: remount by hand
            host.remount(point, "cgroup2", options.super_options)
        assert cgroup2_line(point) == before


def test_an_unknown_option_is_refused_and_changes_nothing(locked_host: FaultKernel) -> None:
    """EINVAL from the kernel's option parser (fs_parse()) comes before any change."""
    host = locked_host
    point = read_cgroup_layout(host).v2_mount
    if point is None:
        pytest.skip("no cgroup2 hierarchy mounted on this machine")
    before = cgroup2_line(point)
    current = parse_line(before)
    assert current is not None
    try:
        with pytest.raises(errors.InvalidValue) as info:
            host.remount(point, "cgroup2", f"{current.super_options},gputuned_no_such_option")
        assert info.value.errno == errno.EINVAL
        assert "one is unknown to it" in str(info.value)
    finally:
        if cgroup2_line(point) != before:
            host.remount(point, "cgroup2", current.super_options)
    assert cgroup2_line(point) == before
