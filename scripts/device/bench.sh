#!/usr/bin/env bash
# Run on the lent H200 machine: the noisy-neighbour benchmark (docs/dev/benchmarks.md).
# Usage: bash scripts/device/bench.sh OUTDIR NOISE [PROFILE ...]   e.g. heavy profiles/shared-host.toml
set -u
out=${1:?output directory}; noise=${2:?noise kinds}; shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
args=()
for p in "$@"; do args+=(--profile "$p"); done
python3 benchmarks/noisy_neighbor.py --out "$out/nn" --noise "$noise" --rounds 3 --window 8 "${args[@]}"
