"""The server-shaped worker (noisy_neighbor.py ``--shape server``): two processes, as vLLM.

vLLM V1's API server does the CPU work of each request (tokenising the prompt, detokenising
each token it streams back) and starts EngineCore, the process that drives the GPU, with
multiprocessing's *spawn* context (vllm/v1/engine/core_client.py); EngineCore renames itself
with setproctitle. Here:

- the *API process* (``noisy_neighbor.py --role api``, what a [[process]] rule matches) builds a
  vocabulary, sizes its per-request tokenising to about ``--api-ms`` when quiet, and starts
- the *engine* with ``multiprocessing.get_context("spawn")``: its command line is spawn's own
  (``python3 -c from multiprocessing.spawn import spawn_main; ...``); it renames itself
  ``NN::EngineCore`` (/proc/self/comm, as setproctitle does) and decodes token by token with
  one host sync per token (the GPU model of harness/tokens.py, or its CPU stand-in), sending
  each token to the API as it is made. It starts no process of its own. The first spawn also
  starts Python's resource tracker: one more child of the API process.

A request: tokenise a prompt (API), decode ``tokens`` tokens (engine), detokenise each as it
arrives (API). The API measures what a client would: the gap between consecutive tokens of a
request (``lat_ms``; the first token's wait, tokenising and prefill, is ``ttft_ms``), and the
run-queue delay and context switches of both processes' threads.

The API speaks the worker protocol of harness/worker.py on stdin/stdout (one JSON line per
request), so the rest of the benchmark measures it as it measures the single-process worker.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import struct
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from harness import tokens as tok

#: One token from the engine: request number, token number, host time of the step (ns).
_TOKEN = struct.Struct("=IIQ")
_WORDS = ("serve", "model", "token", "batch", "cache", "layer", "prompt", "stream", "kernel")


def _vocab() -> dict[str, int]:
    """A BPE-like vocabulary: every prefix of some words, longest first when matching."""
    out: dict[str, int] = {}
    for w in _WORDS:
        for i in range(1, len(w) + 1):
            out.setdefault(w[:i], len(out))
    for c in "abcdefghijklmnopqrstuvwxyz .,":
        out.setdefault(c, len(out))
    return out


def tokenise(text: str, vocab: dict[str, int], longest: int = 6) -> list[int]:
    """Greedy longest-match tokenising in pure Python: CPU work shaped like a tokenizer's."""
    out, i = [], 0
    while i < len(text):
        for n in range(min(longest, len(text) - i), 0, -1):
            tid = vocab.get(text[i : i + n])
            if tid is not None:
                out.append(tid)
                i += n
                break
        else:
            i += 1
    return out


