"""Tokens, one at a time: the decoding that the worker (harness/worker.py) and the
server-shaped engine (harness/server.py) do, and the counters they measure themselves by.

On a GPU host a Qwen2-0.5B-shaped transformer built from a config with random weights (no
downloads; without transformers, a hand-written decoder stack of the same widths), decoded
eagerly with ``.item()`` per token; without a GPU, a CPU stand-in (a fixed amount of
pure-Python work per token), and every output says so ("worker": "cpu-standin").
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from typing import Any

#: Host time per token in this process: from the start of the token to the sync (launching the
#: GPU's kernels, the CPU-bound part); the whole token for the CPU stand-in.
HOST_S: list[float] = []
#: Tokens decoded per sequence (after a 32-token prompt) by the GPU worker.
SEQ_TOKENS = 128


def start(
    kind: str, token_ms: float, steps: int | None
) -> tuple[Iterator[float], dict[str, Any], str]:
    """The tokens ``--worker kind`` asks for ("auto": the GPU's, else the CPU stand-in), warmed
    up, and a note on a fallback: two whole sequences on the GPU, so that the allocator has seen
    the largest KV cache before anything is measured (a cudaMalloc mid-window is a 100 ms
    outlier)."""
    note = ""
    tokens: Iterator[float] | None = None
    info: dict[str, Any] = {}
    if kind in ("auto", "gpu"):
        try:
            tokens, info = gpu_tokens()
        except Exception as exc:
            if kind == "gpu":
                raise
            note = f"no GPU worker ({type(exc).__name__}: {exc}); using the CPU stand-in"
    if tokens is None:
        tokens, info = cpu_tokens(token_ms, steps)
    for _ in range(2 * SEQ_TOKENS + 1 if info["worker"] == "gpu" else 100):
        next(tokens)
    gc.collect()
    gc.freeze()  # as servers do after start-up: the model's objects leave the collector's scans
    return tokens, info, note


def cpu_tokens(token_ms: float, steps: int | None = None) -> tuple[Iterator[float], dict[str, Any]]:
    """Pure-Python work per token, sized once at start to about ``token_ms`` on this host
    (``steps``: that size given, as a second worker started under noise must be)."""

    def work(n: int) -> int:
        x = 1
        for _ in range(n):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        return x

    t0 = time.perf_counter()
    work(200_000)
    n = steps or max(1000, int(200_000 * token_ms / 1000 / (time.perf_counter() - t0)))

    def gen() -> Iterator[float]:
        while True:
            t = time.perf_counter()
            work(n)
            took = time.perf_counter() - t
            HOST_S.append(took)
            yield took

    info = {
        "worker": "cpu-standin",
        "desc": f"CPU stand-in, no GPU: {n} pure-Python LCG steps per token "
        f"(~{token_ms:g} ms when quiet)",
        "steps": n,
    }
    return gen(), info


def _gpu_model(torch: Any) -> tuple[Any, str, int]:
    """A Qwen2-0.5B-shaped decoder with random weights, bf16 on the GPU; no downloads."""
    torch.manual_seed(0)
    try:
        from transformers import Qwen2Config, Qwen2ForCausalLM
    except ImportError:
        return _tiny_decoder(torch), "hand-written 24-layer decoder, Qwen2-0.5B widths", 32000
    cfg = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg)
    model = model.to(torch.bfloat16).eval()
    return model, "transformers Qwen2ForCausalLM, Qwen2-0.5B config, random weights", 151936


def _tiny_decoder(torch: Any) -> Any:
    nn = torch.nn

    class Decoder(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(32000, 896)
            layer = nn.TransformerEncoderLayer(896, 14, 4864, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, 24, enable_nested_tensor=False)
            self.head = nn.Linear(896, 32000, bias=False)

        def forward(self, ids: Any) -> Any:
            mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
            return self.head(
                self.blocks(self.emb(ids), mask=mask.to(torch.bfloat16), is_causal=True)
            )

    with torch.device("cuda"):
        return Decoder().to(torch.bfloat16).eval()


def gpu_tokens() -> tuple[Iterator[float], dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    model, desc, vocab = _gpu_model(torch)
    hf = "Qwen2" in desc

    @torch.inference_mode()
    def gen() -> Iterator[float]:
        while True:  # one sequence: a 32-token prompt, then SEQ_TOKENS decoded one by one
            ids = torch.randint(100, vocab - 1, (1, 32), device="cuda")
            if hf:
                out = model(input_ids=ids, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            else:
                ctx, nxt = ids, model(ids)[:, -1:].argmax(-1)
            nxt.item()
            for _ in range(SEQ_TOKENS):
                t = time.perf_counter()
                if hf:
                    out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                    past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                else:
                    ctx = torch.cat([ctx, nxt], 1)[:, -64:]
                    nxt = model(ctx)[:, -1:].argmax(-1)
                HOST_S.append(time.perf_counter() - t)
                nxt.item()  # the host sync a streaming server makes to send each token
                yield time.perf_counter() - t

    params = sum(p.numel() for p in model.parameters())
    return gen(), {
        "worker": "gpu",
        "desc": f"{desc}; bf16, eager decode, .item() per token; {params / 1e6:.0f} M parameters",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }


def counters(pid: int | None = None) -> Any:
    """The threads' scheduler counters of ``pid`` (default: this process)."""
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.sampling import sample_process

    return sample_process(LiveKernel(), os.getpid() if pid is None else pid)


def counter_deltas(a: Any, b: Any) -> dict[str, int]:
    """Run-queue wait and context switches between two samples of a process's threads."""
    before = {t.tid: t for t in a.threads}
    out = {"wait_ns": 0, "run_ns": 0, "invol": 0, "vol": 0}
    for t in b.threads:
        o = before.get(t.tid)
        out["wait_ns"] += (t.wait_ns or 0) - ((o.wait_ns or 0) if o else 0)
        out["run_ns"] += (t.run_ns or 0) - ((o.run_ns or 0) if o else 0)
        out["invol"] += t.involuntary - (o.involuntary if o else 0)
        out["vol"] += t.voluntary - (o.voluntary if o else 0)
    return out
