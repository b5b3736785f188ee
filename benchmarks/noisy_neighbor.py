"""Noisy-neighbour benchmark: what CPU, network and disk neighbours cost a decoding server,
and what gputuned gets back.

    python3 benchmarks/noisy_neighbor.py --out DIR [--noise heavy,cpu] [--rounds 3]
        [--window 8] [--profile profiles/shared-host.toml ...] [--no-gputuned]
        [--worker auto|gpu|cpu]

A worker decodes token by token with one host sync per token, as a streaming server does. On a
GPU host it is a Qwen2-0.5B-shaped transformer built from a config with random weights (no
downloads; without transformers, a hand-written decoder stack of the same widths), decoded
eagerly with `.item()` per token. On a host without a GPU it is a CPU stand-in (a fixed amount of pure-Python work per
token) and every output says so ("worker": "cpu-standin").

Per noise kind (cpu: a busy process per CPU; net: loopback TCP streams; disk: fsync'd writes;
heavy: all three) and round, five windows in a row: clean, noisy, noisy + gputuned (the daemon
started with --profile, the worker registered with it), noisy after the daemon stopped and
reverted, and clean again. Rounds alternate the order of the noise kinds, and every ratio is
taken against the clean windows of its own block, so drift of a shared machine cancels.

For each condition: tokens/s, p50 and p99 per-token latency as ratios to clean (median and
range over rounds), run-queue delay per token (/proc/PID/task/*/schedstat, second field) and
context switches per 1,000 tokens. Writes DIR/noisy_neighbor.json and DIR/noisy_neighbor.png
and prints a summary table. Every process it starts (worker, noise, daemon) is stopped by PID
at the end, also on Ctrl-C; they die with it if it is killed (PR_SET_PDEATHSIG), the daemon
by SIGTERM so that it reverts. The gputuned conditions need root and a host where no profile
is applied and no daemon runs; afterwards the host is checked against what it was before
(journal empty, IRQ affinities, the worker's threads) and /etc/gputuned/active.json put back.

The machinery is benchmarks/harness/ (worker, noise, daemon handling, host checks, figures,
blocks), shared with matrix.py and the other benchmarks; this script runs the rounds, and the
processes it starts run it again, each in a role (``--role worker|api|cpu|net|disk``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from harness import daemon, figures
from harness.block import rounds
from harness.figures import table
from harness.noise import NOISE_PARTS, WorkCounter, role_cpu, role_disk, role_net
from harness.options import parse_args
from harness.plot import plain_png, plot
from harness.run import run
from harness.worker import role_worker

# tests/unit/test_benchmarks_smoke.py reaches these through this script, as when it held them.
add_ratios, percentile, spread = figures.add_ratios, figures.percentile, figures.spread
summarize, isolated_profile, _plain_png = figures.summarize, daemon.isolated_profile, plain_png


def run_role(args: argparse.Namespace) -> None:
    if args.role == "worker":
        role_worker(args.worker, args.token_ms, args.cpu_steps)
    elif args.role == "api":
        from harness.server import role_api

        role_api(args)
    elif args.role == "cpu":
        role_cpu(args.deadline, WorkCounter(args.counter))
    elif args.role == "net":
        role_net(args.deadline, WorkCounter(args.counter))
    else:
        role_disk(args.deadline, args.disk_dir, WorkCounter(args.counter))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, description=__doc__.split("\n\n")[0])
    if args.role:
        run_role(args)
        return 0
    kinds = [k.strip() for k in args.noise.split(",") if k.strip()]
    bad = [k for k in kinds if k not in NOISE_PARTS]
    if bad:
        sys.exit(f"unknown noise kind(s) {bad}; use {', '.join(NOISE_PARTS)}")
    result = run(args, kinds, rounds(args, kinds))
    finish(args, result)
    return 0 if not result["leftover_pids"] else 1


def finish(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if not result.get("ok"):
        return
    label = "CPU STAND-IN (no GPU)" if result["worker"] == "cpu-standin" else "GPU worker"
    cfg = result["config"]
    header = (
        f"noisy neighbour, {label}: {result['worker_info']['desc']}\n"
        f"{cfg['rounds']} round(s) x {cfg['window_s']:g} s windows; ratios to the clean windows "
        "of the same block: median [min-max] over rounds"
    )
    title = f"noisy neighbour - {label} - {cfg['rounds']} rounds x {cfg['window_s']:g} s windows"
    how = plot(result["summary"], args.out / "noisy_neighbor.png", title)
    print()
    print(table(result["summary"], header))
    back = [g["host_back"] for g in result["gputuned"]]
    if back:
        print(f"host back after each daemon stop: {sum(back)}/{len(back)}")
    print(
        f"wrote {args.out / 'noisy_neighbor.json'} and noisy_neighbor.png ({how}); "
        f"{len(result['started_pids'])} processes started, {len(result['leftover_pids'])} left; "
        f"{result['elapsed_s']} s"
    )


if __name__ == "__main__":
    sys.exit(main())
