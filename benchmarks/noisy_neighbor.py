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
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
# Measure the gputuned beside this script, not whichever one is installed (its children get the
# same through PYTHONPATH); reaction.py imports this module first for the same reason.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# Host time per token in the worker: from the start of the token to the sync (launching the
# GPU's kernels, the CPU-bound part); the whole token for the CPU stand-in.
_HOST_S: list[float] = []
#: "none": the noisy windows run on a quiet host (the matrix's baseline, benchmarks/matrix.py).
NOISE_PARTS: dict[str, tuple[str, ...]] = {
    "none": (),
    "cpu": ("cpu",),
    "net": ("net",),
    "disk": ("disk",),
    "heavy": ("cpu", "net", "disk"),
}
#: The server-shaped worker's API process, as a profile copy's rule matches it (--shape server).
API_MATCH = r"/noisy_neighbor\.py --role api\b"
GOAL_TOK, GOAL_P99 = 0.97, 1.10
#: Tokens decoded per sequence (after a 32-token prompt) by the GPU worker.
SEQ_TOKENS = 128

# ---- processes this benchmark starts: tracked and stopped by PID -----------------------------

_libc: Any = None


def _die_with_parent(sig: int) -> Callable[[], None]:
    """A preexec_fn: the child gets ``sig`` when this process dies (prctl PR_SET_PDEATHSIG)."""
    global _libc  # noqa: PLW0603  loaded once, before any fork
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    libc = _libc

    def pre() -> None:
        libc.prctl(1, sig, 0, 0, 0)  # PR_SET_PDEATHSIG = 1 (include/uapi/linux/prctl.h)

    return pre


class Children:
    """Every process started here, by PID; ``stop_all`` ends them newest first."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.started: list[int] = []

    def start(
        self, argv: list[str], *, death_signal: int = signal.SIGKILL, **kw: Any
    ) -> subprocess.Popen[bytes]:
        env = kw.pop("env", None) or dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        proc: subprocess.Popen[bytes] = subprocess.Popen(
            argv,
            env=env,
            # This process starts no threads, so a preexec_fn is safe here.
            preexec_fn=_die_with_parent(death_signal),  # noqa: PLW1509
            **kw,
        )
        self.procs[proc.pid] = proc
        self.started.append(proc.pid)
        return proc

    def stop(
        self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 5.0
    ) -> int:
        """Signal one child by its PID, wait, SIGKILL if it does not go; returns its status."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.pop(proc.pid, None)
        return proc.returncode

    def stop_all(self) -> None:
        for pid in reversed(list(self.procs)):
            self.stop(self.procs[pid], wait=2.0)

    def alive(self) -> list[int]:
        """PIDs started here that still exist (a reaped child's PID is gone)."""
        out = []
        for pid in self.started:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            out.append(pid)
        return out


# ---- noise: each generator a process of its own, bounded in time ----------------------------


class WorkCounter:
    """The work a noise process did (iterations, bytes sent, bytes fsync'd): a 64-bit count in
    a shared-memory file that the process adds to and the benchmark reads (issue 20, item 3)."""

    def __init__(self, path: str | None) -> None:
        import mmap

        self.map = None
        if path:
            with open(path, "r+b") as f:  # noqa: PTH123
                self.map = mmap.mmap(f.fileno(), 8)
        self.n = 0

    def add(self, n: int) -> None:
        self.n += n
        if self.map is not None:
            self.map[:8] = self.n.to_bytes(8, "little")


def role_cpu(deadline: float, work: WorkCounter) -> None:
    while time.time() < deadline:
        for _ in range(200_000):
            pass
        work.add(200_000)


def role_net(deadline: float, work: WorkCounter) -> None:
    """One loopback TCP stream, sender and receiver in this process (127.0.0.1 only)."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()

    def sink() -> None:
        while conn.recv(1 << 20):
            pass

    threading.Thread(target=sink, daemon=True).start()
    chunk = b"n" * 65536
    while time.time() < deadline:
        cli.sendall(chunk)
        work.add(len(chunk))
    cli.close()


def role_disk(deadline: float, directory: str, work: WorkCounter) -> None:
    """1 MiB writes, each followed by fsync, over a 64 MiB file in ``directory``."""
    path = Path(directory) / f"noise-{os.getpid()}.bin"
    block = os.urandom(1 << 20)
    with path.open("wb", buffering=0) as f:
        while time.time() < deadline:
            f.write(block)
            os.fsync(f.fileno())
            work.add(len(block))
            if f.tell() >= 64 << 20:
                f.seek(0)
    path.unlink()


class Noise:
    """One noise kind: ``cpu``, ``net``, ``disk`` or ``heavy`` (all three).

    ``cgroup`` (``--noise-cgroup NAME``): the noise runs in the top-level cgroup v2 ``NAME``,
    made for it and removed after, as a real host's neighbours run in cgroups of their own
    (user.slice, a container); ``[neighbours]`` then weights or caps it. Without it the noise
    stays in this benchmark's cgroup.
    """

    cgroup: str | None = None

    def __init__(self, children: Children, kind: str, counts: dict[str, int], disk_dir: str):
        self.children, self.kind, self.counts, self.disk_dir = children, kind, counts, disk_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.work_dir = ""

    def start(self, seconds: float) -> None:
        deadline = time.time() + seconds  # bounded even if nobody stops it
        # Counters are mmap'd: updates stay in the page cache (8 bytes a process, no I/O of note).
        self.work_dir = tempfile.mkdtemp(prefix="nn-work-")
        for part in NOISE_PARTS[self.kind]:
            for i in range(self.counts[part]):
                counter = os.path.join(self.work_dir, f"{part}-{i}")  # noqa: PTH118
                Path(counter).write_bytes(bytes(8))
                argv = [sys.executable, __file__, "--role", part, "--deadline", f"{deadline:.0f}"]
                argv += ["--counter", counter]
                if part == "disk":
                    argv += ["--disk-dir", self.disk_dir]
                self.procs.append(self.children.start(argv, stdin=subprocess.DEVNULL))
        if self.cgroup:
            from gputuned.kernel.live import LiveKernel
            from gputuned.kernel.system import read_cgroup_layout

            kernel, where = LiveKernel(), f"/sys/fs/cgroup/{self.cgroup}"
            if read_cgroup_layout(kernel).mode != "v2":
                print("  --noise-cgroup: no cgroup v2 hierarchy here; the noise stays put")
                Noise.cgroup = None
                return
            if not kernel.is_dir(where):
                kernel.mkdir(where)
            for proc in self.procs:
                kernel.move_to_cgroup(proc.pid, where)

    def work(self) -> dict[str, int]:
        """The work done so far per part: burner iterations, bytes sent, bytes fsync'd."""
        out = dict.fromkeys(NOISE_PARTS[self.kind], 0)
        for f in Path(self.work_dir).iterdir() if self.work_dir else ():
            part = f.name.split("-")[0]
            out[part] += int.from_bytes(f.read_bytes()[:8], "little")
        return out

    def stop(self) -> None:
        for p in self.procs:
            self.children.stop(p, wait=3.0)
        self.procs = []
        if self.cgroup:
            from gputuned import errors
            from gputuned.kernel.live import LiveKernel

            with contextlib.suppress(errors.GputunedError):  # busy: a process not yet reaped
                LiveKernel().rmdir(f"/sys/fs/cgroup/{self.cgroup}")
        if self.work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = ""


