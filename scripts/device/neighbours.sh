#!/usr/bin/env bash
# Run on the lent H200 machine: the neighbours' bill as a curve (issue 20, item 3;
# docs/dev/benchmarks.md "The neighbours' bill").
#
#   bash scripts/device/neighbours.sh OUTDIR [CAPS] [ROUNDS]     CAPS default "2,4,8,12"
#
# One noisy_neighbor.py run under heavy noise (burners, loopback TCP, fsync'd writes), the noise
# in a top-level cgroup of its own (nn-neighbours, as a real host's neighbours are in theirs),
# the GPU worker registered with the daemon: per block a clean window, untuned, the shipped
# shared-host (its [neighbours] report only: no cap), shared-host with [neighbours] cap_cpus =
# each of CAPS, reverted, clean again. Prints the curve: server tokens/s and p99 against clean,
# server gain against untuned, each neighbour metric's loss (1 - value / untuned value), and
# whether the loss stays within reserved / all CPUs. ~2 min a block with 4 caps and 8 s
# windows: ROUNDS=3 fits in about 7 minutes, bounded to LIMIT s (default 480).
# TRYOUT=1: the CPU stand-in and short windows (checks the script, measures nothing);
# NO_WHEELS=1: the python3 on PATH as it is (a development machine).
set -u
out=${1:?output directory}; caps=${2:-2,4,8,12}; rounds=${3:-3}
limit=${LIMIT:-480}; window=${WINDOW:-8}
mkdir -p "$out/profiles"
if [ -n "${NO_WHEELS:-}" ]; then ctl() { python3 -m gputuned.cli "$@"; }; else
  source scripts/device/common.sh
fi
profs=(--profile profiles/shared-host.toml)
for n in ${caps//,/ }; do
  f=$out/profiles/shared-host-cap$n.toml
  cat >"$f" <<TOML
# shared-host with its [neighbours] cap switched on at $n CPUs (scripts/device/neighbours.sh).
include = ["shared-host"]
name = "shared-host-cap$n"

[neighbours]
cap_cpus = $n
report_only = false
TOML
  profs+=(--profile "$f")
done
worker=(--worker gpu --window "$window"); [ -n "${TRYOUT:-}" ] && worker=(--worker cpu --window 0.6 --warmup 0.1 --settle 0.2)
reserved=$(ctl plan profiles/shared-host.toml --json 2>/dev/null | python3 -c \
  'import json,sys; from gputuned.cpulist import parse_cpulist as p; print(len(p(json.load(sys.stdin)["cpusets"]["inference"])))' 2>/dev/null || echo 8)
cap=$(mktemp -d /tmp/nb-cap.XXXXXX)
ctl capture --stable "$cap/before" >/dev/null 2>&1
echo "== neighbours curve: caps $caps + shipped (no cap), $rounds round(s), heavy noise; partition $reserved of $(nproc) CPUs; ${limit} s"
timeout --kill-after=20 "$limit" python3 benchmarks/noisy_neighbor.py --out "$out/nn" --noise heavy \
  --rounds "$rounds" --register-only --noise-cgroup nn-neighbours --keep-latencies \
  "${worker[@]}" "${profs[@]}" >"$out/nn.log" 2>&1
echo "noisy_neighbor exit $? (at ${SECONDS} s); every window in $out/nn.log"
grep -E "^(noise|heavy|neighbours' bill|goal|host back|WARNING)" "$out/nn.log" | tail -30
python3 benchmarks/neighbours_curve.py "$out/nn/noisy_neighbor.json" --reserved "$reserved" --cpus "$(nproc)"
python3 benchmarks/neighbours_curve.py "$out/nn/noisy_neighbor.json" --reserved "$reserved" --cpus "$(nproc)" --json >"$out/curve.json"
ctl capture --stable "$cap/after" >/dev/null 2>&1
echo "== capture diff (before vs after; capture --stable)"
diff -r "$cap/before" "$cap/after" >/dev/null && echo "captures identical" || diff -rq "$cap/before" "$cap/after" | head
test -d /sys/fs/cgroup/nn-neighbours && echo "WARNING: /sys/fs/cgroup/nn-neighbours left" || echo "noise cgroup removed"
rm -rf "$cap"
echo "== done at ${SECONDS} s"
