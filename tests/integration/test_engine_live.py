"""apply / verify / revert against this machine's real kernel: IRQs and real child processes.

Also the crash test: ``gputunectl apply`` is SIGKILLed at every write point, then
``gputunectl revert`` must bring every original value back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputuned.cpulist import parse_cpulist
from gputuned.engine.apply import apply_profile, read_state, revert_all
from gputuned.engine.plan import plan_profile
from gputuned.engine.verify import verify_plan
from gputuned.kernel.proc import read_process
from gputuned.profile.load import parse_profile
from gputuned.store.state import ETC_DIR, JOURNAL
from tests.faults import live_kernel

# The IRQ tuner writes default_smp_affinity: a container's read-only /proc/irq cannot take it.
pytestmark = [pytest.mark.usefixtures("as_root"), pytest.mark.needs("movable_irq")]

CHILD = textwrap.dedent(
    """
    import sys, threading, time
    for _ in range(3):
        threading.Thread(target=time.sleep, args=(300,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(300)
    """
)


def live_snapshot(pid: int) -> dict[str, str]:
    """Everything the test profile may change, as the kernel reports it."""
    snap = {}
    for irq in sorted(os.listdir("/proc/irq")):
        p = Path("/proc/irq") / irq / "smp_affinity_list"
        if p.exists():
            snap[str(p)] = p.read_text()
    snap["default"] = Path("/proc/irq/default_smp_affinity").read_text()
    proc = read_process(live_kernel(), pid)
    for t in proc.threads:
        snap[f"thread {t.tid}"] = f"{t.nice} {t.policy} {sorted(t.affinity)}"
    return snap


@pytest.fixture
def child() -> Iterator[tuple[int, str]]:
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        pytest.skip("needs 2 CPUs to move work between them")
    token = f"gputuned-it-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, token], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    etc_existed = Path(ETC_DIR).exists()
    try:
        yield proc.pid, token
    finally:
        if Path(JOURNAL).exists():
            revert_all(live_kernel())
        proc.kill()
        proc.wait()
        if not etc_existed:
            shutil.rmtree(ETC_DIR, ignore_errors=True)


def profile_for(token: str) -> dict[str, object]:
    return {
        "name": "it",
        "cpusets": {"housekeeping": {"cpus": "0"}, "inference": {"cpus": "1"}},
        "irq": {"others_cpus": "housekeeping", "default_affinity": "housekeeping"},
        "process": [
            {
                "name": "child",
                "match": {"cmdline": token, "uid": 0},
                "cpus": "inference",
                "nice": 5,
                "policy": "batch",
            }
        ],
    }


def test_apply_verify_revert_on_the_real_kernel(child: tuple[int, str]) -> None:
    pid, token = child
    before = live_snapshot(pid)
    prof = parse_profile(profile_for(token), "it")
    host = live_kernel()
    _plan, report = apply_profile(host, prof)
    assert report.failed == [], report.failed
    proc = read_process(live_kernel(), pid)
    assert len(proc.threads) == 4
    for t in proc.threads:
        assert (t.nice, t.policy, t.affinity) == (5, "batch", frozenset({1})), t
    moved = [w for w in report.written if w["target"].startswith("irq ")]
    assert moved, "at least one IRQ of this machine is movable"
    for w in moved:
        irq = w["target"].split()[1]
        assert parse_cpulist(Path(f"/proc/irq/{irq}/smp_affinity_list").read_text()) == {0}
    unmovable = [v for v in report.not_possible.values() if v["target"].startswith("irq ")]
    for v in unmovable:
        assert v["reason"].startswith("unmovable (E")
    rep = verify_plan(plan_profile(live_kernel(), prof), read_state(live_kernel()))
    assert rep.count("drifted") == 0, [ln for ln in rep.lines if ln.status == "drifted"]
    assert rep.exit_code == 0
    rev = revert_all(live_kernel())
    assert rev.failed == []
    assert live_snapshot(pid) == before
    assert not Path(JOURNAL).exists()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """gputunectl; with GPUTUNED_FAILPOINT, through the test entry point (tests/failpoint.py)."""
    entry = ["tests.failpoint"] if "GPUTUNED_FAILPOINT" in (env or {}) else []
    return subprocess.run(
        [sys.executable, "-m", *entry, "gputuned.cli", *args],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
    )


def test_sigkill_at_every_write_point_then_revert(child: tuple[int, str], tmp_path: Path) -> None:
    pid, token = child
    prof_file = tmp_path / "it.toml"
    prof_file.write_text(_toml(profile_for(token)))
    before = live_snapshot(pid)
    done = _cli("apply", str(prof_file), "--json")
    assert done.returncode == 0, done.stderr
    total = len(json.loads(done.stdout)["written"])
    assert _cli("revert").returncode == 0
    assert live_snapshot(pid) == before
    assert total >= 5
    # Enumerate every write point (not a sample): kill before and after write N for N = 1, 2,
    # ... until an apply runs to the end without reaching N.
    survived = journaled = 0
    for when in ("before", "after"):
        point = 0
        while True:
            point += 1
            run = _cli(
                "apply", str(prof_file), env={"GPUTUNED_FAILPOINT": f"kill-{when}-write:{point}"}
            )
            if run.returncode == 0:
                break
            assert run.returncode == -signal.SIGKILL, (point, when, run.stderr)
            journaled += Path(JOURNAL).exists()
            rev = _cli("revert")
            assert rev.returncode == 0, rev.stdout + rev.stderr
            assert live_snapshot(pid) == before, (point, when)
            survived += 1
        assert _cli("revert").returncode == 0
        assert point > total, "every journaled write was a kill point"
    print(
        f"crash points: {survived} tried, {survived} restored exactly, {journaled} with a journal"
    )
    assert journaled >= 2 * total - 2


def _toml(d: dict[str, object]) -> str:
    cs = d["cpusets"]
    assert isinstance(cs, dict)
    rule = d["process"][0]  # type: ignore[index]
    return textwrap.dedent(
        f"""
        name = "it"
        [cpusets.housekeeping]
        cpus = "0"
        [cpusets.inference]
        cpus = "1"
        [irq]
        others_cpus = "housekeeping"
        default_affinity = "housekeeping"
        [[process]]
        name = "child"
        match.cmdline = "{rule["match"]["cmdline"]}"
        match.uid = 0
        cpus = "inference"
        nice = 5
        policy = "batch"
        """
    )
