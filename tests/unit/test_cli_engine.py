"""gputunectl apply / verify / status / bootargs / revert on a tree, as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from tests.unit.test_apply import PROFILES, digest, tree_copy


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tree_copy("h200-captured", tmp_path))
    before = digest(Path(root))
    prof = str(PROFILES / "latency-critical.toml")
    rc, out, _ = run(capsys, "apply", prof, "--root", root)
    assert rc == 0
    assert "Applied latency-critical:" in out and "Undo with: gputunectl revert" in out
    assert "not possible here irq 31 (virtio0-req.0)" in out or "refused irq irq 31" in out

    rc, out, _ = run(capsys, "apply", prof, "--root", root, "--json")
    assert rc == 0 and json.loads(out)["written"] == []

    metrics = tmp_path / "gputuned.prom"
    rc, out, _ = run(capsys, "verify", "--root", root, "--prometheus", str(metrics))
    assert rc == 2, out  # boot arguments pending
    assert "pending reboot" in out and "nohz_full=2-15" in out
    assert 'gputuned_verify_exit_code{profile="latency-critical"} 2' in metrics.read_text()

    rc, out, _ = run(capsys, "verify", "--root", root, "--json")
    data = json.loads(out)
    assert data["exit_code"] == 2 and data["counts"]["drifted"] == 0

    rc, out, _ = run(capsys, "status", "--root", root, "--json")
    status = json.loads(out)
    assert status["active_profile"] == "latency-critical" and status["journal_entries"] > 10

    rc, out, _ = run(capsys, "bootargs", "--root", root)
    assert rc == 0 and out.splitlines()[0] == (
        "nohz_full=2-15 rcu_nocbs=2-15 irqaffinity=0-1 pcie_aspm.policy=performance"
    )
    rc, out, _ = run(capsys, "bootargs", "--root", root, "--write-grub")
    dropin = Path(root) / "etc/default/grub.d/gputuned.cfg"
    assert rc == 0 and "nohz_full=2-15" in dropin.read_text()

    rc, out, _ = run(capsys, "revert", "--root", root)
    assert rc == 0 and out.startswith("Restored ")
    assert not dropin.exists(), "revert removes the grub drop-in it journaled"
    after = {k: v for k, v in digest(Path(root)).items() if not k.startswith("etc")}
    assert after == {k: v for k, v in before.items() if not k.startswith("etc")}

    rc, out, _ = run(capsys, "revert", "--root", root)
    assert rc == 0 and "Nothing to revert" in out
    rc, _, err = run(capsys, "verify", "--root", root)
    assert rc == 3 and "none applied on this host" in err


def test_cli_apply_failure_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault_kernels: None
) -> None:
    root = tree_copy("dual-socket-8gpu", tmp_path)
    before = digest(root)
    # The partition cgroup cannot be created: the kernel refuses the mkdir.
    meta_file = root / "gputuned-tree.json"
    meta = json.loads(meta_file.read_text())
    meta["inject"] = [
        {"path": "/sys/fs/cgroup/gputuned.inference", "op": "mkdir", "errno": "EACCES"}
    ]
    meta_file.write_text(json.dumps(meta))
    before = digest(root)
    rc, _out, err = run(capsys, "apply", str(PROFILES / "shared-host.toml"), "--root", str(root))
    assert rc == 3
    assert "gputunectl apply:" in err and "cgroup gputuned.inference" in err
    assert digest(root) == before


@pytest.mark.parametrize("which", ["run/gputuned/state.json", "etc/gputuned/active.json"])
def test_cli_apply_refuses_untrusted_state_files_before_any_write(
    which: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, apply made every write and only failed when recording state.json/active.json."""
    root = tree_copy("h200-captured", tmp_path)
    f = root / which
    f.parent.mkdir(parents=True, mode=0o700)
    f.write_text("{}")
    f.chmod(0o666)
    before = digest(root)
    rc, _out, err = run(capsys, "apply", str(PROFILES / "shared-host.toml"), "--root", str(root))
    assert rc == 3
    assert f"/{which} is a link, or writable by others" in " ".join(err.split())
    assert digest(root) == before
    assert not (root / "run/gputuned/journal.jsonl").exists()
