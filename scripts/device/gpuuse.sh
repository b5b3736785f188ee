#!/usr/bin/env bash
# Run on the lent H200 machine: what each "uses GPU N" signal says about a real CUDA process
# (issue 18, docs/multi-gpu.md "Which GPU a process uses"). A child process initialises CUDA
# (torch, else the driver API through ctypes) with CUDA_VISIBLE_DEVICES naming the GPU by
# UUID; then, read by gputuned's own code: NVML's index, UUID and minor number, the driver's
# /proc/driver/nvidia minor table, the child's open /dev/nvidia* nodes (major:minor), its
# environment mapped to GPUs, and the answer GpuUse gives. Read-only; the child is ended.
# Usage: bash scripts/device/gpuuse.sh OUTDIR
set -u
out=${1:?output directory}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
python3 - <<'PY' 2>&1 | tee "$out/gpuuse.txt"
import os, subprocess, sys, time
from gputuned.host import Host
from gputuned.kernel.gpuuse import device_minors, driver_minors, gpu_environ
from gputuned.kernel.nvml import read_gpus
from gputuned.kernel.pci import scan
from gputuned.kernel.system import read_host_cpus
from gputuned.tuners.gpuuse import gpu_use

host = Host("/")
nvml = read_gpus(host)
print("nvml:", [(g.index, g.bdf, g.uuid, g.minor) for g in nvml or []])
print("driver minors:", driver_minors(host))
if not nvml:
    sys.exit("NVML did not answer: nothing more to check here")
child = r'''
import ctypes, os, sys, time
try:
    import torch
    torch.zeros(1, device="cuda")
    how = "torch"
except Exception:
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    cuda.cuCtxSetCurrent(ctx)
    how = "libcuda"
print(how, flush=True)
time.sleep(600)
'''
env = {**os.environ, "CUDA_VISIBLE_DEVICES": nvml[-1].uuid or "0"}
p = subprocess.Popen([sys.executable, "-c", child], env=env, stdout=subprocess.PIPE, text=True)
print("child initialised CUDA with", p.stdout.readline().strip(), "; CUDA_VISIBLE_DEVICES =",
      env["CUDA_VISIBLE_DEVICES"])
time.sleep(1)
fd = f"/proc/{p.pid}/fd"
nodes = []
for n in os.listdir(fd):
    try:
        t = os.readlink(f"{fd}/{n}")
        if t.startswith("/dev/nvidia"):
            st = os.stat(f"{fd}/{n}")
            nodes.append((t, os.major(st.st_rdev), os.minor(st.st_rdev)))
    except OSError:
        pass
print("child's open nvidia nodes:", sorted(set(nodes)))
print("device_minors:", sorted(device_minors(host, p.pid)))
print("gpu_environ:", gpu_environ(host, p.pid))
nvml = read_gpus(host)  # again: the child's context is there now
print("nvml pids:", [(g.index, list(g.pids)) for g in nvml or []])
refs = read_host_cpus(host, scan(host, gpu_trees_only=True), nvml).gpus
use = gpu_use(host, refs, nvml)
print("GpuUse.of(child):", sorted(use.of(p.pid)), "opened" if p.pid in use.opened else "")
use_no_nvml = gpu_use(host, refs, None)
print("without NVML (device nodes + environment):", sorted(use_no_nvml.of(p.pid)),
      "unmapped:", use_no_nvml.unmapped.get(p.pid, ""))
p.kill()
p.wait()
PY
