#!/usr/bin/env bash
# Run on the lent H200 machine: `gputunectl trial` on a live workload (issue 20, item 4;
# docs/trial.md). Two trials, one-shot (no daemon), each about 100 s:
#
#   1. 8 against 12 CPUs for the server's partition: expected "no winner" (the noisy-neighbour
#      runs found none; here the server's 4 busy processes fit in either);
#   2. 2 against 8 CPUs: expected "B (...count=8) wins" (4 busy processes on 2 CPUs wait on
#      the run queue, on 8 they do not).
#
#   bash scripts/device/trial.sh OUTDIR [PAIRS] [WINDOW]        defaults 6 pairs, 5 s windows
#
# The workload: a "server" (python3 with 4 busy child processes, matched by the profiles' rule
# by its command line and placed with its children) and 16 CPU burners in a cgroup of their own
# (trial-noise), all stopped at the end; `capture --stable` before and after must be identical.
# NO_WHEELS=1: the python3 on PATH as it is (a development machine).
set -u
out=${1:?output directory}; pairs=${2:-6}; window=${3:-5}
mkdir -p "$out/profiles"
if [ -n "${NO_WHEELS:-}" ]; then ctl() { python3 -m gputuned.cli "$@"; }; else
  source scripts/device/common.sh
fi
cat >"$out/profiles/trial.toml" <<'TOML'
# shared-host's partition, IRQs and neighbours, with one rule for this script's server.
include = ["shared-host"]
name = "trial"

[cpusets.inference]
per = "gpu"
exclude = ["housekeeping"]
count = 8
max_percent = 100
fallback_all = true

[[process]]
name = "server"
match.user = "root"
match.cmdline = '^python3 -c # trial-server'
children = "follow"
cpus = "inference"
move_to_partition = true
nice = -10
TOML
cap=$(mktemp -d /tmp/trial-cap.XXXXXX)
ctl capture --stable "$cap/before" >/dev/null 2>&1
pids=()
python3 -c '# trial-server
import multiprocessing as mp, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # exit runs atexit: children end too
def burn():
    while True: pass
ps = [mp.get_context("fork").Process(target=burn, daemon=True) for _ in range(4)]
[p.start() for p in ps]
time.sleep(900)' &
pids+=($!)
# The burners in a cgroup of their own where /sys/fs/cgroup is cgroup v2 (elsewhere it may be a
# tmpfs, where mkdir would make a plain folder): the neighbours as a real host has them.
v2=; [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && v2=1 && mkdir -p /sys/fs/cgroup/trial-noise
for i in $(seq "$(nproc)"); do
  timeout 900 python3 -c 'while True: pass' & pids+=($!)
  [ -n "$v2" ] && echo $! >/sys/fs/cgroup/trial-noise/cgroup.procs
done
sleep 2
echo "== server pid ${pids[0]}, $(( ${#pids[@]} - 1 )) burners${v2:+ in /trial-noise}; $pairs pairs, ${window} s windows"
rule=(--pairs "$pairs" --min-wins $(( pairs - 1 )) --min-gain 3 --window "$window" --settle 2)
echo "== trial 1: 8 against 12 CPUs (expected: no winner)"
ctl trial "$out/profiles/trial.toml" --set cpusets.inference.count=8,12 "${rule[@]}"
echo "== trial 2: 2 against 8 CPUs (expected: B wins)"
ctl trial "$out/profiles/trial.toml" --set cpusets.inference.count=2,8 "${rule[@]}" --json >"$out/trial-2-8.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(f"pair {p["pair"]} ({p["first"]} first): A {p["a"]:.3f} B {p["b"]:.3f} ms/s, B {p["gain_b_over_a_pct"]:+.1f} %") for p in d["pairs"]]; print(d["verdict"]["why"]); print("winner:", d["verdict"]["winner"], "host:", d["host"])' "$out/trial-2-8.json"
echo "== the host after trial 2 (on the winner): revert"
ctl revert >/dev/null && echo reverted
kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null
[ -n "$v2" ] && rmdir /sys/fs/cgroup/trial-noise && echo "noise cgroup removed"
ctl capture --stable "$cap/after" >/dev/null 2>&1
echo "== capture diff (before vs after; capture --stable)"
diff -r "$cap/before" "$cap/after" >/dev/null && echo "captures identical" || diff -rq "$cap/before" "$cap/after" | head
rm -rf "$cap"
echo "== done at ${SECONDS} s"
