#!/usr/bin/env bash
# Run on the lent H200 machine: what the host's idle states, steal time and /run look like,
# then benchmarks/placement_variants.py and benchmarks/reaction.py (docs/dev/benchmarks.md).
# Usage: bash scripts/device/diag.sh OUTDIR [NOISE] [ROUNDS]
set -u
out=${1:?output directory}; noise=${2:-heavy,cpu}; rounds=${3:-2}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{
  echo "== idle"
  for f in /sys/devices/system/cpu/cpuidle/*; do echo "$f: $(cat "$f" 2>&1)"; done
  for s in /sys/devices/system/cpu/cpu1/cpuidle/state*; do
    [ -d "$s" ] && echo "$s: $(cat "$s/name") latency=$(cat "$s/latency") usage=$(cat "$s/usage") disable=$(cat "$s/disable")"
  done
  echo "pm_qos cpu1: $(cat /sys/devices/system/cpu/cpu1/power/pm_qos_resume_latency_us 2>&1)"
  grep -H . /sys/module/haltpoll/parameters/* 2>&1
  ls /sys/module | grep -i -E "idle|haltpoll|kvm" ; grep -H . /sys/devices/system/cpu/cpu1/topology/* 2>&1
  echo "== /run: $(findmnt -no FSTYPE,SOURCE /run) /var/tmp: $(findmnt -no FSTYPE,SOURCE -T /var/tmp)"
  python3 - <<'PY'
import os, time, statistics
for d in ("/run", "/var/tmp"):
    p = f"{d}/fsync-probe"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    ts = []
    for _ in range(100):
        t = time.perf_counter(); os.write(fd, b"x" * 200); os.fsync(fd); ts.append((time.perf_counter() - t) * 1e3)
    os.close(fd); os.unlink(p)
    print(f"fsync {d}: median {statistics.median(ts):.3f} ms, max {max(ts):.3f} ms")
PY
  echo "== steal (cpu line of /proc/stat): $(head -1 /proc/stat)"
  uptime; nproc; nvidia-smi --query-gpu=name,utilization.gpu --format=csv,noheader
} > "$out/env.txt" 2>&1
cat "$out/env.txt"
timeout 60 python3 benchmarks/cpu_pairs.py --cpu 1 --seconds 0.7 --json "$out/cpu_pairs.json"
timeout 360 python3 benchmarks/placement_variants.py --out "$out/pv" --noise "$noise" --rounds "$rounds" --window 6
echo "placement_variants exit $?"
timeout 170 python3 benchmarks/reaction.py --json "$out/reaction.json"
echo "reaction exit $?"