# ---- the worker: decodes on request, measures itself ----------------------------------------


def _cpu_tokens(
    token_ms: float, steps: int | None = None
) -> tuple[Iterator[float], dict[str, Any]]:
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
            _HOST_S.append(took)
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


def _gpu_tokens() -> tuple[Iterator[float], dict[str, Any]]:
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
                _HOST_S.append(time.perf_counter() - t)
                nxt.item()  # the host sync a streaming server makes to send each token
                yield time.perf_counter() - t

    params = sum(p.numel() for p in model.parameters())
    return gen(), {
        "worker": "gpu",
        "desc": f"{desc}; bf16, eager decode, .item() per token; {params / 1e6:.0f} M parameters",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
    }


def _self_counters() -> Any:
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.sampling import sample_process

    return sample_process(LiveKernel(), os.getpid())


def _counter_deltas(a: Any, b: Any) -> dict[str, int]:
    """Run-queue wait and context switches between two samples of this process's threads."""
    before = {t.tid: t for t in a.threads}
    out = {"wait_ns": 0, "run_ns": 0, "invol": 0, "vol": 0}
    for t in b.threads:
        o = before.get(t.tid)
        out["wait_ns"] += (t.wait_ns or 0) - ((o.wait_ns or 0) if o else 0)
        out["run_ns"] += (t.run_ns or 0) - ((o.run_ns or 0) if o else 0)
        out["invol"] += t.involuntary - (o.involuntary if o else 0)
        out["vol"] += t.voluntary - (o.voluntary if o else 0)
    return out


def role_worker(kind: str, token_ms: float, steps: int | None = None) -> None:
    """Answer one JSON line per request on the original stdout; anything printed goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    note = ""
    tokens: Iterator[float] | None = None
    info: dict[str, Any] = {}
    if kind in ("auto", "gpu"):
        try:
            tokens, info = _gpu_tokens()
        except Exception as exc:
            if kind == "gpu":
                raise
            note = f"no GPU worker ({type(exc).__name__}: {exc}); using the CPU stand-in"
    if tokens is None:
        tokens, info = _cpu_tokens(token_ms, steps)
    # Warm up: two whole sequences on the GPU, so that the allocator has seen the largest KV
    # cache before anything is measured (a cudaMalloc mid-window is a 100 ms outlier).
    for _ in range(2 * SEQ_TOKENS + 1 if info["worker"] == "gpu" else 100):
        next(tokens)
    gc.collect()
    gc.freeze()  # as servers do after start-up: the model's objects leave the collector's scans
    proto.write(json.dumps({"ready": True, **info, "note": note}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "quit":
            return
        _run_for(tokens, float(req["warmup"]))
        _HOST_S.clear()
        s0, t0 = _self_counters(), time.perf_counter()
        lat = _run_for(tokens, float(req["seconds"]))
        elapsed = time.perf_counter() - t0
        d = _counter_deltas(s0, _self_counters())
        host_ms = statistics.fmean(_HOST_S) * 1e3 if _HOST_S else float("nan")
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
    benchmarks/server_shape.py, which spawns the engine)."""

    def __init__(self, children: Children, args: argparse.Namespace) -> None:
        role = "api" if args.shape == "server" else "worker"
        argv = [sys.executable, __file__, "--role", role, "--worker", args.worker]
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
            if pid != self.pid and _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while any(_alive(p) for p in self.pids) and time.monotonic() < deadline:
            time.sleep(0.05)


# ---- gputuned: the daemon started here, the worker registered with it ------------------------


