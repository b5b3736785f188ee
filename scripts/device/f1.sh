#!/usr/bin/env bash
# Run on the lent H200 machine: finding F1 (docs/dev/reliability.md) on its real kernel. Touches
# cgroups only (a neighbour partition and a probe cgroup of its own, both removed at the end):
# no PCIe register, clock, IRQ or process setting is written. Under 60 s.
#
# A neighbour cgroup holds 2 of the CPUs shared-host.toml's partition would take, as a valid
# root partition. Checked, one PASS/FAIL line each: gputunectl plan refuses (exit 4, naming the
# neighbour); gputunectl apply refuses (exit 4) and writes nothing (no journal, no cgroup of
# gputuned's, capture --stable unchanged); the neighbour stays a valid root partition; and this
# kernel refuses an exclusive claim on its CPUs (the write gputuned now makes first) with the
# neighbour untouched. Then the neighbour is removed and the root cpuset is as before.
# Usage: bash scripts/device/f1.sh OUTDIR   (wheels for pydantic & co. in .whl/)
# The QEMU lane runs it in its guest too (tests/e2e/test_vm.py), with GPUTUNECTL=gputunectl
# (an installed gputunectl instead of the wheels) and F1_PROFILE (its own profile).
set -u
out=${1:?output directory}
if [ -n "${GPUTUNECTL:-}" ]; then
  ctl() { "$GPUTUNECTL" "$@"; }
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  ctl() { python3 -m gputuned.cli "$@"; }
fi
CG=/sys/fs/cgroup
N=$CG/f1-neighbour
P=$CG/f1-probe
PROFILE=${F1_PROFILE:-profiles/shared-host.toml}
JOURNAL=/run/gputuned/journal.jsonl
pass=0 fail=0 enabled_cpuset=0 had_journal=0
ok() { echo "PASS $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
expect() {  # expect DESCRIPTION COMMAND...: PASS when the command succeeds
  local what=$1; shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
part() { tr -d '\n' <"$1/cpuset.cpus.partition" 2>/dev/null; }

cleanup() {
  [ -d "$P" ] && rmdir "$P"
  if [ -d "$N" ]; then
    echo member >"$N/cpuset.cpus.partition" 2>/dev/null
    rmdir "$N" || echo "could not remove $N"
  fi
  if [ -e "$JOURNAL" ] && [ "$had_journal" = 0 ]; then
    echo "a journal appeared: reverting what gputuned wrote"; ctl revert
  fi
  [ "$enabled_cpuset" = 1 ] && echo -cpuset >"$CG/cgroup.subtree_control"
}
trap cleanup EXIT

echo "== host"; uname -r; nproc
[ -e "$JOURNAL" ] && had_journal=1
if [ "$had_journal" = 1 ] || [ -e /run/gputuned/control.sock ]; then
  echo "gputuned is applied or running here ($JOURNAL or its control socket): not touching it"
  exit 2
fi
if [ -e "$N" ] || [ -e "$P" ] || [ -e "$CG/gputuned.inference" ]; then
  echo "$N, $P or $CG/gputuned.inference exists already: remove it first"; exit 2
fi
expect "cgroup v2 with cpuset and cpuset.cpus.exclusive (Linux 6.7+)" \
  test -e "$CG/cpuset.cpus.isolated"
if ! grep -qw cpuset "$CG/cgroup.subtree_control"; then
  echo +cpuset >"$CG/cgroup.subtree_control" && enabled_cpuset=1
fi
root_before=$(cat "$CG/cpuset.cpus.effective")
echo "root cpuset.cpus.effective: $root_before"

echo "== plan without a neighbour: which CPUs the partition takes"
ctl plan "$PROFILE" --json >"$out/f1-plan-clear.json"; rc=$?
expect "plan without a neighbour exits 0 (got $rc)" test "$rc" = 0
read -r SET NC < <(python3 - "$out/f1-plan-clear.json" "$PROFILE" <<'PY'
import json, sys, tomllib
plan = json.load(open(sys.argv[1]))
name = tomllib.load(open(sys.argv[2], "rb"))["cpuset"]["cpus"]
cpus = []
for part in plan["cpusets"][name].split(","):
    a, _, b = part.partition("-")
    cpus += range(int(a), int(b or a) + 1)
two = sorted(cpus)[:2]
print(plan["cpusets"][name], ",".join(map(str, two)))
PY
)
echo "partition set: $SET; the neighbour takes $NC"
expect "the partition set has at least 2 CPUs" test -n "$NC" -a "${NC#*,}" != "$NC"

echo "== a neighbour: valid root partition on $NC"
mkdir "$N" && echo "$NC" >"$N/cpuset.cpus" && echo "$NC" >"$N/cpuset.cpus.exclusive" &&
  echo root >"$N/cpuset.cpus.partition"
expect "neighbour is a valid root partition ($(part "$N"))" test "$(part "$N")" = root
xeff=$(cat "$N/cpuset.cpus.exclusive.effective")
echo "neighbour exclusive.effective: $xeff; root effective now: $(cat $CG/cpuset.cpus.effective)"

echo "== gputunectl plan: refused"
ctl plan "$PROFILE" >"$out/f1-plan.txt" 2>&1; rc=$?
grep -E "^(blocked|apply refuses)" -A3 "$out/f1-plan.txt"
expect "plan exits 4 (got $rc)" test "$rc" = 4
expect "plan names the neighbour in a 'blocked' line" grep -q "held by another valid partition: $N" "$out/f1-plan.txt"
ctl plan "$PROFILE" --json >"$out/f1-plan.json"
expect "plan --json: blocked, a blocking cpuset refusal naming $N" python3 - "$out/f1-plan.json" "$N" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
rs = [r for r in p["refused"] if r["blocking"]]
print("  blocking:", [f'{r["tuner"]} {r["target"]}' for r in rs])
sys.exit(0 if p["blocked"] and len(rs) == 1 and rs[0]["tuner"] == "cpuset" and sys.argv[2] in rs[0]["reason"] else 1)
PY

echo "== gputunectl apply: refused, nothing written"
rm -rf /tmp/f1-before /tmp/f1-after
ctl capture --stable /tmp/f1-before >/dev/null 2>&1
ctl apply "$PROFILE" >"$out/f1-apply.txt" 2>&1; rc=$?
head -c 600 "$out/f1-apply.txt"; echo
expect "apply exits 4 (got $rc)" test "$rc" = 4
expect "apply says nothing was changed" grep -q "cannot be applied on this host; nothing was changed" "$out/f1-apply.txt"
expect "no journal ($JOURNAL)" test ! -e "$JOURNAL"
expect "no $CG/gputuned.inference" test ! -e "$CG/gputuned.inference"
expect "neighbour still a valid root partition ($(part "$N"))" test "$(part "$N")" = root
expect "neighbour still holds $xeff" test "$(cat "$N/cpuset.cpus.exclusive.effective")" = "$xeff"
ctl capture --stable /tmp/f1-after >/dev/null 2>&1
diff -r /tmp/f1-before /tmp/f1-after >"$out/f1-capture.diff"
expect "capture --stable before and after apply identical" test ! -s "$out/f1-capture.diff"

echo "== this kernel and the new write order: the exclusive claim first"
mkdir "$P"
err=$( { echo "$SET" >"$P/cpuset.cpus.exclusive"; } 2>&1 ); rc=$?
echo "echo $SET > $P/cpuset.cpus.exclusive: rc $rc ${err:-ok}"
expect "kernel refuses the claim on the neighbour's CPUs" test "$rc" != 0
expect "neighbour still a valid root partition ($(part "$N"))" test "$(part "$N")" = root
rmdir "$P"

echo "== remove the neighbour"
echo member >"$N/cpuset.cpus.partition" && rmdir "$N"
expect "neighbour removed" test ! -e "$N"
expect "root cpuset.cpus.effective back to $root_before" test "$(cat $CG/cpuset.cpus.effective)" = "$root_before"

echo "f1: $pass passed, $fail failed" | tee "$out/f1-summary.txt"
[ "$fail" = 0 ]
