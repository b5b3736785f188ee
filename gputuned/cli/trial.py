"""``gputunectl trial``: compare two profiles, or two values of one key, on the live workload.

    gputunectl trial A.toml B.toml [--pairs 10 --min-wins 8 --min-gain 3]
    gputunectl trial shared-host --set cpusets.inference.count=8,12 --window 30
    gputunectl trial A B --metric 'http://127.0.0.1:8000/metrics#vllm:time_per_output_token_seconds'
    gputunectl trial A B --rule "B wins if better in >= 8 of 10 pairs and median gain >= 3%"

The loop and the verdict are gputuned/trial/windows.py. Here: the two sides, how a side is
applied (through the daemon's control socket when one runs, else a one-shot apply, the same
as ``gputunectl apply``), what a window measures, and the host's start, which the run ends on
when there is no winner, on Ctrl-C and on an error: the profile that was active (applied
again), or nothing (reverted).

Metrics (``--metric``):

- ``runq`` (default): the run-queue delay of the placed processes' threads
  (``/proc/PID/task/TID/schedstat``, second field), in ms per second of the window: the
  delay busy neighbours cause (lower is better). Values under ``--floor`` (1 ms/s by default)
  count as equal: two near-zero delays differ by large ratios and by nothing that matters;
- ``cpu``: their CPU time per unit of work (ms per unit), the work read from ``--work
  URL#counter`` (a counter of the server's, such as ``vllm:generation_tokens``; lower is
  better);
- ``URL#name``: a metric of the server's Prometheus endpoint: a histogram's mean over the
  window (vLLM's ``vllm:time_per_output_token_seconds``; lower is better), or a counter's rate
  per second (higher is better). ``--better`` overrides the direction. The endpoint is read
  within one deadline, without redirects, and on this host only from a socket of a measured
  process's user or root (gputuned/service/httpget.py; docs/trial.md says why).

The placed processes are those the side's `[[process]]` rules place on this host (read after
each apply), or the ``--pid`` given.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from gputuned import errors, root
from gputuned.cli.args import add_json, add_root, print_json
from gputuned.kernel import Kernel

if TYPE_CHECKING:
    from gputuned.profile.model import Profile
    from gputuned.trial.windows import Pair, Rule, Verdict


def _sides(kernel: Kernel, args: argparse.Namespace) -> dict[str, tuple[Profile, str]]:
    """{"A": (profile, label), "B": ...} from two profiles, or one and ``--set KEY=V1,V2``."""
    from gputuned.cli.tuning import _profile_path
    from gputuned.profile.load import load_profile, parse_profile

    loaded = []
    for arg in args.profiles:
        path, dirs = _profile_path(kernel, arg)
        loaded.append((load_profile(path, names=dirs), str(arg)))
    if args.set is None:
        if len(loaded) != 2:
            raise errors.GputunedError(
                "trial compares two sides: give two profiles, or one and --set KEY=V1,V2"
            )
        return {"A": loaded[0], "B": loaded[1]}
    if len(loaded) != 1:
        raise errors.GputunedError("with --set, give one profile: its key takes both values")
    key, sep, values = args.set.partition("=")
    parts = _values(values)
    if not sep or not key or len(parts) != 2:
        raise errors.GputunedError(
            f"--set {args.set!r}: write KEY=V1,V2, such as cpusets.inference.count=8,12"
        )
    base, name = loaded[0]
    if isinstance(_get_key(base.model_dump(mode="json", by_alias=True), key), str):
        parts = [str(v) for v in parts]  # cpus=0,1: CPU lists are strings in a profile
    out = {}
    for side, value in zip("AB", parts, strict=True):
        data = base.model_dump(mode="json", by_alias=True, exclude_none=True)
        _set_key(data, key, value)
        data["name"] = f"{base.name} [{key}={value}]"
        out[side] = (parse_profile(data, f"{name} with {key}={value}"), f"{key}={value}")
    return out


def _values(text: str) -> list[Any]:
    """Two TOML values, comma-separated ("8,12", "'root','isolated'", "true,false")."""
    import tomllib

    try:
        return list(tomllib.loads(f"v = [{text}]")["v"])
    except tomllib.TOMLDecodeError:
        return [v.strip() for v in text.split(",")]  # bare words: strings


def _get_key(data: Any, key: str) -> Any:
    for part in key.split("."):
        if isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        elif isinstance(data, dict):
            data = data.get(part)
        else:
            return None
    return data


def _set_key(data: dict[str, Any], key: str, value: Any) -> None:
    node: Any = data
    parts = key.split(".")
    for part in parts[:-1]:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise errors.GputunedError(f"--set: {key!r} does not name a key of the profile")
    if not isinstance(node, dict):
        raise errors.GputunedError(f"--set: {key!r} does not name a key of the profile")
    node[parts[-1]] = value


class Host:
    """Applies a side through the daemon or one-shot, and puts the start back."""

    def __init__(self, kernel: Kernel) -> None:
        from gputuned.engine.apply import read_active
        from gputuned.service.controlclient import daemon_running
        from gputuned.store.state import check_state_files

        self.kernel = kernel
        self.daemon = daemon_running(kernel)
        if not self.daemon:
            check_state_files(kernel)
        self.start = read_active(kernel)

    def apply(self, profile: Profile, source: str) -> None:
        if self.daemon:
            from gputuned.service.controlclient import request

            data = profile.model_dump(mode="json", by_alias=True, exclude_none=True)
            resp = request(self.kernel, {"cmd": "apply", "profile": data, "source": source})
            failed = resp.get("failed") or []
        else:
            from gputuned.engine.apply import apply_profile

            _plan, report = apply_profile(self.kernel, profile, source=source)
            failed = report.failed
        if failed:
            raise errors.GputunedError(f"applying {source} failed: {failed[0]}")

    def restore(self) -> str:
        """The host as it started: the profile active then, or nothing applied."""
        from gputuned.profile.load import parse_profile

        if self.start is not None:
            prof = parse_profile(self.start["profile"], "the profile active when trial started")
            self.apply(prof, str(self.start.get("source", "")))
            return f"as it started: {prof.name} applied again"
        if self.daemon:
            from gputuned.service.controlclient import request

            request(self.kernel, {"cmd": "revert"})
        else:
            from gputuned.engine.apply import revert_all

            revert_all(self.kernel)
        return "as it started: nothing applied (reverted)"


def placed_pids(kernel: Kernel, profile: Profile) -> list[int]:
    """The processes ``profile``'s rules place on this host now."""
    from gputuned.engine.plan import plan_profile
    from gputuned.settings.registry import of_change

    plan = plan_profile(kernel, profile, allow_blocked=True)
    pids = {
        int(c.data["pid"])
        for c in plan.settings
        if c.tuner == "process" and of_change(c).placement and isinstance(c.data.get("pid"), int)
    }
    return sorted(pids)