class Gputuned:
    """Start ``gputuned --profile`` as a child, register PIDs, stop it (SIGTERM: it reverts)."""

    def __init__(self, children: Children, log: IO[bytes]) -> None:
        from gputuned.kernel.live import LiveKernel
        from gputuned.store.state import ACTIVE, STATE, read_optional_bytes

        self.children, self.log, self.host = children, log, LiveKernel()
        self.proc: subprocess.Popen[bytes] | None = None
        #: How the daemon is run; benchmarks/reaction.py --breakdown runs it through
        #: benchmarks/daemon_trace.py.
        self.launcher = [sys.executable, "-m", "gputuned.daemon"]
        check_untuned(self.host)
        # The daemon records its profile as the active one; put back what was there.
        self.saved = {p: read_optional_bytes(self.host, p) for p in (ACTIVE, STATE)}

    def start(self, profile: Path, timeout: float = 60.0) -> float:
        from gputuned.service.control import daemon_running

        t0 = time.monotonic()
        argv = [*self.launcher, "--profile", str(profile.absolute())]
        self.proc = self.children.start(
            argv, death_signal=signal.SIGTERM, stdout=self.log, stderr=subprocess.STDOUT
        )
        while not daemon_running(self.host):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gputuned exited with status {self.proc.returncode}; see its log"
                )
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"gputuned did not open its control socket in {timeout:g} s")
            time.sleep(0.05)
        # The socket comes up before the start's apply; its first answer comes after it.
        self.request({"cmd": "status"})
        return time.monotonic() - t0

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        from gputuned.service.control import request

        return request(self.host, msg)

    def stop(self) -> dict[str, Any]:
        """SIGTERM (the daemon reverts), then check that nothing is left applied."""
        from gputuned.engine.journal import Journal
        from gputuned.store.state import remove, replace_durable

        assert self.proc is not None
        rc = self.children.stop(self.proc, wait=60.0)
        self.proc = None
        left = len(Journal(self.host))
        if rc != 0 or left:
            from gputuned.engine.apply import revert_all

            rep = revert_all(self.host, forget_profile=False)
            print(f"gputuned exited {rc} leaving {left} journal entries; reverted: {rep.to_json()}")
        for path, data in self.saved.items():
            if data is None:
                remove(self.host, path)
            else:
                replace_durable(self.host, path, data, mode=0o644)
        return {"exit_status": rc, "journal_entries_left": left}


def check_untuned(host: Any) -> None:
    from gputuned.engine.journal import Journal
    from gputuned.service.control import daemon_running

    if os.geteuid() != 0:
        sys.exit("the gputuned conditions need root (or run with --no-gputuned)")
    if daemon_running(host):
        sys.exit("a gputuned daemon runs already: stop it (the clean windows must be untuned)")
    if len(Journal(host)):
        sys.exit("a profile is applied here (journal not empty): gputunectl revert first")


def fingerprint(pid: int | list[int]) -> dict[str, Any]:
    """What gputuned may change, read back: IRQ affinities, gputuned cgroups, the worker's
    processes (``pid``: one, or every process of a server-shaped worker; the first is the one
    whose cgroup is shown)."""
    from gputuned import errors
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_process
    from gputuned.kernel.system import read_cgroup_layout, read_default_affinity, read_interrupts

    host = LiveKernel()
    mount = read_cgroup_layout(host).v2_mount
    pids = [pid] if isinstance(pid, int) else pid
    procs = []
    for p in pids:
        with contextlib.suppress(errors.TargetGone):
            procs.append(read_process(host, p))
    return {
        "irqs": {str(i.irq): sorted(i.affinity or ()) for i in read_interrupts(host)},
        "default_irq_affinity": sorted(read_default_affinity(host) or ()),
        "gputuned_cgroups": [n for n in host.listdir(mount) if "gputuned" in n] if mount else [],
        "worker_cgroup": procs[0].cgroup if procs else "-",
        "worker_cgroups": {str(p.pid): p.cgroup for p in procs},
        "worker_threads": {
            str(t.tid): [t.nice, t.policy, sorted(t.affinity)] for p in procs for t in p.threads
        },
    }


def fingerprint_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for key in ("default_irq_affinity", "gputuned_cgroups", "worker_cgroup", "worker_cgroups"):
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a[key]} -> {b[key]}")
    for table in ("irqs", "worker_threads"):
        for k in sorted(set(a[table]) & set(b[table])):  # threads may come and go
            if a[table][k] != b[table][k]:
                out.append(f"{table}[{k}]: {a[table][k]} -> {b[table][k]}")
    return out


def isolated_profile(
    profile: Path,
    work: Path,
    cmdline: str = "(?!)",
    rule_name: str | None = None,
    uid: int | None = None,
) -> Path:
    """``profile`` with one [[process]] rule (``rule_name``, default the first), matching only
    ``cmdline`` (default: nothing) of processes run by ``uid`` (default: this process's).

    On a machine others use too, the shipped rule would also place their vLLM-like processes.
    What the rule does (CPUs, nice, policy, partition, children) is kept; only ``match``
    changes, and it still names an account, as a rule that grants CPUs or a negative nice must.
    ``profile``'s folder is copied into ``work/base`` and included from there: an include must
    lie beside the including file or below its folder.
    """
    from gputuned.profile.load import load_profile

    rules = load_profile(profile).process
    chosen = next((r for r in rules if r.name == rule_name), rules[0])
    rule = chosen.model_dump(mode="json", by_alias=True, exclude_none=True)
    rule["match"] = {"cmdline": cmdline, "uid": os.geteuid() if uid is None else uid}
    base = work / "base"
    # The profile may itself lie in ``work`` (reaction.py writes one there for
    # realtime_priority): the copy must not copy itself into itself.
    skip = base.resolve()
    shutil.copytree(
        profile.absolute().parent,
        base,
        dirs_exist_ok=True,
        ignore=lambda d, names: [n for n in names if (Path(d) / n).resolve() == skip],
    )
    lines = [f"include = [{json.dumps(f'base/{profile.name}')}]", "", "[[process]]"]
    for key, value in rule.items():
        for k, v in value.items() if isinstance(value, dict) else [(None, value)]:
            lines.append(f"{key}.{k} = {_toml(v)}" if k else f"{key} = {_toml(v)}")
    out = work / f"{profile.stem}.toml"
    out.write_text("\n".join(lines) + "\n")
    return out


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v) if isinstance(v, int) else json.dumps(v)


def placement(pid: int | list[int]) -> dict[str, Any]:
    """How the worker's threads are placed now (nice, policy, CPUs; cgroup)."""
    fp = fingerprint(pid)
    shapes: dict[str, int] = {}
    for nice, policy, cpus in fp["worker_threads"].values():
        key = f"nice {nice} {policy} cpus {_cpulist(cpus)}"
        shapes[key] = shapes.get(key, 0) + 1
    return {"cgroup": fp["worker_cgroup"], "threads": shapes}


def _cpulist(cpus: list[int]) -> str:
    from gputuned.cpulist import format_cpulist

    return format_cpulist(frozenset(cpus))


