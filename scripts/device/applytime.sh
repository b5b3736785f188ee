#!/usr/bin/env bash
# Run on the lent H200 machine: where a full-profile apply spends its time (docs/dev/benchmarks.md,
# "Apply and revert"). Applies and reverts shared-host.toml for real (cgroups, IRQ affinity,
# the favordynmods remount; PCIe tuners report-only there), then checks the host is as before.
# Usage: bash scripts/device/applytime.sh OUTDIR [NAME=TREE ...]
#   Each round times this checkout ("this") and every other checkout TREE (a variant of
#   gputuned) the same way, interleaved: back to back (15 rounds) and lone (--gap 1: each
#   apply and revert after a second's pause, as a user's one-shot apply), then without
#   favordynmods, and a cProfile of this checkout.
set -u
out=${1:?output directory}; shift
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
here=$PWD
trees=("this=$here" "$@")
ctl() { PYTHONPATH=/tmp/site:$here python3 -m gputuned.cli "$@"; }
ar() {  # ar TREE LABEL PROFILE ARGS...: benchmarks/apply_revert.py of TREE
  local tree=$1 label=$2 profile=$3; shift 3
  echo "== $label"
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree python3 "$here/benchmarks/apply_revert.py" \
    "$profile" --breakdown --json "$out/$label.json" "$@")
}
nproc; uname -r
rm -rf /tmp/cap-before /tmp/cap-after; ctl capture --stable /tmp/cap-before >/dev/null 2>&1
sed 's/^favordynmods = true/favordynmods = false/' profiles/shared-host.toml >/tmp/nofav.toml
grep -n '^favordynmods' /tmp/nofav.toml
for i in 1 2; do
  for t in "${trees[@]}"; do
    ar "${t#*=}" "${t%%=*}-$i" "$here/profiles/shared-host.toml" --rounds 15
    ar "${t#*=}" "${t%%=*}-lone-$i" "$here/profiles/shared-host.toml" --rounds 6 --gap 1
  done
done
ar "$here" "this-nofav" /tmp/nofav.toml --rounds 15
PYTHONPATH=/tmp/site:$here python3 -m cProfile -o "$out/apply.prof" \
  benchmarks/apply_revert.py profiles/shared-host.toml --rounds 15 | head -1
ctl capture --stable /tmp/cap-after >/dev/null 2>&1
echo "== capture diff (before vs after; capture --stable)"
diff -r /tmp/cap-before /tmp/cap-after && echo "captures identical"
