#!/usr/bin/env bash
# Run on the lent H200 machine: gputuned on a server that is a process tree (issue 13).
#
#   bash scripts/device/trees.sh OUTDIR nn [ROUNDS]     (about 6 min with 3 rounds)
#     benchmarks/noisy_neighbor.py --shape server: an API process that tokenises each request
#     and spawns the GPU-driving engine (multiprocessing spawn; it renames itself), heavy noise,
#     profiles/shared-host.toml's rule (its match narrowed to the benchmark's API process and
#     this account; what it does, children included, as shipped), ROUNDS rounds (default 3) of
#     both start orders: server first (the daemon's start places the running tree) and daemon
#     first (a new server started after the daemon is placed as it spawns). The benchmark takes
#     `capture --stable` before each daemon start and after each stop and compares them.
#   bash scripts/device/trees.sh OUTDIR checks          (about 4 min)
#     the live tree tests (a real spawn-based tree; an unprivileged user's processes get nothing
#     from the shipped rules), then benchmarks/reaction.py (apply/revert <= 50 ms, idle <= 0.1 %,
#     exec -> placed), with a capture --stable before and after everything.
set -u
out=${1:?output directory}; what=${2:?nn or checks}; rounds=${3:-3}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ctl() { python3 -m gputuned.cli "$@"; }
nproc; uname -r; nvidia-smi -L 2>/dev/null | head -2
rm -rf /tmp/cap-before /tmp/cap-after; ctl capture --stable /tmp/cap-before >/dev/null 2>&1
case "$what" in
nn)
  python3 benchmarks/noisy_neighbor.py --out "$out/nn-server" --shape server --worker gpu \
    --order both --noise heavy --rounds "$rounds" --window 8 --profile profiles/shared-host.toml
  echo "noisy_neighbor exit $?"
  python3 - "$out/nn-server/noisy_neighbor.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print("per daemon run: round order daemon-exit placed-after-s capture-equal host-back")
for g in doc.get("gputuned", []):
    print(f"  {g['round']} {g['order']:13} {g['exit_status']} {g['placed_after_s']} "
          f"{g['capture_equal']} {g['host_back']} {g['differences'][:2]} {g['capture_differences'][:2]}")
for noise, conds in doc.get("summary", {}).items():
    for cond, v in conds.items():
        print(f"  {noise} {cond:40} tok/s x {v['tok_s_x']['median']:.3f} "
              f"[{v['tok_s_x']['min']:.3f}-{v['tok_s_x']['max']:.3f}]  p99 x {v['p99_x']['median']:.3f} "
              f"[{v['p99_x']['min']:.3f}-{v['p99_x']['max']:.3f}]")
PY
  ;;
checks)
  echo "== live tree tests"
  python3 -m pytest -q -p no:cacheprovider -rs tests/integration/test_proctree_live.py \
    tests/integration/test_shipped_rules_live.py 2>&1 | tail -6
  echo "== reaction (apply/revert, idle, exec -> placed)"
  python3 benchmarks/reaction.py --profile profiles/shared-host.toml --starts 200 \
    --idle-seconds 60 --apply-rounds 20 --json "$out/reaction.json" 2>&1 | tail -20
  ;;
*) echo "unknown: $what (nn or checks)"; exit 2 ;;
esac
ctl capture --stable /tmp/cap-after >/dev/null 2>&1
echo "== capture diff (before vs after; capture --stable)"
diff -r /tmp/cap-before /tmp/cap-after && echo "captures identical"