# ---- figures ---------------------------------------------------------------------------------


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def window_figures(res: dict[str, Any]) -> dict[str, Any]:
    lat = res["lat_ms"]
    n = max(1, len(lat))
    return {
        "tokens": len(lat),
        "seconds": round(res["elapsed_s"], 3),
        "tok_s": len(lat) / res["elapsed_s"],
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "runq_ms_per_token": res["wait_ns"] / 1e6 / n,
        "cpu_ms_per_token": res["run_ns"] / 1e6 / n,
        "host_ms_per_token": res.get("host_ms", float("nan")),
        "invol_cs_per_1k": res["invol"] * 1000 / n,
        "vol_cs_per_1k": res["vol"] * 1000 / n,
    }


def add_ratios(block: list[dict[str, Any]]) -> None:
    """Ratios to the mean of the block's own clean windows (clean and clean-again)."""
    clean = [w for w in block if w["condition"] in ("clean", "clean-again")]
    for key, name in (("tok_s", "tok_s_x"), ("p50_ms", "p50_x"), ("p99_ms", "p99_x")):
        ref = statistics.fmean(w[key] for w in clean)
        for w in block:
            w[name] = w[key] / ref if ref else float("nan")
    # The neighbours' bill (issue 20, item 3): against the block's untuned noisy window, what
    # the server gained and what each kind of neighbour lost (1 - work / untuned work).
    noisy = next((w for w in block if w["condition"] == "noisy"), None)
    if noisy is None or "neighbour_work_per_s" not in noisy:
        return
    base = noisy["neighbour_work_per_s"]
    for w in block:
        if "neighbour_work_per_s" in w:
            w["server_gain"] = w["tok_s"] / noisy["tok_s"] - 1 if noisy["tok_s"] else float("nan")
            w["neighbour_loss"] = {
                p: 1 - v / base[p] if base.get(p) else float("nan")
                for p, v in w["neighbour_work_per_s"].items()
            }


def spread(xs: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
    }


def pooled(windows: list[dict[str, Any]], noise: str, conds: tuple[str, ...]) -> list[float]:
    return [
        x for w in windows if w["noise"] == noise and w["condition"] in conds for x in w["_lat"]
    ]


