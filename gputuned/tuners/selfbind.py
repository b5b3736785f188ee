"""Servers that set their own CPUs: which engine flags make a process bind itself, and the plan's
warning for a process a rule places on CPUs (the daemon's side, backing off once such a process
has undone gputuned's CPUs twice, is :mod:`gputuned.daemon.selfbind`).

What each engine does, read from its source (the commits named are those read):

- **vLLM** (vllm-project/vllm, ``vllm/config/parallel.py`` at 00193b82, ``ParallelConfig``):
  ``numa_bind: bool = False``, the flag ``--numa-bind`` (``--no-numa-bind`` turns it off again);
  ``--numa-bind-nodes`` / ``--numa-bind-cpus`` choose the nodes or CPUs and take effect with it.
  Each GPU worker is then started through ``numactl --cpunodebind`` (or ``--physcpubind``)
  wrapped around the Python executable (``vllm/utils/numa_utils.py`` at b893b369).
- **SGLang** (sgl-project/sglang, ``python/sglang/srt/utils/numa_utils.py`` at 008b79d2,
  ``get_numa_node_if_available``): each scheduler process is started through ``numactl`` on
  the node given by ``--numa-node`` (one per GPU), or, without it, on its GPU's node when
  ``SGLANG_AUTO_NUMA_BIND`` is on and the host has a second node (``/sys/devices/system/node/
  node1``). Its default differs between versions of ``python/sglang/srt/environ.py``: the
  newest read (section "NUMA and CPU affinity") has ``EnvBool(True)``, earlier ones ``False``
  (and the oldest no such variable); gputuned cannot tell the version running, so an unset
  variable counts as on. No server argument turns the automatic binding off;
  ``SGLANG_AUTO_NUMA_BIND=0`` does. ``SGLANG_SET_CPU_AFFINITY=1`` (off by default) makes each
  scheduler set its own affinity (``sched_setaffinity``) as well.
- **TensorRT-LLM** (NVIDIA/TensorRT-LLM, ``docs/source/deployment-guide/
  configuring-cpu-affinity.md`` at fd5169a3): ``TLLM_NUMA_AWARE_WORKER_AFFINITY`` unset: each
  worker sets NUMA-aware CPUs on itself when its affinity is unconstrained and *clears* an
  affinity set from outside (gputuned's); ``1``: always sets them; ``0`` or any other value:
  leaves the affinity as it is.

Only the matched process of a rule is looked at (a spawned worker's command line names no
flags; it inherits its parent's environment). Command line and environment are any user's to
write: the command line is the first 4096 bytes the scan read, split on spaces, at most
:data:`MAX_TOKENS` tokens, compared as plain strings (no pattern); the environment is read
through :func:`gputuned.kernel.gpuuse.environ_values` (bounded, printable values only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from gputuned import errors
from gputuned.kernel.gpuuse import environ_values
from gputuned.kernel.proc import ProcInfo, read_process
from gputuned.textsafe import printable
from gputuned.tuners.context import Claim, PlanContext

#: Command-line tokens looked at: flags sit among the first few hundred.
MAX_TOKENS = 512
#: The environment variables that decide whether an engine binds itself.
VARIABLES = ("SGLANG_AUTO_NUMA_BIND", "SGLANG_SET_CPU_AFFINITY", "TLLM_NUMA_AWARE_WORKER_AFFINITY")
_FALSE = ("0", "false", "no", "n")  # SGLang's EnvBool (environ.py): anything else set is an error
_TRUE = ("1", "true", "yes", "y")

FIX = {
    "vLLM": "start it without --numa-bind",
    "SGLang": (
        "start it without --numa-node and with SGLANG_AUTO_NUMA_BIND=0 in its environment "
        "(no server argument turns the automatic binding off)"
    ),
    "TensorRT-LLM": "set TLLM_NUMA_AWARE_WORKER_AFFINITY=0 in its environment",
}


def engine_of(tokens: list[str]) -> str | None:
    """vLLM, SGLang or TensorRT-LLM, by the program the command line runs: the executable
    itself, or, for a Python interpreter, its script or ``-m`` module (options skipped)."""
    i = 0
    if tokens and tokens[0].rpartition("/")[2].startswith("python"):
        i = 1
        while i < len(tokens) and tokens[i].startswith("-"):
            if tokens[i] == "-m":
                rest = [*tokens[i + 1 : i + 3], "", ""]
                return _engine(rest[0], rest[1])
            i += 2 if tokens[i] in ("-X", "-W", "-c") else 1
    if i >= len(tokens):
        return None
    return _engine(tokens[i].rpartition("/")[2], tokens[i + 1] if i + 1 < len(tokens) else "")


def _engine(name: str, nxt: str) -> str | None:
    if name.startswith("vllm.entrypoints") or name in ("vllm", "vllm.__main__"):
        return "vLLM" if name != "vllm" or nxt == "serve" or nxt.startswith("-") else None
    if name.startswith(("sglang.launch_server", "sglang.srt")) or (
        name == "sglang" and nxt == "serve"
    ):
        return "SGLang"
    if name in ("trtllm-serve", "trtllm-bench", "trtllm-llmapi-launch") or name.startswith(
        "tensorrt_llm"
    ):
        return "TensorRT-LLM"
    return None


def binds_itself(cmdline: str, env: Mapping[str, str], nodes: int) -> tuple[str, str] | None:
    """(engine, why) when a process with this command line and environment will set its own
    CPUs on a host with ``nodes`` NUMA nodes; None when it will not (or is no engine known)."""
    tokens = cmdline.split(" ", MAX_TOKENS)[:MAX_TOKENS]
    engine = engine_of(tokens)
    if engine == "vLLM":
        on = False
        for tok in tokens:  # argparse: the last of --numa-bind / --no-numa-bind wins
            if tok == "--numa-bind":
                on = True
            elif tok == "--no-numa-bind":
                on = False
        return (engine, "--numa-bind") if on else None
    if engine == "SGLang":
        if "--numa-node" in tokens or any(t.startswith("--numa-node=") for t in tokens):
            return engine, "--numa-node"
        if env.get("SGLANG_SET_CPU_AFFINITY", "").lower() in _TRUE:
            return engine, "SGLANG_SET_CPU_AFFINITY=1"
        auto = env.get("SGLANG_AUTO_NUMA_BIND")
        if nodes > 1 and (auto is None or auto.lower() not in _FALSE):
            shown = "unset" if auto is None else f"={printable(auto[:16])}"
            return engine, f"automatic NUMA binding, SGLANG_AUTO_NUMA_BIND {shown}, {nodes} nodes"
        return None
    if engine == "TensorRT-LLM":
        value = env.get("TLLM_NUMA_AWARE_WORKER_AFFINITY")
        if value is None:
            return engine, "TLLM_NUMA_AWARE_WORKER_AFFINITY unset: it clears CPUs set from outside"
        if value == "1":
            return engine, "TLLM_NUMA_AWARE_WORKER_AFFINITY=1"
    return None


def _binding(ctx: PlanContext, proc: ProcInfo, claim: Claim) -> tuple[str, str, str] | None:
    """(rule's self_binding, engine, why) for one claimed process that will bind itself, or
    None: only a matched process of a rule that sets CPUs counts (with ``cpus = "keep"``
    nobody fights over them)."""
    rule = next((r for r in ctx.profile.process if r.name == claim.rule), None)
    if rule is None or claim.role != "match" or rule.cpus == "keep":
        return None
    env = environ_values(ctx.kernel, proc.pid, VARIABLES)
    found = binds_itself(proc.cmdline, env, len(ctx.cpus.numa) or 1)
    return None if found is None else (rule.self_binding, *found)


def binding_notes(ctx: PlanContext, claims: Mapping[int, Claim]) -> list[str]:
    """The plan's warning for each claimed process of ``ctx.processes`` that will bind itself:
    what the daemon will do about it, and how to turn the engine's binding off."""
    notes: list[str] = []
    for proc in ctx.processes:
        c = claims.get(proc.pid)
        found = _binding(ctx, proc, c) if c is not None and c.start == proc.start_time else None
        if c is None or found is None:
            continue
        mode, engine, why = found
        if mode == "respect":
            then = (
                'self_binding = "respect": once it has set its CPUs back twice right after '
                "gputuned set them, the daemon leaves its CPUs to it (nice and IRQs still applied)"
            )
        else:
            then = (
                'self_binding = "override": the daemon puts the rule\'s CPUs back at every '
                "drift check, and the two may keep undoing each other"
            )
        notes.append(
            f"process[{c.rule}]: pid {proc.pid} ({printable(proc.comm)}) will bind its own "
            f"CPUs ({engine}: {why}); {then}. To have gputuned place it, {FIX[engine]}"
        )
    return notes


def warnings_for(
    ctx: PlanContext, claims: Mapping[int, Claim], pids: Iterable[int]
) -> dict[int, str]:
    """The daemon's :func:`binding_notes` for some processes (new ones, or every claimed one
    after a full apply), by PID: each matched one is read again, briefly."""
    out: dict[int, str] = {}
    for pid in pids:
        c = claims.get(pid)
        if c is None or c.role != "match":
            continue
        try:
            proc = read_process(ctx.kernel, pid, threads=False, brief=True)
        except (errors.TargetGone, errors.PermissionDenied):
            continue
        notes = binding_notes(dataclasses.replace(ctx, processes=[proc]), claims)
        if notes:
            out[pid] = notes[0]
    return out
