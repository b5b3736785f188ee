"""noisy_neighbor.py's options: its own command line, the one matrix.py passes the rest of its
own to, and the Namespace a worker is started from (placement_variants.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.noise import Noise, add_noise_args
from harness.repo import REPO


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, help="directory for noisy_neighbor.json and .png")
    ap.add_argument(
        "--noise",
        default="heavy,cpu",
        help="noise kinds, comma-separated: heavy, cpu, net, disk (default heavy,cpu)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=8.0, help="seconds measured per condition")
    ap.add_argument("--warmup", type=float, default=0.5, help="decoded, not measured, first")
    ap.add_argument("--settle", type=float, default=1.0, help="pause after each change")
    ap.add_argument(
        "--profile",
        type=Path,
        action="append",
        default=[],
        help="profile for a noisy + gputuned condition (repeatable; default "
        "profiles/shared-host.toml)",
    )
    ap.add_argument("--rule", help="[[process]] rule to register the worker by (default: first)")
    ap.add_argument(
        "--register-only",
        action="store_true",
        help="run each profile with its first rule matching nothing, so that only the registered "
        "worker is placed (on a machine shared with other people's processes)",
    )
    ap.add_argument("--no-gputuned", action="store_true", help="no gputuned conditions (no root)")
    ap.add_argument("--worker", choices=("auto", "gpu", "cpu"), default="auto")
    ap.add_argument(
        "--shape",
        choices=("single", "server"),
        default="single",
        help="single: one process decodes (registered with the daemon); server: an API process "
        "that tokenises and spawns the decoding engine, placed by the profile's rule "
        "(benchmarks/harness/server.py)",
    )
    ap.add_argument(
        "--order",
        choices=("server-first", "daemon-first", "both"),
        default="both",
        help="--shape server: the server runs before the daemon starts (placed by the daemon's "
        "start), or starts after it (placed as it spawns), or each in turn (default)",
    )
    ap.add_argument("--token-ms", type=float, default=2.0, help="CPU stand-in work per token")
    ap.add_argument(
        "--api-ms", type=float, default=1.0, help="--shape server: tokenising per request (ms)"
    )
    ap.add_argument(
        "--request-tokens", type=int, default=64, help="--shape server: tokens per request"
    )
    # Sizes measured by the first worker, given to a server started later (daemon first), which
    # would otherwise size its work under noise.
    ap.add_argument("--cpu-steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--api-chars", type=int, help=argparse.SUPPRESS)
    add_noise_args(ap)
    ap.add_argument("--keep-latencies", action="store_true", help="every token's latency in JSON")
    ap.add_argument(
        "--noise-cgroup",
        metavar="NAME",
        help="run the noise in the top-level cgroup v2 NAME (made, then removed): the "
        "neighbours as [neighbours] sees them on a real host",
    )
    # Internal: the processes this benchmark starts run noisy_neighbor.py again in a role.
    ap.add_argument(
        "--role", choices=("worker", "api", "cpu", "net", "disk"), help=argparse.SUPPRESS
    )
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--counter", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    Noise.cgroup = args.noise_cgroup
    if args.role is None and args.out is None:
        ap.error("--out DIR is required")
    if args.no_gputuned:
        args.profile = []
    elif not args.profile:
        args.profile = [REPO / "profiles" / "shared-host.toml"]
    return args
