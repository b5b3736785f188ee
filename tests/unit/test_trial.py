"""gputunectl trial: the win rule, ABBA order, the verdict on simulated workloads, the host's
end state, Prometheus parsing, and the command end to end on a host tree."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gputuned import errors
from gputuned.cli.main import main
from gputuned.trial.scrape import parse_target, read_family
from gputuned.trial.windows import Pair, Rule, Trial, gain, judge, order, parse_rule, run_trial
from tests.unit.test_apply import PROFILES, digest, tree_copy


class Workload:
    """A simulated server: each window's metric is the applied side's level, times a slow
    drift of the host and some noise (seeded)."""

    def __init__(self, levels: dict[str, float], noise: float = 0.02, seed: int = 1) -> None:
        self.levels, self.noise = levels, noise
        self.rng = random.Random(seed)
        self.side = "start"
        self.applied: list[str] = []
        self.restored = 0
        self.windows = 0

    def apply(self, side: str) -> None:
        self.side = side
        self.applied.append(side)

    def measure(self) -> float:
        self.windows += 1
        drift = 1 + 0.01 * self.windows  # the host gets slower as the run goes on
        return self.levels[self.side] * drift * (1 + self.rng.uniform(-self.noise, self.noise))

    def restore(self) -> None:
        self.side = "start"
        self.restored += 1

    def trial(self, *, lower: bool = True) -> Trial:
        return Trial(self.apply, self.measure, self.restore, lower_is_better=lower)


def test_a_side_that_really_differs_wins_and_the_host_ends_on_it() -> None:
    w = Workload({"A": 10.0, "B": 8.0})  # B: 20 % less run-queue delay
    pairs, verdict = run_trial(w.trial(), Rule(10, 8, 3.0))
    assert verdict.winner == "B" and verdict.wins == 10
    assert 15 < verdict.median_gain < 25
    assert w.side == "B" and w.restored == 0
    assert len(pairs) == 10


def test_a_wins_when_a_is_better() -> None:
    w = Workload({"A": 100.0, "B": 80.0}, noise=0.0)
    _pairs, verdict = run_trial(w.trial(lower=False), Rule(10, 8, 3.0))  # higher is better
    assert verdict.winner == "A" and w.side == "A"
    # A's gain is over B: 100 against 80 is +25 % (not the 20 % B loses against A).
    assert verdict.median_gain == pytest.approx(25.0, abs=1.0)


def test_equal_sides_give_no_winner_and_the_host_as_it_started() -> None:
    w = Workload({"A": 10.0, "B": 10.0}, noise=0.05)
    _pairs, verdict = run_trial(w.trial(), Rule(10, 8, 3.0))
    assert verdict.winner is None
    assert verdict.why.startswith("no winner")
    assert w.side == "start" and w.restored == 1


def test_a_small_difference_below_the_declared_gain_is_no_winner() -> None:
    w = Workload({"A": 10.0, "B": 9.9}, noise=0.0)  # B better every time, by 1 %
    _pairs, verdict = run_trial(w.trial(), Rule(10, 8, 3.0))
    assert verdict.winner is None and verdict.wins == 10


def test_abba_order_cancels_drift() -> None:
    assert [order(i) for i in range(4)] == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]
    w = Workload({"A": 10.0, "B": 10.0}, noise=0.0)  # drift alone: +1 % each window
    pairs, verdict = run_trial(w.trial(), Rule(4, 3, 0.5))
    assert w.applied == ["A", "B", "B", "A", "A", "B", "B", "A"]
    # Drift makes the second window of each pair look worse: the pairs take turns.
    assert [p.gain > 0 for p in pairs] == [False, True, False, True]
    assert verdict.winner is None


def test_interrupt_restores_the_start() -> None:
    w = Workload({"A": 1.0, "B": 1.0})

    def measure() -> float:
        if w.windows == 3:
            raise KeyboardInterrupt
        return w.measure()

    trial = Trial(w.apply, measure, w.restore)
    with pytest.raises(KeyboardInterrupt):
        run_trial(trial, Rule(10, 8, 3.0))
    assert w.side == "start" and w.restored == 1


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("B wins if better in >= 8 of 10 pairs and median gain >= 3%", Rule(10, 8, 3.0)),
        ("better in >= 5 of 6 pairs", Rule(6, 5, 0.0)),
        ("A wins if it is better in 7 of 9 pairs, and the median gain >= 2.5 %", Rule(9, 7, 2.5)),
    ],
)
def test_rule_text(text: str, rule: Rule) -> None:
    assert parse_rule(text) == rule


@pytest.mark.parametrize("text", ["B wins sometimes", "better in >= 11 of 10 pairs"])
def test_bad_rules_are_refused(text: str) -> None:
    with pytest.raises(errors.GputunedError):
        parse_rule(text)


def test_values_under_the_floor_are_ties() -> None:
    assert gain(0.01, 0.02, lower_is_better=True) == pytest.approx(-100)
    assert gain(0.01, 0.02, lower_is_better=True, floor=1.0) == 0.0
    assert gain(0.01, 500.0, lower_is_better=True, floor=1.0) == pytest.approx(-49900)
    w = Workload({"A": 0.01, "B": 0.03}, noise=0.5)  # both well under the floor
    trial = Trial(w.apply, w.measure, w.restore, floor=1.0)
    pairs, verdict = run_trial(trial, Rule(6, 5, 3.0))
    assert verdict.winner is None and all(p.gain == 0 for p in pairs)


def test_default_wins_follow_the_pairs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tree_copy("h200-vm", tmp_path)
    args = ["trial", str(PROFILES / "shared-host.toml"), "--set", "cpusets.inference.count=4,8"]
    args += ["--pairs", "4", "--window", "0", "--settle", "0", "--root", str(root), "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["rule"]["min_wins"] == 4  # 80 % of 4, up


def test_gain_direction() -> None:
    assert gain(10, 8, lower_is_better=True) == pytest.approx(20)
    assert gain(10, 8, lower_is_better=False) == pytest.approx(-20)
    assert judge([], Rule(1, 1, 0)).winner is None
    assert judge([Pair(0, "A", 1, 1, 0.0)], Rule(1, 1, 0)).winner is None  # a tie wins nothing


VLLM = """# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="a"} 3.0
vllm:time_per_output_token_seconds_sum{model_name="a"} 1.5
vllm:time_per_output_token_seconds_count{model_name="a"} 100.0
vllm:time_per_output_token_seconds_sum{model_name="b"} 0.5
vllm:time_per_output_token_seconds_count{model_name="b"} 50.0
vllm:generation_tokens_total{model_name="a"} 1234.0
garbage line {{{
vllm:generation_tokens_total{model_name="b"} NaN
"""


def test_prometheus_families_are_summed_over_labels() -> None:
    hist = read_family(VLLM, "vllm:time_per_output_token_seconds")
    assert (hist.kind, hist.value, hist.count) == ("histogram", 2.0, 150.0)
    counter = read_family(VLLM, "vllm:generation_tokens")
    assert (counter.kind, counter.value) == ("value", 1234.0)
    with pytest.raises(errors.HostError):
        read_family(VLLM, "vllm:nothing")


@pytest.mark.parametrize("text", ["file:///etc/passwd#x", "http://h/metrics", "http://h#bad name"])
def test_metric_targets_must_be_http_and_a_name(text: str) -> None:
    with pytest.raises(errors.GputunedError):
        parse_target(text)


def two_quick_pairs(root: Path, counts: str) -> int:
    """gputunectl trial on ``root``: shared-host with two [cpusets.inference] counts, two pairs
    of empty windows, JSON out."""
    args = ["trial", str(PROFILES / "shared-host.toml"), "--set"]
    args += [f"cpusets.inference.count={counts}", "--pairs", "2", "--min-wins", "2"]
    return main([*args, "--window", "0", "--settle", "0", "--root", str(root), "--json"])


def test_trial_command_on_a_tree_names_no_winner_and_leaves_the_host_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A tree's schedstat counters stand still: both sides measure the same, so no winner.
    root = tree_copy("h200-vm", tmp_path)
    before = digest(root)
    rc = two_quick_pairs(root, "4,8")
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["verdict"]["winner"] is None
    assert doc["a"] == "cpusets.inference.count=4" and doc["b"] == "cpusets.inference.count=8"
    assert [p["first"] for p in doc["pairs"]] == ["A", "B"]
    assert doc["through"] == "one-shot" and "nothing applied" in doc["host"]
    assert digest(root) == before


def test_trial_command_refuses_one_profile_without_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tree_copy("h200-vm", tmp_path)
    before = digest(root)
    assert main(["trial", str(PROFILES / "shared-host.toml"), "--root", str(root)]) != 0
    assert "trial compares two sides" in capsys.readouterr().err
    assert digest(root) == before


def test_trial_through_the_daemon_ends_on_the_profile_it_had(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With gputuned running, each side is applied over the control socket (here: straight to
    the daemon's request handler), and with no winner the daemon's own profile comes back."""
    from gputuned.daemon.core import Daemon
    from gputuned.service import controlclient
    from gputuned.service.control import PeerCred
    from tests.faults import tree_kernel
    from tests.unit.test_daemon import profile_file

    root = tree_copy("h200-captured", tmp_path)
    d = Daemon(tree_kernel(root), profile_path=profile_file(tmp_path, count=4))
    d.start()
    partition = root / "sys/fs/cgroup/gputuned.inference/cpuset.cpus"
    assert partition.read_text() == "1-4\n"
    sent: list[str] = []

    def request(_kernel: object, msg: dict[str, object]) -> dict[str, object]:
        sent.append(str(msg["cmd"]))
        return d.requests.handle(msg, PeerCred(1, 0, 0))

    monkeypatch.setattr(controlclient, "daemon_running", lambda _kernel: True)
    monkeypatch.setattr(controlclient, "request", request)
    rc = two_quick_pairs(root, "2,6")
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["through"] == "daemon" and doc["verdict"]["winner"] is None
    assert sent == ["apply"] * 5  # A, B, B, A, then the daemon's own profile again
    assert "shared-host applied again" in doc["host"]
    assert partition.read_text() == "1-4\n"
    assert d.profile is not None and d.profile.name == "shared-host"
    d.stop()
