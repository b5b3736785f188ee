#!/usr/bin/env bash
# Run on the lent H200 machine: one slice of the six-scenario matrix (issue 20, item 2;
# benchmarks/matrix.py, docs/dev/benchmarks.md "matrix.py: the six-scenario matrix").
#
#   bash scripts/device/matrix.sh OUTDIR SLICE BLOCKS [SHAPE ...]
#
# SLICE: heavy (heavy noise: untuned, gputuned, pinned by hand), others (baseline, cpu, net,
# disk: untuned and gputuned), all, or scenarios comma-separated (heavy,pinned,baseline).
# BLOCKS: paired blocks per scenario (heavy's verdict needs 6, the others' 2).
# SHAPE: single (default: the one-process GPU worker, registered), server (the server-shaped
# worker, both start orders), server-first or daemon-first; several run one after the other.
#
# Bounded to LIMIT seconds (default 540: a call's 10 minutes less a margin) from its start:
# each shape gets what is left, the benchmark skips blocks that would end past its deadline
# (and says which), a shape with under 100 s left is skipped (said too), and `timeout` ends a
# run that overruns (SIGTERM: it stops its processes, the daemon reverts, the JSON of the
# finished blocks is written). Timing with 8 s windows (WINDOW=8), GPU worker: ~35 s to start
# a worker; a heavy block, single shape, ~56 s (5 windows and a daemon start); an "others"
# block ~45 s; the server shape with both orders adds a window and a fresh server (~40 s) per
# block. So: heavy 6 single ~6.5 min; others 2 single ~6.5 min; heavy 3 server ~6.5 min.
#
# Writes OUTDIR/matrix-SLICE-SHAPE/matrix.json (a "," of SLICE as "-": the device tool does not
# copy back a name with a comma; every window's tokens kept, for --merge) and matrix.png; prints
# each run's table; `capture --stable` before and after must be identical.
# Blocks of several calls are pooled with
#   python3 benchmarks/matrix.py --merge OUT1/.../matrix.json OUT2/.../matrix.json
# TRYOUT=1: the CPU stand-in and sub-second windows (checks the script, measures nothing);
# NO_WHEELS=1: use the python3 on PATH as it is (a development machine).
set -u
out=${1:?output directory}; slice=${2:?heavy, others, all or scenarios}; blocks=${3:?blocks}
shift 3
shapes=("$@"); [ ${#shapes[@]} -eq 0 ] && shapes=(single)
limit=${LIMIT:-540}; window=${WINDOW:-8}
case "$slice" in
heavy) scenarios=heavy,pinned ;;
others) scenarios=baseline,cpu,net,disk ;;
all) scenarios=baseline,cpu,net,disk,heavy,pinned ;;
*) scenarios=$slice ;;
esac
mkdir -p "$out"
if [ -n "${NO_WHEELS:-}" ]; then ctl() { python3 -m gputuned.cli "$@"; }; else
  source scripts/device/common.sh
fi
worker=(--worker gpu --window "$window"); [ -n "${TRYOUT:-}" ] && worker=(--try-out)
cap=$(mktemp -d /tmp/matrix-cap.XXXXXX)
ctl capture --stable "$cap/before" >/dev/null 2>&1
echo "== matrix $scenarios, $blocks block(s), shapes ${shapes[*]}; ${limit} s from now (at ${SECONDS} s)"
for shape in "${shapes[@]}"; do
  case "$shape" in
  single) how=(--register-only) ;;  # as noisy_neighbor.py --register-only: only the worker placed
  server) how=(--shape server --order both) ;;
  server-first | daemon-first) how=(--shape server --order "$shape") ;;
  *) echo "unknown shape $shape (single, server, server-first, daemon-first)"; exit 2 ;;
  esac
  left=$((limit - 25 - SECONDS))  # 25 s kept for the last capture and the summary
  if [ "$left" -lt 100 ]; then
    echo "== $shape skipped: ${left} s left, a worker start and one block need about 100"
    continue
  fi
  echo "== $shape (at ${SECONDS} s, ${left} s left)"
  # The benchmark's deadline leaves 20 s to stop the worker and the noise after its last block.
  dir=$out/matrix-${slice//,/-}-$shape
  mkdir -p "$dir"
  timeout --kill-after=20 "$left" python3 benchmarks/matrix.py --out "$dir" \
    --scenarios "$scenarios" --blocks "$blocks" --deadline $(($(date +%s) + left - 20)) \
    --keep-latencies --profile profiles/shared-host.toml "${worker[@]}" "${how[@]}" \
    >"$dir/matrix.log" 2>&1
  echo "matrix $shape exit $? (at ${SECONDS} s); every window in $dir/matrix.log"
  grep -v '^  round ' "$dir/matrix.log" | tail -30
  if ! grep -q '^| scenario ' "$dir/matrix.log" && [ -f "$dir/matrix.json" ]; then
    echo "(cut short: the table of the blocks it finished)"  # matrix.json is written in any case
    python3 benchmarks/matrix.py --out "$dir/finished" --merge "$dir/matrix.json" 2>&1 | tail -20
  fi
done
ctl capture --stable "$cap/after" >/dev/null 2>&1
echo "== capture diff (before vs after; capture --stable)"
diff -r "$cap/before" "$cap/after" >/dev/null && echo "captures identical" || diff -rq "$cap/before" "$cap/after" | head
rm -rf "$cap"
echo "== done at ${SECONDS} s"
