"""plan and status find TuneD's active profile and a running irqbalance, and say what to do
(issue 19, item 5): read from a tree's /etc/tuned, /usr/lib/tuned and /proc."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputuned.cli import main as cli
from gputuned.kernel import tuned
from gputuned.sim.tree import SimKernel
from tests.fakeproc import add_process
from tests.unit.test_apply import PROFILES, tree_copy

#: The parts of TuneD's cpu-partitioning profile that matter here (its tuned.conf has more).
CPU_PARTITIONING = """\
[main]
summary=Optimize for CPU partitioning
include=network-latency

[variables]
isolated_cores=${isolated_cores}

[systemd]
cpu_affinity=${not_isolated_cores_expanded}

[irqbalance]
banned_cpus=${isolated_cores}

[scheduler]
isolated_cores=${isolated_cores}

[bootloader]
cmdline_cpu_part=+nohz=on nohz_full=${isolated_cores} nosoftlockup
"""
#: Governor, C-states and sysctls only: nothing gputuned also sets.
NETWORK_LATENCY = "[main]\nsummary=low latency\n\n[cpu]\nforce_latency=1\n\n[sysctl]\nx=1\n"
TUNED_PID, IRQBALANCE_PID = 900, 901


def tuned_profile(root: Path, name: str, text: str, where: str = "usr/lib/tuned") -> None:
    conf = root / where / name / "tuned.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(text)


def activate(root: Path, names: str, *, running: bool = True) -> None:
    (root / "etc/tuned").mkdir(parents=True, exist_ok=True)
    (root / "etc/tuned/active_profile").write_text(names + "\n")
    if running:
        add_process(
            root, TUNED_PID, comm="tuned", cmdline=["/usr/bin/python3", "-Es", "/usr/sbin/tuned"],
            exe="/usr/bin/python3.11", start_time=90, cgroup="/system.slice/tuned.service",
        )  # fmt: skip


def with_irqbalance(root: Path) -> None:
    add_process(
        root, IRQBALANCE_PID, comm="irqbalance", cmdline=["/usr/sbin/irqbalance", "--foreground"],
        exe="/usr/sbin/irqbalance", start_time=91, cgroup="/system.slice/irqbalance.service",
    )  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = cli.main(list(args))
    return rc, " ".join(capsys.readouterr().out.split())


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tree_copy("h200-captured", tmp_path)


def test_what_in_a_tuned_profile_places_cpus_or_irqs(root: Path) -> None:
    tuned_profile(root, "cpu-partitioning", CPU_PARTITIONING)
    tuned_profile(root, "network-latency", NETWORK_LATENCY)
    activate(root, "cpu-partitioning")
    found = tuned.read_active(SimKernel(root))
    assert found is not None and found.names == ("cpu-partitioning",) and not found.missing
    assert found.touches == (
        "[scheduler] isolated_cores",
        "[irqbalance] banned_cpus",
        "[systemd] cpu_affinity",
        "[bootloader] nohz_full",
    )
    assert tuned.overlaps(tuned.parse_conf(NETWORK_LATENCY)) == []
    sched = "[scheduler]\ndefault_irq_smp_affinity = ignore\ngroup.ksoftirqd=0:f:2:*:^ksoftirqd"
    assert tuned.overlaps(tuned.parse_conf(sched)) == ["[scheduler] group.*"]


def test_the_users_folder_and_tuned_2_24s_layout_win(root: Path) -> None:
    tuned_profile(root, "mine", "[scheduler]\nisolated_cores=2-7\n")
    tuned_profile(root, "mine", NETWORK_LATENCY, where="etc/tuned/profiles")  # the user's copy
    activate(root, "mine", running=False)
    found = tuned.read_active(SimKernel(root))
    assert found is not None and found.touches == ()
    assert found.files == ("/etc/tuned/profiles/mine/tuned.conf",)


def test_hostile_tuned_files_end_in_a_bounded_answer(root: Path) -> None:
    tuned_profile(root, "a", "[main]\ninclude=b\n[irqbalance]\nbanned_cpus=1\n")
    tuned_profile(root, "b", "[main]\ninclude=a, ../../etc/shadow, ${x}\n")  # a loop, junk
    activate(root, "a ../../x \x1b[31m", running=False)
    found = tuned.read_active(SimKernel(root))
    assert found is not None and found.names == ("a",) and found.missing == ()
    assert found.touches == ("[irqbalance] banned_cpus",)
    (root / "etc/tuned/active_profile").write_text("\n")
    assert tuned.read_active(SimKernel(root)) is None


def test_plan_says_tuned_would_undo_the_profile(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tuned_profile(root, "cpu-partitioning", CPU_PARTITIONING)
    activate(root, "cpu-partitioning")
    rc, out = run(capsys, "plan", str(PROFILES / "shared-host.toml"), "--root", str(root))
    assert rc == 0
    assert (
        "TuneD's active profile 'cpu-partitioning' places CPUs or IRQs too ([scheduler] "
        "isolated_cores, [irqbalance] banned_cpus, [systemd] cpu_affinity, [bootloader] "
        f"nohz_full); TuneD runs (PID {TUNED_PID}). It and gputuned would undo each other's work"
    ) in out
    # network-latency, which it includes, is not on this host: said, not guessed at.
    assert (
        "TuneD's active profile names network-latency, found in none of /etc/tuned/profiles, "
        "/etc/tuned, /usr/lib/tuned/profiles, /usr/lib/tuned"
    ) in out


def test_a_harmless_tuned_profile_is_not_mentioned(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tuned_profile(root, "network-latency", NETWORK_LATENCY)
    activate(root, "network-latency")
    _, out = run(capsys, "plan", str(PROFILES / "shared-host.toml"), "--root", str(root))
    assert "TuneD" not in out


def test_status_says_what_tuned_and_irqbalance_do(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tuned_profile(root, "realtime-ish", "[scheduler]\nisolated_cores=2-7\n")
    activate(root, "realtime-ish", running=False)
    rc, out = run(capsys, "status", "--root", str(root))
    assert rc == 0 and out.startswith("No profile applied")
    assert (
        "note TuneD's active profile 'realtime-ish' places CPUs or IRQs too ([scheduler] "
        "isolated_cores); TuneD is not running now, and applies it when it starts."
    ) in out

    with_irqbalance(root)
    assert run(capsys, "apply", str(PROFILES / "shared-host.toml"), "--root", str(root))[0] in (
        0,
        3,
    )
    rc, out = run(capsys, "status", "--root", str(root), "--json")
    notes = json.loads(out)["coexistence"]
    assert f"irqbalance runs (PID {IRQBALANCE_PID}); irq.irqbalance = 'coordinate' tells" in (
        " ".join(notes)
    )


def test_plan_without_irq_table_warns_of_irqbalance(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with_irqbalance(root)
    prof = tmp_path / "no-irq.toml"
    text = (PROFILES / "shared-host.toml").read_text()
    prof.write_text(text.split("\n[irq]\n")[0] + "\n[pcie_aspm]" + text.split("\n[pcie_aspm]")[1])
    _, out = run(capsys, "plan", str(prof), "--root", str(root))
    assert (
        f"irqbalance runs (PID {IRQBALANCE_PID}) and this profile has no [irq] table: "
        "irqbalance may put device IRQs on the CPUs the profile keeps for the server"
    ) in out
