"""What a window of ``gputunectl trial`` measures (gputuned/cli/trial.py says which to choose):
the run-queue delay of the placed processes, their CPU time per unit of the server's work, or
one metric of the server's Prometheus endpoint (gputuned/trial/scrape.py)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from gputuned import errors
from gputuned.kernel import Kernel


def _schedstat(kernel: Kernel, pids: list[int]) -> dict[tuple[int, int], tuple[int, int]]:
    """(pid, tid) -> (ns on CPU, ns waiting) for every thread of ``pids`` that has it."""
    from gputuned.kernel.sampling import sample_process

    out = {}
    for pid in pids:
        try:
            sample = sample_process(kernel, pid)
        except errors.HostError:
            continue  # gone: its threads are left out of this window
        for t in sample.threads:
            if t.run_ns is not None and t.wait_ns is not None:
                out[(pid, t.tid)] = (t.run_ns, t.wait_ns)
    return out


Meter = Callable[[list[int], float], float]


def server_uids(kernel: Kernel, pids: list[int]) -> frozenset[int]:
    """The real and effective user IDs of the processes ``pids`` that still run: the users
    whose socket trial reads a metrics endpoint of this host from (promscrape.scrape)."""
    from gputuned.kernel.proc import read_uids

    out: set[int] = set()
    for pid in pids:
        try:
            out.update(u for u in read_uids(kernel, pid) if u is not None)
        except errors.HostError:
            continue  # gone: vouches for nothing
    return frozenset(out)


def meter(
    kernel: Kernel, args: argparse.Namespace, first_pids: Callable[[], list[int]]
) -> tuple[Meter, str, bool]:
    """(measure one window of ``seconds`` for ``pids``, the unit, lower is better).

    A metric of the server's endpoint is read only from a socket of the measured processes'
    users or root; before the first apply (the reading that tells a histogram from a counter),
    the measured processes are ``first_pids()``."""
    from gputuned.trial.scrape import Reading, Target, parse_target, scrape

    def read(target: Target, pids: list[int]) -> Reading:
        try:
            return scrape(target, owners=server_uids(kernel, pids))
        except errors.HostError as exc:
            raise errors.HostError(
                f"{exc}; trial stops, and the host goes back as it started",
                path=exc.path,
            ) from exc

    def threads(pids: list[int], seconds: float) -> tuple[int, int, float, Reading | None, Any]:
        work = parse_target(args.work) if args.work else None
        w0 = read(work, pids) if work else None
        s0, t0 = _schedstat(kernel, pids), time.monotonic()
        time.sleep(seconds)
        s1, elapsed = _schedstat(kernel, pids), time.monotonic() - t0
        both = s0.keys() & s1.keys()
        run = sum(s1[k][0] - s0[k][0] for k in both)
        wait = sum(s1[k][1] - s0[k][1] for k in both)
        return run, wait, elapsed, w0, (read(work, pids) if work else None)

    if args.metric == "runq":

        def runq(pids: list[int], seconds: float) -> float:
            _run, wait, elapsed, _w0, _w1 = threads(pids, seconds)
            return wait / 1e6 / max(elapsed, 1e-9)

        return runq, "ms run-queue delay per s", _lower(args, True)
    if args.metric == "cpu":
        if not args.work:
            raise errors.GputunedError(
                "--metric cpu needs --work URL#counter: the server's count of work done "
                "(such as http://127.0.0.1:8000/metrics#vllm:generation_tokens)"
            )

        def cpu(pids: list[int], seconds: float) -> float:
            run, _wait, _elapsed, w0, w1 = threads(pids, seconds)
            done = (w1.value - w0.value) if w0 and w1 else 0.0
            if done <= 0:
                raise errors.GputunedError(
                    f"no work counted in a {seconds:g} s window ({args.work}); lengthen --window"
                )
            return run / 1e6 / done

        return cpu, "CPU ms per unit of work", _lower(args, True)
    target = parse_target(args.metric)
    first = read(target, first_pids())

    def prom(pids: list[int], seconds: float) -> float:
        r0, t0 = read(target, pids), time.monotonic()
        time.sleep(seconds)
        r1, elapsed = read(target, pids), time.monotonic() - t0
        if r1.kind == "histogram":
            n = r1.count - r0.count
            if n <= 0:
                raise errors.GputunedError(
                    f"{target.name}: no observation in a {seconds:g} s window; is the server "
                    "serving? lengthen --window"
                )
            return (r1.value - r0.value) / n
        return (r1.value - r0.value) / max(elapsed, 1e-9)

    hist = first.kind == "histogram"
    unit = f"{target.name} (mean)" if hist else f"{target.name} per s"
    return prom, unit, _lower(args, hist)


def _lower(args: argparse.Namespace, default: bool) -> bool:
    return default if args.better is None else args.better == "lower"
