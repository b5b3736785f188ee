"""``gputunectl trial``: which of two profiles serves better, on the live workload.

A trial alternates A and B in paired windows while the server serves: apply A, let it settle,
measure a window; apply B, settle, measure; that is one pair. Pairs run in ABBA order (A then B,
B then A, A then B, ...), so that a slow drift of the host (a shared machine's clean windows
drifted ±15 % within minutes: docs/dev/benchmarks.md) favours neither side. Each pair gives B's
gain over A in percent (``(A - B) / A`` when lower is better, ``(B - A) / A`` when higher is);
the result compares those gains with a rule declared before the run:

    B wins if it is better in >= min_wins of the pairs and the median gain >= min_gain %;
    A wins on the same terms with the signs turned; otherwise there is no winner.

This module holds the rule, the order, the verdict and the loop; what applies a profile and
what measures a window are given to :func:`run_trial` (gputuned/cli/trial.py: the daemon or a
one-shot apply; run-queue delay, CPU time per unit of work, or a Prometheus metric). The loop
calls ``restore`` when it is interrupted or fails, so Ctrl-C leaves the host as it started.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gputuned import errors


@dataclass(frozen=True)
class Rule:
    """The win rule, declared before the run."""

    pairs: int = 10
    min_wins: int = 8
    min_gain: float = 3.0  # percent

    def __post_init__(self) -> None:
        if self.pairs < 1 or not 1 <= self.min_wins <= self.pairs or self.min_gain < 0:
            raise errors.GputunedError(
                f"win rule: {self.min_wins} of {self.pairs} pairs and a gain of {self.min_gain} "
                "% cannot be met; give 1 <= wins <= pairs and a gain >= 0"
            )

    def __str__(self) -> str:
        return (
            f"a side wins if it is better in >= {self.min_wins} of {self.pairs} pairs and its "
            f"median gain is >= {self.min_gain:g} %"
        )


_RULE_TEXT = re.compile(
    r"\s*(?:[AB]\s+wins\s+if\s+)?(?:it\s+is\s+)?better\s+in\s*(?:>=?\s*)?(\d+)\s+of\s+(\d+)\s+pairs"
    r"(?:\s*,?\s*and\s+(?:the\s+)?median\s+gain\s*(?:>=?\s*)?([0-9.]+)\s*%)?\s*",
    re.IGNORECASE,
)


def parse_rule(text: str) -> Rule:
    """ "B wins if better in >= 8 of 10 pairs and median gain >= 3%" (either side's name; the
    rule is the same for both)."""
    m = _RULE_TEXT.fullmatch(text)
    if m is None:
        raise errors.GputunedError(
            f"win rule {text!r} not understood; write it as 'B wins if better in >= 8 of 10 "
            "pairs and median gain >= 3%', or give --pairs, --min-wins and --min-gain"
        )
    return Rule(int(m[2]), int(m[1]), float(m[3]) if m[3] else 0.0)


def order(pair: int) -> tuple[str, str]:
    """ABBA: pair 0 runs A then B, pair 1 B then A, and so on."""
    return ("A", "B") if pair % 2 == 0 else ("B", "A")


def gain(a: float, b: float, *, lower_is_better: bool, floor: float = 0.0) -> float:
    """B's gain over A in percent (positive: B better). Values under ``floor`` count as the
    floor: two run-queue delays of 0.01 and 0.02 ms/s differ by half, and by nothing that
    matters, so below a floor both are the same."""
    a, b = max(a, floor), max(b, floor)
    if a == 0:
        return 0.0 if b == 0 else (-100.0 if lower_is_better else 100.0)
    return 100.0 * ((a - b) if lower_is_better else (b - a)) / abs(a)


@dataclass
class Pair:
    index: int
    first: str
    a: float
    b: float
    gain: float  # B over A, percent
    gain_a: float | None = None  # A over B, percent (None: -gain)

    def gain_of(self, side: str) -> float:
        if side == "B":
            return self.gain
        return -self.gain if self.gain_a is None else self.gain_a

    def to_json(self) -> dict[str, Any]:
        return {
            "pair": self.index + 1,
            "first": self.first,
            "a": self.a,
            "b": self.b,
            "gain_b_over_a_pct": self.gain,
            "gain_a_over_b_pct": self.gain_of("A"),
        }


@dataclass
class Verdict:
    winner: str | None  # "A", "B" or None
    wins: int  # pairs the winner (or, without one, B) was better in
    median_gain: float  # the winner's median gain in percent (without one: B's over A)
    spread: tuple[float, float]  # min and max of the same per-pair gains
    why: str

    def to_json(self) -> dict[str, Any]:
        return {
            "winner": self.winner,
            "wins": self.wins,
            "median_gain_pct": self.median_gain,
            "gain_min_pct": self.spread[0],
            "gain_max_pct": self.spread[1],
            "why": self.why,
        }


def judge(pairs: list[Pair], rule: Rule) -> Verdict:
    """The verdict of ``rule`` on the pairs measured (fewer than asked: judged on those, and
    the rule's count still applies, so a cut-short trial rarely names a winner)."""
    if not pairs:
        return Verdict(None, 0, 0.0, (0.0, 0.0), "no pair was measured")
    gains = [p.gain for p in pairs]
    med = statistics.median(gains)
    for side in ("B", "A"):
        mine = [p.gain_of(side) for p in pairs]
        wins = sum(1 for g in mine if g > 0)
        m = statistics.median(mine)
        if wins >= rule.min_wins and m >= rule.min_gain and m > 0:
            return Verdict(
                side,
                wins,
                m,
                (min(mine), max(mine)),
                f"{side} better in {wins} of {len(pairs)} pairs, median gain {m:.1f} %",
            )
    b_wins = sum(1 for g in gains if g > 0)
    return Verdict(
        None,
        b_wins,
        med,
        (min(gains), max(gains)),
        f"no winner: B better in {b_wins} and A in {sum(1 for g in gains if g < 0)} of "
        f"{len(pairs)} pairs, median gain of B {med:+.1f} % (the rule needs {rule.min_wins} "
        f"pairs and {rule.min_gain:g} %)",
    )


@dataclass
class Trial:
    """What one run needs: apply a side, measure a window, restore the host's start."""

    apply: Callable[[str], None]  # "A" or "B"
    measure: Callable[[], float]  # settles, then measures one window; the metric's value
    restore: Callable[[], None]  # the host as it started
    lower_is_better: bool = True
    floor: float = 0.0  # values below it are equal (see gain)
    on_pair: Callable[[Pair], None] = field(default=lambda _p: None)


def run_trial(trial: Trial, rule: Rule) -> tuple[list[Pair], Verdict]:
    """``rule.pairs`` pairs in ABBA order, then the verdict. The host ends on the winner, or
    as it started when there is none; on an error or Ctrl-C it is restored, and the error
    raised again."""
    pairs: list[Pair] = []
    try:
        for i in range(rule.pairs):
            got: dict[str, float] = {}
            for side in order(i):
                trial.apply(side)
                got[side] = trial.measure()
            p = Pair(i, order(i)[0], got["A"], got["B"], 0.0)
            p.gain = gain(p.a, p.b, lower_is_better=trial.lower_is_better, floor=trial.floor)
            # A's own gain over B (the same comparison from A's side: relative to B).
            p.gain_a = gain(p.b, p.a, lower_is_better=trial.lower_is_better, floor=trial.floor)
            pairs.append(p)
            trial.on_pair(p)
        verdict = judge(pairs, rule)
        if verdict.winner is None:
            trial.restore()
        else:
            trial.apply(verdict.winner)
    except BaseException:
        trial.restore()
        raise
    return pairs, verdict
