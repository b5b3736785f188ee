"""benchmarks/config_fuzz.py, small: its oracle, and that it finds a report that names nothing.

The 10,000-round figures are in docs/dev/reliability.md; here a few dozen rounds show the harness
passes on the current code and fails when inspect stops naming unreadable fields.
"""

from __future__ import annotations

import struct
from pathlib import Path
from types import ModuleType

import pytest

from tests import benchscript
from tests.conftest import TREES_DIR

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "config_fuzz.py"


def load() -> ModuleType:
    return benchscript.load("config_fuzz", register=True)


def h200() -> bytes:
    return next(
        (TREES_DIR / "h200-vm" / "sys" / "devices").rglob("0000:00:06.0/config")
    ).read_bytes()


def test_oracle() -> None:
    fz = load()
    raw = bytearray(h200())
    assert fz.expected_unreadable(bytes(raw)) == set()
    assert fz.expected_unreadable(b"\xff" * 256) == {"not responding"}
    assert fz.expected_unreadable(bytes(raw[:12])) == {"config space"}
    assert fz.expected_unreadable(bytes(raw[:64])) == {"config space"}
    no_caps = bytearray(raw[:63])
    no_caps[6] &= ~0x10  # no capability list: the missing byte 63 is one no one reads
    assert fz.expected_unreadable(bytes(no_caps)) == set()
    cap = fz.pcie_cap(bytes(raw))
    struct.pack_into("<H", raw, cap + 8, 0xFFFF)
    assert fz.expected_unreadable(bytes(raw)) == {
        "DevCtl Max_Payload_Size",
        "DevCtl Max_Read_Request_Size",
    }


def test_a_short_run_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert load().main(["--count", "40", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "40 mutated config spaces" in out and "tracebacks: 0" in out


def test_it_fails_when_a_field_goes_unnamed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gputuned.engine.inspect

    monkeypatch.setattr(gputuned.engine.inspect, "register_findings", lambda dev, topo: [])
    assert load().main(["--count", "8", "--seed", "7"]) == 1
    out = capsys.readouterr().out
    assert "unreadable field not named: 0" not in out