def _first_pids(
    kernel: Kernel, args: argparse.Namespace, sides: dict[str, tuple[Profile, str]]
) -> list[int]:
    """The server's processes before the first apply: the ``--pid`` given, or those either
    side would place (whose users' sockets a local endpoint is read from: trialmeter)."""
    if args.pid:
        return list(args.pid)
    return sorted({p for side in ("A", "B") for p in placed_pids(kernel, sides[side][0])})


def cmd_trial(args: argparse.Namespace) -> int:
    # Here, not at the top: every other command builds this command's parser (issue 31).
    from gputuned.cli.render import console, shown
    from gputuned.trial.meter import meter
    from gputuned.trial.windows import Rule, Trial, parse_rule, run_trial

    kernel = root.open_kernel(args.root)
    if args.rule:
        rule = parse_rule(args.rule)
    else:
        wins = args.min_wins if args.min_wins is not None else math.ceil(0.8 * args.pairs)
        rule = Rule(args.pairs, wins, args.min_gain)
    sides = _sides(kernel, args)
    measure_window, unit, lower = meter(kernel, args, lambda: _first_pids(kernel, args, sides))
    host = Host(kernel)
    out = console()

    def say(text: str) -> None:
        if not args.json:
            out.print(text)

    say(
        f"trial: A = {shown(sides['A'][1])}, B = {shown(sides['B'][1])}; {unit}, "
        f"{'lower' if lower else 'higher'} is better; {rule}; {args.window:g} s windows after "
        f"{args.settle:g} s to settle, through {'the daemon' if host.daemon else 'one-shot apply'}"
    )
    current: dict[str, list[int]] = {}

    def apply(side: str) -> None:
        prof, label = sides[side]
        host.apply(prof, f"trial {side}: {label}")
        current["pids"] = args.pid or placed_pids(kernel, prof)

    def measure() -> float:
        time.sleep(args.settle)
        return measure_window(current.get("pids", []), args.window)

    def on_pair(p: Pair) -> None:
        better = "B" if p.gain > 0 else "A" if p.gain < 0 else "neither"
        say(
            f"pair {p.index + 1}/{rule.pairs} ({p.first} first): A {p.a:.4g}, B {p.b:.4g} "
            f"{unit}: {better} better ({p.gain:+.1f} % for B)"
        )

    ended = "as it started"

    def restore() -> None:
        nonlocal ended
        ended = host.restore()

    floor = args.floor if args.floor is not None else (1.0 if args.metric == "runq" else 0.0)
    trial = Trial(apply, measure, restore, lower_is_better=lower, floor=floor, on_pair=on_pair)
    # SIGTERM as Ctrl-C: the host goes back to its start either way.
    old = signal.signal(signal.SIGTERM, _interrupt)
    try:
        pairs, verdict = run_trial(trial, rule)
    except KeyboardInterrupt:
        print(f"trial interrupted; host left {ended}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    if verdict.winner is not None:
        ended = f"on the winner, {verdict.winner}: {sides[verdict.winner][1]}"
    _report(args, sides, rule, unit, lower, pairs, verdict, ended, host.daemon)
    return 0


def _interrupt(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _report(
    args: argparse.Namespace,
    sides: dict[str, tuple[Profile, str]],
    rule: Rule,
    unit: str,
    lower: bool,
    pairs: list[Pair],
    verdict: Verdict,
    ended: str,
    daemon: bool,
) -> None:
    if args.json:
        print_json(
            {
                "a": sides["A"][1],
                "b": sides["B"][1],
                "metric": unit,
                "lower_is_better": lower,
                "rule": {
                    "pairs": rule.pairs,
                    "min_wins": rule.min_wins,
                    "min_gain_pct": rule.min_gain,
                },
                "through": "daemon" if daemon else "one-shot",
                "pairs": [p.to_json() for p in pairs],
                "verdict": verdict.to_json(),
                "host": ended,
            }
        )
        return
    from gputuned.cli.render import console, shown

    out = console()
    if verdict.winner is None:
        out.print(shown(verdict.why))
    else:
        w = verdict.winner
        out.print(
            f"{w} ({shown(sides[w][1])}) wins: better in {verdict.wins} of {len(pairs)} pairs, "
            f"median gain {verdict.median_gain:.1f} % [{verdict.spread[0]:+.1f} to "
            f"{verdict.spread[1]:+.1f} % over the pairs]"
        )
    out.print(f"host left {shown(ended)}")


def add_trial_command(sub: Any) -> None:
    s = sub.add_parser(
        "trial", help="compare two profiles (or two values of a key) on the live workload"
    )
    s.add_argument(
        "profiles",
        nargs="+",
        metavar="PROFILE",
        help="two profiles (A, B), or one with --set",
    )
    s.add_argument(
        "--set",
        metavar="KEY=V1,V2",
        help="one profile, two values of one key: cpusets.inference.count=8,12",
    )
    s.add_argument("--pairs", type=int, default=10, help="paired windows (default 10)")
    s.add_argument(
        "--min-wins",
        type=int,
        help="pairs a side must be better in to win (default: 80 %% of --pairs, rounded up)",
    )
    s.add_argument(
        "--min-gain",
        type=float,
        default=3.0,
        help="median gain in percent a side needs to win (default 3)",
    )
    s.add_argument(
        "--rule",
        help="the rule as text: 'B wins if better in >= 8 of 10 pairs and "
        "median gain >= 3%%' (instead of the three options above)",
    )
    s.add_argument("--window", type=float, default=30.0, help="seconds measured (default 30)")
    s.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="seconds after each apply before a window (default 5)",
    )
    s.add_argument(
        "--metric",
        default="runq",
        help="runq (default), cpu (with --work), or URL#name of a Prometheus metric",
    )
    s.add_argument("--work", metavar="URL#COUNTER", help="the server's counter of work done")
    s.add_argument(
        "--better", choices=("lower", "higher"), help="which way is better (default: by the metric)"
    )
    s.add_argument(
        "--floor",
        type=float,
        help="values below it count as equal, in the metric's unit (default: 1 ms/s for runq, "
        "0 otherwise): near-zero delays differ by large ratios and nothing that matters",
    )
    s.add_argument(
        "--pid",
        type=int,
        action="append",
        help="measure these processes (default: those the side places); a metrics endpoint of "
        "this host is read only from a socket of their users or root",
    )
    add_root(s)
    add_json(s)
    s.set_defaults(func=cmd_trial)
