"""What a window of ``gputunectl trial`` measures (gputuned/cli/trial.py says which to choose):
the run-queue delay of the placed processes, their CPU time per unit of the server's work, or
one metric of the server's Prometheus endpoint (gputuned/service/promscrape.py)."""

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


def meter(kernel: Kernel, args: argparse.Namespace) -> tuple[Meter, str, bool]:
    """(measure one window of ``seconds`` for ``pids``, the unit, lower is better)."""
    from gputuned.service.promscrape import Reading, parse_target, scrape

    def threads(pids: list[int], seconds: float) -> tuple[int, int, float, Reading | None, Any]:
        work = parse_target(args.work) if args.work else None
        w0 = scrape(work) if work else None
        s0, t0 = _schedstat(kernel, pids), time.monotonic()
        time.sleep(seconds)
        s1, elapsed = _schedstat(kernel, pids), time.monotonic() - t0
        both = s0.keys() & s1.keys()
        run = sum(s1[k][0] - s0[k][0] for k in both)
        wait = sum(s1[k][1] - s0[k][1] for k in both)
        return run, wait, elapsed, w0, (scrape(work) if work else None)

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
    first = scrape(target)

    def prom(_pids: list[int], seconds: float) -> float:
        r0, t0 = scrape(target), time.monotonic()
        time.sleep(seconds)
        r1, elapsed = scrape(target), time.monotonic() - t0
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
