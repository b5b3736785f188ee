#!/usr/bin/env bash
# Run on the lent H200 machine: the topology gputunectl inspect reads (NUMA nodes, SMT
# siblings, per GPU its node, sysfs local_cpulist and NVML's nvmlDeviceGetCpuAffinity) next to
# what nvidia-smi and sysfs say themselves, and the per-GPU plan of each shipped profile
# (read-only: plan writes nothing). docs/multi-gpu.md.
# Usage: bash scripts/device/topology.sh OUTDIR
set -u
out=${1:?output directory}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ctl() { python3 -m gputuned.cli "$@"; }
{
  echo "== sysfs"
  grep -H . /sys/devices/system/node/node*/cpulist /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>&1 | head -40
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor")" = 0x10de ] && grep -H . "$d/numa_node" "$d/local_cpulist"
  done
  echo "== nvidia-smi topo -m"
  nvidia-smi topo -m 2>&1
  echo "== gputunectl inspect (topology)"
  ctl inspect
  ctl inspect --json >"$out/inspect.json"
  python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['topology'], indent=1))" "$out/inspect.json"
  for p in shared-host dedicated-inference latency-critical; do
    echo "== gputunectl plan profiles/$p.toml"
    ctl plan "profiles/$p.toml" | sed -n '1,/change(s)/p'
  done
} 2>&1 | tee "$out/topology.txt"
