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
    assert "not possible here irq 31 (virtio0-req.0)" in out or "refused irq 31" in out

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


#: Docker's default for a container's /proc: /proc/irq a read-only bind mount (its
#: ReadonlyPaths), so every IRQ affinity write fails with EROFS (fs/open.c do_dentry_open()).
RO_PROC_IRQ = "600 580 0:64 /irq /proc/irq ro,nosuid,nodev,noexec,relatime - proc proc rw\n"


def test_plan_apply_verify_and_status_agree_on_a_read_only_proc_irq(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31, item 7: plan said "20 change(s) apply makes", apply wrote none of them and
    called them not possible here, and verify without a daemon called them drifted (exit 1)."""
    root = tree_copy("h200-captured", tmp_path)
    with (root / "proc/self/mountinfo").open("a") as f:
        f.write(RO_PROC_IRQ)
    irq_before = {p: p.read_bytes() for p in (root / "proc/irq").rglob("*") if p.is_file()}
    prof = str(PROFILES / "shared-host.toml")

    rc, out, _ = run(capsys, "plan", prof, "--root", str(root), "--json")
    plan = json.loads(out)
    blocked = [c for c in plan["changes"] if c["not_possible"]]
    assert {c["tuner"] for c in blocked} == {"irq"} and len(blocked) >= 10
    assert all(
        c["not_possible"].startswith("read-only here (EROFS): /proc/irq is mounted read-only")
        for c in blocked
    )
    assert plan["not_possible"] == len(blocked)
    makes = len(plan["changes"]) - len(blocked) - plan["report_only"]
    rc, out, _ = run(capsys, "plan", prof, "--root", str(root))
    assert f"{makes} change(s) apply makes" in out
    assert f"{len(blocked)} not possible here" in out
    assert "irq (not possible here)" in out and "read-only here (EROFS)" in out

    # verify before any apply (no daemon, no state): not possible here, not drifted.
    rc, out, _ = run(capsys, "verify", prof, "--root", str(root), "--json")
    rep = json.loads(out)
    irq_lines = [s for s in rep["settings"] if s["tuner"] == "irq"]
    assert {s["status"] for s in irq_lines if s["target"] != "default affinity"} <= {
        "not possible here",
        "passed",
    }
    assert rep["counts"]["not possible here"] >= len(blocked)
    assert rep["counts"]["drifted"] > 0  # the rest of the profile, not applied yet
    assert not any(s["status"] == "drifted" and s["tuner"] == "irq" for s in rep["settings"])

    rc, out, _ = run(capsys, "apply", prof, "--root", str(root), "--json")
    applied = json.loads(out)
    assert rc == 0 and applied["failed"] == []
    assert not any(w["target"].startswith(("irq", "default")) for w in applied["written"])
    assert {np["target"] for np in applied["not_possible"].values()} >= {
        c["target"] for c in blocked
    }
    assert {p: p.read_bytes() for p in (root / "proc/irq").rglob("*") if p.is_file()} == irq_before

    rc, out, _ = run(capsys, "verify", "--root", str(root), "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["exit_code"] == 0 and rep["counts"]["drifted"] == 0
    np_targets = {s["target"] for s in rep["settings"] if s["status"] == "not possible here"}
    assert np_targets >= {c["target"] for c in blocked}

    rc, out, _ = run(capsys, "status", "--root", str(root), "--json")
    status = json.loads(out)
    assert {np["target"] for np in status["not_possible"].values()} >= {
        c["target"] for c in blocked
    }


def test_revert_of_an_active_profile_with_an_empty_journal_says_what_it_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31, item 8: revert said "Nothing to revert: the journal is empty" while it made
    the profile no longer active."""
    root = str(tree_copy("h200-captured", tmp_path))
    quiet = tmp_path / "quiet.toml"
    quiet.write_text('name = "quiet"\n')  # manages nothing: apply writes nothing
    rc, out, _ = run(capsys, "apply", str(quiet), "--root", root, "--json")
    assert rc == 0 and json.loads(out)["written"] == []
    rc, out, _ = run(capsys, "status", "--root", root, "--json")
    assert json.loads(out)["active_profile"] == "quiet"

    rc, out, _ = run(capsys, "revert", "--root", root)
    assert rc == 0
    assert "Nothing to revert" not in out
    assert "No values to put back (the journal is empty); profile quiet is no longer active" in out
    rc, out, _ = run(capsys, "status", "--root", root, "--json")
    assert json.loads(out)["active_profile"] is None

    rc, out, _ = run(capsys, "apply", str(quiet), "--root", root)
    rc, out, _ = run(capsys, "revert", "--root", root, "--json")
    assert rc == 0 and json.loads(out)["deactivated"] == "quiet"
    rc, out, _ = run(capsys, "revert", "--root", root, "--json")
    assert rc == 0 and json.loads(out)["deactivated"] is None  # nothing was active
    rc, out, _ = run(capsys, "revert", "--root", root)
    assert "Nothing to revert: the journal is empty and no profile is active." in out
