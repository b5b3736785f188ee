"""The shipped systemd unit and udev rule, checked with systemd's own tools where they run here.

The unit is checked as install-system writes it (ExecStart= rewritten to a real program);
tests/e2e runs it under a real systemd.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gputuned.install.system import rewrite_exec_start

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd/gputuned.service"
RULE = REPO / "udev/90-gputuned.rules"
#: docs/systemd.md reports the level measured; past this a change weakened the sandbox.
MAX_EXPOSURE = 4.0


@pytest.fixture
def installed_unit(tmp_path: Path) -> Path:
    if shutil.which("systemd-analyze") is None:
        pytest.fail(
            "systemd-analyze is missing: scripts/test installs it (apt-get install systemd)"
        )
    path = tmp_path / "gputuned.service"
    path.write_text(rewrite_exec_start(UNIT.read_text(), "/bin/true"))
    return path


def test_unit_verifies_clean(installed_unit: Path) -> None:
    p = subprocess.run(
        ["systemd-analyze", "verify", str(installed_unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0 and p.stdout + p.stderr == "", p.stdout + p.stderr


def test_unit_exposure_offline(installed_unit: Path) -> None:
    p = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(installed_unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", p.stdout)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE, p.stdout


def test_every_directive_has_a_reason() -> None:
    """Each group of directives in [Service] sits under a comment saying why."""
    lines = UNIT.read_text().splitlines()
    section = ""
    bare = []
    for i, line in enumerate(lines):
        if line.startswith("["):
            section = line
            continue
        if section != "[Service]" or not line or line.startswith("#"):
            continue
        j = i - 1
        while j >= 0 and lines[j] and not lines[j].startswith(("#", "[")):
            j -= 1
        if j < 0 or not lines[j].startswith("#"):
            bare.append(line)
    assert bare == [], f"directives without a comment above their group: {bare}"


def test_udev_rule_matches_gpus_like_inspect() -> None:
    """The rule's GPU test is gputuned's own (PciDevice.is_gpu: class 0x03, NVIDIA or AMD)."""
    from gputuned.kernel.pci import GPU_VENDORS

    text = RULE.read_text()
    vendors = re.search(r'ATTR\{vendor\}!="([^"]+)"', text)
    assert vendors and {int(v, 16) for v in vendors.group(1).split("|")} == set(GPU_VENDORS)
    assert 'ATTR{class}!="0x03*"' in text
    assert 'ACTION!="add|bind|change"' in text
    assert 'TAG+="systemd", ENV{SYSTEMD_WANTS}+="gputuned.service"' in text