def _prompt(chars: int) -> str:
    words = [_WORDS[(i * 7) % len(_WORDS)] for i in range(chars // 6 + 1)]
    return " ".join(words)[:chars]


def size_prompt(vocab: dict[str, int], api_ms: float, chars: int | None = None) -> str:
    """A prompt whose tokenising takes about ``api_ms`` on this host, now (``chars``: its
    length given)."""
    if chars:
        return _prompt(chars)
    probe = _prompt(4000)
    t0 = time.perf_counter()
    for _ in range(5):
        tokenise(probe, vocab)
    per_char = (time.perf_counter() - t0) / 5 / len(probe)
    return _prompt(max(200, int(api_ms / 1000 / per_char)))


# ---- the engine (a spawned child) ----------------------------------------------------------


def engine_main(conn: Connection, kind: str, token_ms: float, steps: int | None) -> None:
    """Decode on request; stream one message per token. Runs in the spawned child."""
    Path("/proc/self/comm").write_text("NN::EngineCore")  # what setproctitle does to comm
    tokens, info, note = tok.start(kind, token_ms, steps)
    conn.send({**info, "note": note, "pid": os.getpid()})
    while True:
        req = conn.recv()
        if req is None:
            return
        rid, n = req
        for i in range(n):
            took = next(tokens)
            conn.send_bytes(_TOKEN.pack(rid, i, int(took * 1e9)))


# ---- the API process -----------------------------------------------------------------------


class Api:
    def __init__(
        self,
        kind: str,
        token_ms: float,
        api_ms: float,
        tokens: int,
        steps: int | None = None,
        chars: int | None = None,
    ) -> None:
        self.vocab = _vocab()
        self.prompt = size_prompt(self.vocab, api_ms, chars)
        self.n = tokens
        self.rid = 0
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.engine = ctx.Process(target=engine_main, args=(child, kind, token_ms, steps))
        self.engine.start()
        child.close()
        self.info: dict[str, Any] = self.conn.recv()
        from multiprocessing import resource_tracker

        tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
        self.pids = {"api": os.getpid(), "engine": self.engine.pid, "tracker": tracker}

    def request(self, lat: list[float], ttft: list[float], host: list[float]) -> None:
        t0 = time.perf_counter()
        ids = tokenise(self.prompt, self.vocab)
        self.rid += 1
        self.conn.send((self.rid, self.n))
        last = t0
        text: list[str] = []
        inverse = self._inverse()
        for i in range(self.n):
            rid, k, took_ns = _TOKEN.unpack(self.conn.recv_bytes())
            now = time.perf_counter()
            text.append(inverse[(k + len(ids)) % len(inverse)])  # detokenise
            (ttft if i == 0 else lat).append(now - last)
            host.append(took_ns / 1e9)
            last = now
            assert rid == self.rid and k == i

    def _inverse(self) -> list[str]:
        inv = getattr(self, "_inv", None)
        if inv is None:
            inv = self._inv = [w for w, _ in sorted(self.vocab.items(), key=lambda kv: kv[1])]
        return inv

    def window(self, seconds: float, warmup: float) -> dict[str, Any]:
        scratch: list[float] = []
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            self.request(scratch, scratch, scratch)
        lat: list[float] = []
        ttft: list[float] = []
        host: list[float] = []
        pids = [p for p in (self.pids["api"], self.pids["engine"]) if p]
        s0, t0 = _counters(pids), time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            self.request(lat, ttft, host)
        elapsed = time.perf_counter() - t0
        d = _deltas(s0, _counters(pids))
        return {
            "lat_ms": [round(x * 1e3, 4) for x in lat],
            "ttft_ms": [round(x * 1e3, 4) for x in ttft],
            "elapsed_s": elapsed,
            "host_ms": statistics.fmean(host) * 1e3 if host else float("nan"),
            **d,
        }

    def close(self) -> None:
        self.conn.send(None)
        self.engine.join(10)
        if self.engine.is_alive():
            self.engine.kill()


def _counters(pids: list[int]) -> dict[int, Any]:
    return {pid: tok.counters(pid) for pid in pids}


def _deltas(a: dict[int, Any], b: dict[int, Any]) -> dict[str, int]:
    out = {"wait_ns": 0, "run_ns": 0, "invol": 0, "vol": 0}
    for pid, after in b.items():
        for k, v in tok.counter_deltas(a[pid], after).items():
            out[k] += v
    return out


def role_api(args: Any) -> None:
    """The worker protocol: a ready line, then one answer per window request.
    ``args``: noisy_neighbor.py's options (--worker, --token-ms, --api-ms, --request-tokens)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    api_ms, tokens = args.api_ms, args.request_tokens
    api = Api(args.worker, args.token_ms, api_ms, tokens, args.cpu_steps, args.api_chars)
    info = {k: v for k, v in api.info.items() if k != "pid"}
    info["prompt_chars"] = len(api.prompt)
    info["desc"] = (
        f"server-shaped: API process (tokenising ~{api_ms:g} ms per request, detokenising each "
        f"token) + spawned engine ({info['desc']}), {tokens} tokens per request"
    )
    proto.write(json.dumps({"ready": True, **info, "pids": api.pids}) + "\n")
    try:
        for line in sys.stdin:
            req = json.loads(line)
            if req["cmd"] == "quit":
                return
            proto.write(json.dumps(api.window(float(req["seconds"]), float(req["warmup"]))) + "\n")
    finally:
        api.close()