def summarize(windows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per noise kind and condition: the spread over rounds of each figure, and p50/p99 of all
    rounds' tokens pooled against the pooled clean tokens (more tokens: a steadier p99)."""
    out: dict[str, dict[str, Any]] = {}
    for w in windows:
        cond = out.setdefault(w["noise"], {}).setdefault(w["condition"], {})
        for key in (
            "tok_s_x",
            "p50_x",
            "p99_x",
            "tok_s",
            "p99_ms",
            "runq_ms_per_token",
            "invol_cs_per_1k",
            "vol_cs_per_1k",
        ):
            cond.setdefault(key, []).append(w[key])
        if "neighbour_loss" in w:
            cond.setdefault("server_gain", []).append(w["server_gain"])
            for part, loss in w["neighbour_loss"].items():
                cond.setdefault(f"neighbour_loss_{part}", []).append(loss)
    summary = {
        noise: {c: {k: spread(v) for k, v in vals.items()} for c, vals in conds.items()}
        for noise, conds in out.items()
    }
    for noise, conds in summary.items():
        clean = pooled(windows, noise, ("clean", "clean-again"))
        for cond, figures in conds.items():
            mine = pooled(windows, noise, (cond,))
            for q in (50, 99):
                figures[f"p{q}_pooled_x"] = percentile(mine, q) / percentile(clean, q)
            figures["tokens"] = len(mine)
    return summary


def table(summary: dict[str, Any], header: str) -> str:
    def r(s: dict[str, float]) -> str:
        return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"

    lines = [
        header,
        f"{'noise':6} {'condition':22} {'tok/s x':18} {'p50 x':18} {'p99 x':18} "
        f"{'p99 pooled x':>12} {'runq ms/tok':>11} {'invcs/1k tok':>12} {'tok/s':>8}",
    ]
    for noise, conds in summary.items():
        for cond, s in conds.items():
            lines.append(
                f"{noise:6} {cond:22} {r(s['tok_s_x']):18} {r(s['p50_x']):18} "
                f"{r(s['p99_x']):18} {s['p99_pooled_x']:12.2f} "
                f"{s['runq_ms_per_token']['median']:11.3f} "
                f"{s['invol_cs_per_1k']['median']:12.1f} {s['tok_s']['median']:8.1f}"
            )
    for noise, conds in summary.items():
        for cond, s in conds.items():
            if "server_gain" in s and cond != "noisy":
                losses = ", ".join(
                    f"{k.removeprefix('neighbour_loss_')} {v['median']:+.1%}"
                    for k, v in s.items()
                    if k.startswith("neighbour_loss_")
                )
                lines.append(
                    f"neighbours' bill, {cond} under {noise}: server tok/s "
                    f"{s['server_gain']['median']:+.1%} against untuned; neighbours lose "
                    f"{losses} of their untuned work (median over rounds)"
                )
    for noise, conds in summary.items():
        for cond, s in conds.items():
            if cond.startswith("tuned"):
                tok, p99 = s["tok_s_x"]["median"], s["p99_x"]["median"]
                p99p = s["p99_pooled_x"]
                # Three decimals: at two, a p99 of 1.1023x prints as 1.10x beside "NOT met".
                lines.append(
                    f"goal {cond} under {noise} noise: tok/s {tok:.3f}x "
                    f"({'met' if tok >= GOAL_TOK else 'NOT met'}: >= {GOAL_TOK}), p99 {p99:.3f}x "
                    f"and pooled {p99p:.3f}x "
                    f"({'both met' if max(p99, p99p) <= GOAL_P99 else 'NOT met'}: <= {GOAL_P99})"
                )
    return "\n".join(lines)


# ---- the plot ----------------------------------------------------------------------------------


def plot(
    summary: dict[str, Any],
    path: Path,
    title: str,
    goal_p99: float = GOAL_P99,
    legend: str = "{} noise",
) -> str:
    """matplotlib when installed; otherwise a plain PNG of the same bars, without text.

    ``summary``: series (a bar colour each, named in the legend by ``legend``) -> group (a
    position on the x axis) -> figure -> its spread."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _plain_png(summary, path)
        return "plain (matplotlib not installed: bars only, no labels)"
    panels = (
        ("tok_s_x", "tokens/s (x clean)", GOAL_TOK),
        ("p99_x", "p99 token latency (x clean)", goal_p99),
        ("runq_ms_per_token", "run-queue delay (ms/token)", None),
    )
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    noises = list(summary)
    for ax, (key, label, goal) in zip(axes, panels, strict=True):
        conds = list(dict.fromkeys(c for n in noises for c in summary[n]))
        width = 0.8 / max(1, len(noises))
        for i, noise in enumerate(noises):
            xs, ys, lo, hi = [], [], [], []
            for j, c in enumerate(conds):
                if c in summary[noise]:
                    s = summary[noise][c][key]
                    xs.append(j + i * width)
                    ys.append(s["median"])
                    lo.append(s["median"] - s["min"])
                    hi.append(s["max"] - s["median"])
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=legend.format(noise))
        ax.set_xticks([j + width * (len(noises) - 1) / 2 for j in range(len(conds))])
        ax.set_xticklabels(conds, rotation=20, ha="right")
        ax.set_title(label)
        if goal is not None:
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.axhline(goal, color="red", ls="--", lw=0.8, label=f"goal {goal}")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return "matplotlib"


def _plain_png(summary: dict[str, Any], path: Path) -> None:
    import struct
    import zlib

    w, h = 640, 360
    px = [[(255, 255, 255)] * w for _ in range(h)]
    colours = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]

    def rect(x0: int, y0: int, x1: int, y1: int, c: tuple[int, int, int]) -> None:
        for y in range(max(0, y0), min(h, y1)):
            for x in range(max(0, x0), min(w, x1)):
                px[y][x] = c

    for half, key in enumerate(("tok_s_x", "p99_x")):
        base, top = 170 + half * 180, 10 + half * 180
        scale = (base - top) / 3.0  # 0..3x
        bars = [(n, c) for n in summary for c in summary[n]]
        bw = max(2, (w - 20) // max(1, len(bars)) - 2)
        for k, (noise, cond) in enumerate(bars):
            v = min(3.0, summary[noise][cond][key]["median"])
            x = 10 + k * (bw + 2)
            rect(x, base - int(v * scale), x + bw, base, colours[list(summary).index(noise) % 4])
        rect(0, base - int(scale), w, base - int(scale) + 1, (0, 0, 0))  # 1.0x
    raw = b"".join(b"\0" + bytes(v for p in row for v in p) for row in px)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


# ---- the run -----------------------------------------------------------------------------------


def conditions(profiles: list[Path], orders: tuple[str, ...] = ("",)) -> list[str]:
    tuned = [f"tuned:{p.stem}{f':{o}' if o else ''}" for p in profiles for o in orders]
    return ["clean", "noisy", *tuned, *(["reverted"] if profiles else []), "clean-again"]


def run_orders(args: argparse.Namespace) -> tuple[str, ...]:
    """Start orders measured per profile: the server-shaped worker's, else one (registered)."""
    if args.shape != "server":
        return ("",)
    return ("server-first", "daemon-first") if args.order == "both" else (args.order,)


#: A step of a block under noise: ("noisy",), ("tuned", profile, order), ("reverted",) or
#: ("pinned", cpus) (the server pinned and reniced by hand, no gputuned: benchmarks/matrix.py).
Step = tuple[Any, ...]


def default_steps(args: argparse.Namespace, gputuned: bool) -> list[Step]:
    """noisy, then every profile in every start order, then reverted (with gputuned)."""
    tuned: list[Step] = [
        ("tuned", prof, order) for prof in args.profile if gputuned for order in run_orders(args)
    ]
    return [("noisy",), *tuned, *([("reverted",)] if tuned else [])]


class Block:
    """One noise kind, one round: clean, every step once in order under the noise, clean
    again (``steps``: default_steps)."""

    def __init__(
        self, ctx: dict[str, Any], noise_kind: str, rnd: int, steps: list[Step] | None = None
    ) -> None:
        self.ctx, self.noise_kind, self.rnd = ctx, noise_kind, rnd
        self.args, self.worker = ctx["args"], ctx["worker"]
        self.steps = steps  # None: default_steps, when run
        self.windows: list[dict[str, Any]] = []
        self.noise: Noise | None = None  # running: each window also measures its work

    def run(self) -> list[dict[str, Any]]:
        args = self.args
        noise = Noise(
            self.ctx["children"], self.noise_kind, self.ctx["counts"], self.ctx["disk_dir"]
        )
        if self.steps is None:
            self.steps = default_steps(args, bool(self.ctx["gputuned"]))
        self.measure("clean")
        # A daemon-first window starts a server of its own: its start-up (model, CUDA) too.
        extra = 120 + 90 * sum(1 for s in self.steps if s[1:] and s[-1] == "daemon-first")
        noise.start(len(self.steps) * (args.window + args.warmup + args.settle) + extra)
        self.noise = noise
        try:
            for step in self.steps:
                if step[0] == "tuned":
                    self.tuned(self.ctx["gputuned"], step[1], step[2])
                elif step[0] == "pinned":
                    self.pinned(step[1])
                else:  # noisy, reverted: after a pause for the change (noise on, daemon gone)
                    time.sleep(args.settle)
                    self.measure(step[0])
        finally:
            self.noise = None
            noise.stop()
        time.sleep(args.settle)
        self.measure("clean-again")
        add_ratios(self.windows)
        return self.windows

    def pinned(self, cpus: frozenset[int]) -> None:
        """The published mitigation, by hand and without gputuned: every thread of the worker's
        processes on ``cpus`` (as ``taskset -a -p -c``) at nice -10 (``renice`` per thread);
        measured, then put back as it was and checked."""
        before = fingerprint(self.worker.pids)
        threads = pin_by_hand(self.worker.pids, cpus, PINNED_NICE)
        time.sleep(self.args.settle)
        placed = placement(self.worker.pids)
        self.measure("pinned", placement=placed)
        put_back_by_hand(before["worker_threads"])
        diff = fingerprint_diff(before, fingerprint(self.worker.pids))
        self.ctx.setdefault("result", {}).setdefault("pinned", []).append(
            {
                "round": self.rnd,
                "noise": self.noise_kind,
                "cpus": _cpulist(sorted(cpus)),
                "threads_set": threads,
                "placement": placed,
                "put_back": not diff,
                "differences": diff,
            }
        )
        if diff:
            print(f"  WARNING: pinned by hand, not put back: {'; '.join(diff[:3])}")

    def measure(self, cond: str, worker: Worker | None = None, **extra: Any) -> None:
        worker = worker or self.worker
        cpus = _allowed_cpus(worker.pids[-1] if self.args.shape == "server" else worker.pid)
        s0, t0 = steal_ticks(), time.monotonic()
        n0 = self.noise.work() if self.noise else {}
        res = worker.window(self.args.window, self.args.warmup)
        n1 = self.noise.work() if self.noise else {}
        s1, secs = steal_ticks(), time.monotonic() - t0
        w = {"round": self.rnd, "noise": self.noise_kind, "condition": cond}
        w.update(window_figures(res), **extra)
        if n1:  # the neighbours' work in this window, per second (warm-up included)
            w["neighbour_work_per_s"] = {p: (n1[p] - n0[p]) / secs for p in n1}
        # Time the hypervisor ran something else on this VM's CPUs (/proc/stat "steal"), in ms
        # per second per CPU: on the worker's CPUs, and on all.
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        per = {c: (s1.get(c, 0) - s0.get(c, 0)) * tick_ms / secs for c in s1}
        mine = [per[c] for c in cpus if c in per]
        w["steal_ms_per_s_worker_cpus"] = statistics.fmean(mine) if mine else float("nan")
        w["steal_ms_per_s_all_cpus"] = statistics.fmean(per.values()) if per else float("nan")
        w["_lat"] = res["lat_ms"]  # for the pooled percentiles; in the JSON with --keep-latencies
        if res.get("ttft_ms"):
            w["ttft_p50_ms"] = percentile(res["ttft_ms"], 50)
        self.windows.append(w)
        print(
            f"  round {self.rnd} {self.noise_kind:5} {cond:35} {w['tok_s']:8.1f} tok/s  p50 "
            f"{w['p50_ms']:7.3f} p99 {w['p99_ms']:7.3f} ms  runq {w['runq_ms_per_token']:.3f} "
            f"host {w['host_ms_per_token']:.3f} ms/tok  steal {w['steal_ms_per_s_worker_cpus']:.1f}"
            f"/{w['steal_ms_per_s_all_cpus']:.1f} ms/s",
            flush=True,
        )

    def tuned(self, gputuned: Gputuned, prof: Path, order: str = "") -> None:
        """One tuned window: start the daemon (and, daemon first, a server of its own after it),
        measure, stop the daemon (it reverts), check the worker and the host are as before.

        The single-process worker is registered with the daemon; the server-shaped one is
        placed by the profile's rule, its engine as the API process's child. ``capture
        --stable`` of the host before the daemon starts and after it stopped must be equal.
        """
        fresh = order == "daemon-first"
        worker = self.worker
        before_capture = host_capture()
        before = fingerprint(worker.pids)  # the untuned server: a fresh one must end like it
        took = gputuned.start(prof)
        reg: dict[str, Any] | None = None
        try:
            if fresh:
                worker = Worker(self.ctx["children"], self.args)
            elif self.args.shape != "server":
                reg = gputuned.request(
                    {
                        "cmd": "register",
                        "pid": worker.pid,
                        "start": start_time(worker.pid),
                        "rule": self.ctx["rule"][prof],
                    }
                )
            placed_s = wait_placed(worker.pids, self.ctx["wanted"].get(prof))
            time.sleep(self.args.settle)
            placed = placement(worker.pids)
            cond = f"tuned:{prof.stem}{f':{order}' if order else ''}"
            self.measure(cond, worker, placement=placed)
            stopped = gputuned.stop()
            # The long-running server (placed too, daemon first: the rule matches it) as before;
            # a fresh one as the untuned one is.
            diff = fingerprint_diff(before, fingerprint(self.worker.pids))
            if fresh:
                diff += fresh_diff(before, fingerprint(worker.pids))
        finally:
            if fresh and worker is not self.worker:
                worker.close()
        capture_diff = compare_captures(before_capture, host_capture())
        self.ctx["gputuned_runs"].append(
            {
                "round": self.rnd,
                "noise": self.noise_kind,
                "profile": str(prof),
                "order": order or "registered",
                "daemon_start_s": round(took, 3),
                "placed_after_s": placed_s,
                "registered": reg,
                "placement": placed,
                **stopped,
                "host_back": not diff and not stopped["journal_entries_left"] and not capture_diff,
                "differences": diff,
                "capture_equal": not capture_diff,
                "capture_differences": capture_diff[:20],
            }
        )
        for what, d in (("not as before the daemon", diff), ("capture differs", capture_diff)):
            if d:
                more = f" and {len(d) - 3} more" if len(d) > 3 else ""
                print(f"  WARNING: {what}: {'; '.join(d[:3])}{more}")


#: The nice level of the published mitigation (and of the shipped profile's rule).
PINNED_NICE = -10


def _tids(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return []


def pin_by_hand(pids: list[int], cpus: frozenset[int], nice: int) -> int:
    """Every thread of ``pids`` on ``cpus`` at ``nice``, as taskset -a and renice would do it;
    threads started meanwhile are caught by a second pass. Returns how many were set."""
    done: set[int] = set()
    for _ in range(3):
        new = [(p, t) for p in pids for t in _tids(p) if t not in done]
        if not new:
            break
        for _pid, tid in new:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, cpus)
                os.setpriority(os.PRIO_PROCESS, tid, nice)  # per thread on Linux (setpriority(2))
            done.add(tid)
    return len(done)


def put_back_by_hand(threads: dict[str, list[Any]]) -> None:
    """Each thread's nice and CPUs as ``fingerprint`` recorded them (threads gone: skipped)."""
    for tid, (nice, _policy, cpus) in threads.items():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(tid), cpus)
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def fresh_diff(ref: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """A server started while the daemon ran, after the daemon stopped: each of its processes
    in the cgroup the untuned server's are in, each thread with a (nice, policy, CPUs) that
    the untuned server's threads have."""
    out = []
    home = set(ref["worker_cgroups"].values())
    for pid, cg in after["worker_cgroups"].items():
        if cg not in home:
            out.append(f"pid {pid}: cgroup {cg}, not {sorted(home)}")
    untuned = {json.dumps(v) for v in ref["worker_threads"].values()}
    for tid, v in after["worker_threads"].items():
        if json.dumps(v) not in untuned:
            out.append(f"thread {tid}: {v}, untuned threads have {sorted(untuned)}")
    return out


def start_time(pid: int) -> int:
    """proc(5) stat field 22: with the PID, a process's identity (register sends both)."""
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_identity

    return read_identity(LiveKernel(), pid)[0]


def wait_placed(pids: list[int], wanted: int | None, timeout: float = 60.0) -> float | None:
    """Seconds until every thread of ``pids`` has nice ``wanted`` (None: not waited for)."""
    if wanted is None:
        return None
    from gputuned import errors
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_process

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if all(t.nice == wanted for p in pids for t in read_process(LiveKernel(), p).threads):
                return round(time.monotonic() - t0, 3)
        except errors.TargetGone:
            pass
        time.sleep(0.01)
    print(f"  WARNING: not every thread of {pids} had nice {wanted} within {timeout:.0f} s")
    return None


def host_capture() -> Path:
    """``gputunectl capture --stable`` of this host into a new temporary directory."""
    from gputuned.kernel.capture import capture
    from gputuned.kernel.live import LiveKernel

    dest = Path(tempfile.mkdtemp(prefix="nn-capture-"))
    capture(LiveKernel(), dest, stable=True)
    return dest


def compare_captures(a: Path, b: Path) -> list[str]:
    """What ``diff -r a b`` would list (file names); both directories are removed."""
    try:
        fa = {p.relative_to(a): p for p in a.rglob("*") if p.is_file() or p.is_symlink()}
        fb = {p.relative_to(b): p for p in b.rglob("*") if p.is_file() or p.is_symlink()}
        out = [f"only before: {k}" for k in sorted(fa.keys() - fb.keys())]
        out += [f"only after: {k}" for k in sorted(fb.keys() - fa.keys())]
        for k in sorted(fa.keys() & fb.keys()):
            x, y = fa[k], fb[k]
            same = (
                x.readlink() == y.readlink()
                if x.is_symlink() or y.is_symlink()
                else x.read_bytes() == y.read_bytes()
            )
            if not same:
                out.append(f"differs: {k}")
        return out
    finally:
        shutil.rmtree(a, ignore_errors=True)
        shutil.rmtree(b, ignore_errors=True)


def steal_ticks() -> dict[int, int]:
    """Per CPU, the "steal" column of /proc/stat (clock ticks)."""
    out = {}
    with Path("/proc/stat").open() as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                parts = line.split()
                out[int(parts[0][3:])] = int(parts[8]) if len(parts) > 8 else 0
    return out


def _allowed_cpus(pid: int) -> list[int]:
    """The CPUs the worker's main thread may run on ([] once it is gone)."""
    from gputuned import errors
    from gputuned.kernel.live import LiveKernel
    from gputuned.kernel.proc import read_process

    try:
        threads = read_process(LiveKernel(), pid).threads
    except errors.GputunedError:
        return []
    return sorted(next((t.affinity for t in threads if t.tid == pid), frozenset()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        "(benchmarks/server_shape.py)",
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
    # Internal: the processes this benchmark starts run this file again in a role.
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


def run_role(args: argparse.Namespace) -> None:
    if args.role == "worker":
        role_worker(args.worker, args.token_ms, args.cpu_steps)
    elif args.role == "api":
        from server_shape import role_api

        role_api(args)
    elif args.role == "cpu":
        role_cpu(args.deadline, WorkCounter(args.counter))
    elif args.role == "net":
        role_net(args.deadline, WorkCounter(args.counter))
    else:
        role_disk(args.deadline, args.disk_dir, WorkCounter(args.counter))


def add_noise_args(ap: argparse.ArgumentParser) -> None:
    """How many noise processes of each part (benchmarks/reaction.py takes the same)."""
    counts = default_noise_counts()
    ap.add_argument("--cpu-burners", type=int, default=counts["cpu"])
    ap.add_argument("--net-streams", type=int, default=counts["net"])
    ap.add_argument("--disk-writers", type=int, default=counts["disk"])
    ap.add_argument("--disk-dir", help="where the disk noise writes (default: a temp dir)")


def default_noise_counts(cpus: int | None = None) -> dict[str, int]:
    """A burner per CPU, a loopback stream per 4 CPUs, an fsync'd writer per 8 (at least 1)."""
    n = cpus or os.cpu_count() or 1
    return {"cpu": n, "net": max(1, n // 4), "disk": max(1, n // 8)}


def noise_counts(args: argparse.Namespace) -> dict[str, int]:
    return {"cpu": args.cpu_burners, "net": args.net_streams, "disk": args.disk_writers}


def fs_type(path: str) -> str:
    best, fs = "", "?"
    with contextlib.suppress(OSError), Path("/proc/mounts").open() as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) >= len(best):
                best, fs = parts[1], parts[2]
    return fs


def plan_seconds(args: argparse.Namespace, kinds: list[str]) -> float:
    per_window = args.window + args.warmup + args.settle
    orders = run_orders(args)
    windows = len(conditions(args.profile, orders))
    starts = 6.0 * len(args.profile) * len(orders) + 2.0
    return args.rounds * len(kinds) * (windows * per_window + starts)


def _terminated(*_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up short
    print("noisy_neighbor: SIGTERM: stopping everything it started", file=sys.stderr)
    sys.exit(143)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role:
        run_role(args)
        return 0
    kinds = [k.strip() for k in args.noise.split(",") if k.strip()]
    bad = [k for k in kinds if k not in NOISE_PARTS]
    if bad:
        sys.exit(f"unknown noise kind(s) {bad}; use {', '.join(NOISE_PARTS)}")

    def rounds(ctx: dict[str, Any]) -> Iterator[Block]:
        for rnd in range(1, args.rounds + 1):
            order = kinds if rnd % 2 else list(reversed(kinds))  # drift cancels over rounds
            for kind in order:
                yield Block(ctx, kind, rnd)

    result = run(args, kinds, rounds)
    finish(args, result)
    return 0 if not result["leftover_pids"] else 1


def run(
    args: argparse.Namespace,
    kinds: list[str],
    schedule: Callable[[dict[str, Any]], Iterator[Block]],
    name: str = "noisy_neighbor",
    summarizer: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Start the worker, run every block ``schedule`` yields, stop everything; write and return
    the result (``DIR/NAME.json``). benchmarks/matrix.py runs its own schedule through this."""
    signal.signal(signal.SIGTERM, _terminated)  # run the finally blocks
    args.out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    children = Children()
    disk_dir = tempfile.mkdtemp(prefix="noisy-disk-", dir=args.disk_dir)
    result: dict[str, Any] = {"benchmark": name, "command": sys.argv, "ok": False}
    windows: list[dict[str, Any]] = []  # of whole blocks only
    try:
        ctx = setup(args, children, disk_dir, kinds, result)
        ctx["result"] = result
        for block in schedule(ctx):
            windows += block.run()
        ctx["worker"].close()
        result["ok"] = True
    finally:
        children.stop_all()
        shutil.rmtree(disk_dir, ignore_errors=True)
        # An interrupted run still leaves the figures of the blocks it finished.
        result["summary"] = (summarizer or summarize)(windows) if windows else {}
        result["windows"] = [_public(w, args.keep_latencies) for w in windows]
        result["started_pids"] = children.started
        result["leftover_pids"] = children.alive() + [
            p for p in result.get("worker_pids", []) if p not in children.started and _alive(p)
        ]
        result["elapsed_s"] = round(time.monotonic() - t_start, 1)
        (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _alive(pid: int) -> bool:
    """Still running (a zombie, which only waits for its parent to reap it, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _public(w: dict[str, Any], latencies: bool) -> dict[str, Any]:
    out = {k: v for k, v in w.items() if k != "_lat"}
    if latencies:
        out["lat_ms"] = w["_lat"]
    return out


def setup(
    args: argparse.Namespace,
    children: Children,
    disk_dir: str,
    kinds: list[str],
    result: dict[str, Any],
) -> dict[str, Any]:
    from gputuned.profile.load import load_profile

    counts = noise_counts(args)
    rules = {}
    for p in args.profile:
        prof = load_profile(p)
        if not prof.process:
            sys.exit(f"{p} has no [[process]] rule to register the worker by")
        rules[p] = args.rule or prof.process[0].name
    if args.shape == "server":
        # Copies whose rule matches this benchmark's API process (by command line and this
        # account) and nothing else; what the rule does is the profile's own, children too.
        rules = {
            isolated_profile(
                p, Path(tempfile.mkdtemp(prefix="nn-profile-")), API_MATCH, rule_name=r
            ): r
            for p, r in rules.items()
        }
        args.profile = list(rules)
    elif args.register_only:  # copies whose rules match nothing: only the worker is placed
        rules = {
            isolated_profile(p, Path(tempfile.mkdtemp(prefix="nn-profile-")), rule_name=r): r
            for p, r in rules.items()
        }
        args.profile = list(rules)
    wanted = {p: next(r.nice for r in load_profile(p).process if r.name == rules[p]) for p in rules}
    gputuned = None
    if args.profile:
        log = (args.out / "daemon.log").open("wb")
        gputuned = Gputuned(children, log)
    print(
        f"planned: about {plan_seconds(args, kinds) / 60:.1f} min of windows; starting the worker"
    )
    t0 = time.monotonic()
    worker = Worker(children, args)
    info = {k: v for k, v in worker.info.items() if k != "ready"}
    args.cpu_steps, args.api_chars = info.get("steps"), info.get("prompt_chars")
    print(f"worker: {info['worker']}: {info['desc']} (ready in {time.monotonic() - t0:.1f} s)")
    if info.get("note"):
        print(f"worker: {info['note']}")
    result.update(
        worker=info["worker"],
        worker_info=info,
        worker_start_s=round(time.monotonic() - t0, 1),
        worker_pids=worker.pids,
        host={
            "cpus": os.cpu_count(),
            "kernel": os.uname().release,
            "disk_dir": disk_dir,
            "disk_dir_fs": fs_type(disk_dir),
        },
        config={
            "rounds": args.rounds,
            "window_s": args.window,
            "warmup_s": args.warmup,
            "settle_s": args.settle,
            "noise": kinds,
            "noise_processes": {k: {p: counts[p] for p in NOISE_PARTS[k]} for k in kinds},
            "profiles": [str(p) for p in args.profile],
            "conditions": conditions(args.profile, run_orders(args)),
            "shape": args.shape,
            "orders": list(run_orders(args)),
        },
        gputuned=[],
    )
    return {
        "args": args,
        "worker": worker,
        "children": children,
        "counts": counts,
        "disk_dir": disk_dir,
        "rule": rules,
        "wanted": wanted,
        "gputuned": gputuned,
        "gputuned_runs": result["gputuned"],
    }


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
