#!/usr/bin/env bash
# Run on the lent H200 machine: cgroup move cost (with and without favordynmods), CPU speed
# against the number of busy CPUs, and placement variants (docs/dev/benchmarks.md).
# Usage: bash scripts/device/explore.sh OUTDIR [NOISE] [ROUNDS] [PROFILE ...]
set -u
out=${1:?output directory}; noise=${2:-heavy,cpu}; rounds=${3:-2}; shift 3
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 60 python3 benchmarks/cgroup_move.py --moves 30 --try-favordynmods --json "$out/cgroup_move.json"
echo "cgroup_move exit $?"
timeout 90 python3 benchmarks/cpu_pairs.py --cpu 1 --seconds 0.7 --json "$out/cpu_pairs.json"
echo "cpu_pairs exit $?"
args=()
for p in "$@"; do args+=(--profile "$p"); done
timeout 420 python3 benchmarks/placement_variants.py --out "$out/pv" --noise "$noise" --rounds "$rounds" \
  --window 6 "${args[@]}"
echo "placement_variants exit $?"
