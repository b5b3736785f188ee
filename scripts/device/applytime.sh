#!/usr/bin/env bash
# Run on the lent H200 machine: where a full-profile apply spends its time (docs/benchmarks.md,
# "Apply and revert"). Applies and reverts shared-host.toml for real (cgroups, IRQ affinity,
# the favordynmods remount; PCIe tuners report-only there), then checks the host is as before.
# Usage: bash scripts/device/applytime.sh OUTDIR [OTHER_TREE]
#   OTHER_TREE: a second checkout (a variant of gputuned) timed the same way, interleaved.
set -u
out=${1:?output directory}; other=${2:-}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
here=$PWD
ctl() { PYTHONPATH=/tmp/site:$here python3 -m gputuned.cli "$@"; }
ar() {  # ar TREE LABEL ARGS...: benchmarks/apply_revert.py of TREE
  local tree=$1 label=$2; shift 2
  echo "== $label"
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree python3 "$here/benchmarks/apply_revert.py" \
    "$here/profiles/shared-host.toml" --breakdown --json "$out/$label.json" "$@")
}
nproc; uname -r
rm -rf /tmp/cap-before /tmp/cap-after; ctl capture --stable /tmp/cap-before >/dev/null 2>&1
sed 's/^favordynmods = true/favordynmods = false/' profiles/shared-host.toml >/tmp/nofav.toml
grep -n '^favordynmods' /tmp/nofav.toml
for i in 1 2; do
  ar "$here" "shipped-$i" --rounds 15
  [ -n "$other" ] && ar "$other" "other-$i" --rounds 15
  echo "== nofav-$i"
  PYTHONPATH=/tmp/site:$here python3 benchmarks/apply_revert.py /tmp/nofav.toml --breakdown \
    --rounds 15 --json "$out/nofav-$i.json"
done
ar "$here" "gap" --rounds 6 --gap 1
PYTHONPATH=/tmp/site:$here python3 -m cProfile -o "$out/apply.prof" \
  benchmarks/apply_revert.py profiles/shared-host.toml --rounds 15 | head -1
ctl capture --stable /tmp/cap-after >/dev/null 2>&1
echo "== capture diff (before vs after; capture --stable)"
diff -r /tmp/cap-before /tmp/cap-after && echo "captures identical"
