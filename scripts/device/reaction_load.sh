#!/usr/bin/env bash
# Run on the lent H200 machine: exec -> placed under load (issue 20, item 1; docs/dev/benchmarks.md).
#
#   bash scripts/device/reaction_load.sh OUTDIR [BASE_DIR]        (about 7 minutes)
#
# benchmarks/reaction.py with the shipped profiles/shared-host.toml, the daemon at nice -10 as
# the systemd unit runs it, 100 starts quiet and 100 under the heavy mix (a burner per CPU,
# CPUs/4 loopback TCP streams, CPUs/8 fsync'd writers, on the root file system like /run)
# per run, --breakdown (where each start's time goes). Two rounds of this checkout's gputuned,
# so >= 200 starts per noise kind; with BASE_DIR (a folder holding another version's gputuned/
# package, e.g. main's: mkdir base-main && git archive main gputuned | tar -x -C base-main)
# each round also runs that version first, interleaved. Then one quiet run with apply/revert
# (10 rounds) and 30 s of idle CPU, and two runs of this checkout at SCHED_FIFO 1: the profile
# with [daemon] realtime_priority = 1 (the daemon sets it for its event thread; the kernel may
# refuse it in a cgroup without RT budget: its log says so and it runs on), and set from outside
# after moving the daemon to the cgroup v2 root (what the class gives where it is allowed).
# Runs past 450 s are skipped. Each run writes OUTDIR/reaction-NAME.json; the summary pools the rounds.
# A capture --stable before and after must be identical.
set -u
out=${1:?output directory}; base=${2:-}
mkdir -p "$out"
source scripts/device/common.sh
findmnt -no FSTYPE,OPTIONS -T /run; findmnt -no FSTYPE,OPTIONS -T /tmp
rm -rf /tmp/cap-before /tmp/cap-after; ctl capture --stable /tmp/cap-before >/dev/null 2>&1
react() {  # react NAME ARGS...: one benchmarks/reaction.py run, bounded in time
  local name=$1; shift
  if [ "$SECONDS" -gt 450 ]; then echo "== $name skipped: ${SECONDS} s gone"; return; fi
  echo "== $name (at ${SECONDS} s)"
  timeout 140 python3 benchmarks/reaction.py --profile profiles/shared-host.toml \
    --daemon-nice -10 --breakdown --json "$out/reaction-$name.json" "$@" 2>&1 | tail -40
  echo "reaction $name exit ${PIPESTATUS[0]}"
}
n=${STARTS:-100}  # starts per noise kind and run (STARTS=10 for a try-out)
quick=(--idle-seconds 0 --apply-rounds 0 --starts "$n" --noise none,heavy --blocks 2)
for r in 1 2; do
  if [ -n "$base" ] && [ -d "$base/gputuned" ]; then
    react "base-$r" "${quick[@]}" --daemon-tree "$base"
  fi
  react "this-$r" "${quick[@]}"
done
react "this-checks" --idle-seconds 30 --apply-rounds 10 --starts "$n" --noise none
{ cat profiles/shared-host.toml; printf '\n[daemon]\nrealtime_priority = 1\n'; } >/tmp/rt.toml
react "this-rt" "${quick[@]}" --profile /tmp/rt.toml
react "this-fifo-root" "${quick[@]}" --daemon-policy fifo-root:1
python3 - "$out" <<'PY'
import glob, json, os, sys
from collections import defaultdict

def pct(xs, q):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q / 100 * len(xs)))], 2) if xs else None

pooled = defaultdict(lambda: defaultdict(list))
for path in sorted(glob.glob(os.path.join(sys.argv[1], "reaction-*.json"))):
    name = os.path.basename(path)[len("reaction-"):-len(".json")]
    doc = json.load(open(path))
    group = name.rsplit("-", 1)[0] if name[-1].isdigit() else name
    for kind, ex in doc.get("exec_to_placed", {}).items():
        for run in ex["runs"]:
            if run["ms"] is not None:
                pooled[(group, kind)]["popen"].append(run["ms"])
            if run.get("traced_exec_to_done_ms") is not None:
                pooled[(group, kind)]["exec"].append(run["traced_exec_to_done_ms"])
        bd = ex.get("breakdown", {})
        top = list(bd.get("parts_ms", {}).items())[:4]
        print(f"{name:12} {kind:6} policy {doc.get('daemon_policy')}: slowest tenth: "
              + "; ".join(f"{k} {v['slowest_tenth_mean']}" for k, v in top))
    if "apply_revert" in doc:
        ar = doc["apply_revert"]
        print(f"{name}: apply median {ar['apply']['median_ms']} ms (max {ar['apply']['max_ms']}),"
              f" revert median {ar['revert']['median_ms']} ms")
    if "idle" in doc:
        print(f"{name}: idle {doc['idle']['percent_of_one_cpu_schedstat']} % of a CPU")
    log = doc.get("daemon_log")
    if log and os.path.exists(log):
        for line in open(log, errors="replace"):
            if "realtime" in line or "SCHED_FIFO" in line:
                print(f"{name}: daemon log: {line.strip()}")
    print(f"{name}: host as before: {not doc.get('host_differences')}, "
          f"left: {doc.get('leftover_pids')}")
print("\nexec -> placed, pooled over rounds (ms): from just before Popen | from the exec event")
print(f"{'version':10} {'noise':6} {'n':>4} {'p50':>7} {'p90':>7} {'p99':>7} | {'p50':>7} {'p90':>7} {'p99':>7}")
for (group, kind), d in sorted(pooled.items()):
    a, e = d["popen"], d["exec"]
    print(f"{group:10} {kind:6} {len(a):4} {pct(a, 50):7} {pct(a, 90):7} {pct(a, 99):7} | "
          f"{pct(e, 50)!s:>7} {pct(e, 90)!s:>7} {pct(e, 99)!s:>7}")
PY
ctl capture --stable /tmp/cap-after >/dev/null 2>&1
echo "== capture diff (before vs after; capture --stable)"
diff -r /tmp/cap-before /tmp/cap-after && echo "captures identical"
