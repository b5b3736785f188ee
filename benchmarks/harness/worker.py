"""The worker: a process that decodes on request and measures itself (``noisy_neighbor.py
--role worker``, or ``--role api`` for the server-shaped one, harness/server.py), and the
benchmark's handle on it. One JSON line per request each way on its stdin and stdout."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from harness import tokens as tok
from harness.children import Children, running
from harness.repo import ROLE_SCRIPT

#: The server-shaped worker's API process, as a profile copy's rule matches it (--shape server).
API_MATCH = r"/noisy_neighbor\.py --role api\b"


def role_worker(kind: str, token_ms: float, steps: int | None = None) -> None:
    """Answer one JSON line per request on the original stdout; anything printed goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    tokens, info, note = tok.start(kind, token_ms, steps)
    proto.write(json.dumps({"ready": True, **info, "note": note}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            return
        _run_for(tokens, float(req["warmup"]))
        tok.HOST_S.clear()
        s0, t0 = tok.counters(), time.perf_counter()
        lat = _run_for(tokens, float(req["seconds"]))
        elapsed = time.perf_counter() - t0
        d = tok.counter_deltas(s0, tok.counters())
        host_ms = statistics.fmean(tok.HOST_S) * 1e3 if tok.HOST_S else float("nan")
        out = {"lat_ms": [round(x * 1e3, 4) for x in lat], "elapsed_s": elapsed, **d}
        proto.write(json.dumps({**out, "host_ms": host_ms}) + "\n")


def _run_for(tokens: Iterator[float], seconds: float) -> list[float]:
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        out.append(next(tokens))
    return out


class Worker:
    """The parent's handle on the worker process (``shape`` "server": the API process of
    harness/server.py, which spawns the engine)."""

    def __init__(self, children: Children, args: argparse.Namespace) -> None:
        role = "api" if args.shape == "server" else "worker"
        argv = [sys.executable, str(ROLE_SCRIPT), "--role", role, "--worker", args.worker]
        argv += ["--token-ms", str(args.token_ms), "--api-ms", str(args.api_ms)]
        argv += ["--request-tokens", str(args.request_tokens)]
        for opt, value in (("--cpu-steps", args.cpu_steps), ("--api-chars", args.api_chars)):
            if value:
                argv += [opt, str(value)]
        self.proc = children.start(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.children = children
        self.info = self._read()
        if not self.info.get("ready"):
            raise RuntimeError(f"worker did not start: {self.info}")
        #: Every process of the worker (the API process, its engine and resource tracker).
        self.pids = [p for p in dict(self.info.pop("pids", {})).values() if p] or [self.pid]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker exited (status {self.proc.wait()}); see its stderr above")
        return dict(json.loads(line))

    def window(self, seconds: float, warmup: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        req = {"cmd": "window", "seconds": seconds, "warmup": warmup}
        self.proc.stdin.write(json.dumps(req).encode() + b"\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(b'{"cmd": "quit"}\n')
                self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10.0)  # the API process ends its engine first
        self.children.stop(self.proc, wait=10.0)
        for pid in self.pids:  # the engine and the tracker, should the API not have ended them
            if pid != self.pid and running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while any(running(p) for p in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)
