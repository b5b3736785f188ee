#!/usr/bin/env bash
# Run on the lent H200 machine: gputuned in the foreground with shared-host.toml (PCIe
# report-only); a torch process started afterwards is placed automatically, threads it starts
# later too; SIGTERM leaves a capture identical to the one before start.
set -u
out=${1:?output directory}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
ctl() { python3 -m gputuned.cli "$@"; }
threads() {  # tid comm nice cpus_allowed, and the process's cgroup
  for t in /proc/$1/task/*; do s=$(cat $t/stat); echo "  $(basename $t) $(cat $t/comm) nice=$(echo "${s##*)}" | awk '{print $17}') $(grep Cpus_allowed_list $t/status | tr -d '\t')"; done
  echo "  cgroup: $(cat /proc/$1/cgroup)"
}
mkdir -p /tmp/vllm
cat >/tmp/vllm/serve.py <<'PY'
import threading, time, torch
x = torch.ones(1 << 20, device="cuda")
def work():
    while True:
        torch.cuda.synchronize(); time.sleep(0.01)
threading.Thread(target=work, daemon=True).start()
time.sleep(6)
for _ in range(2):  # threads started later
    threading.Thread(target=work, daemon=True).start()
time.sleep(600)
PY
rm -rf /tmp/cap-before /tmp/cap-after; ctl capture --stable /tmp/cap-before >/dev/null 2>&1
python3 -m gputuned.daemon --profile profiles/shared-host.toml >"$out/daemon.log" 2>&1 & dmn=$!
for i in $(seq 50); do ctl status --json >/dev/null 2>&1 && break; sleep 0.2; done
echo "== daemon up"; ctl status
python3 /tmp/vllm/serve.py & srv=$!; t0=$(date +%s.%N)
sleep 4; echo "== server pid $srv, 4 s after start"; threads $srv
sleep 6; echo "== 10 s after start (2 threads started at 6 s)"; threads $srv
echo "== status / verify"; ctl status; ctl verify; echo "verify exit $?"
grep -E "placed|exited" "$out/daemon.log" | head -20
echo "== SIGTERM"; kill -TERM $dmn; wait $dmn; echo "daemon exit $?"
echo "== after stop"; threads $srv
ctl capture --stable /tmp/cap-after >/dev/null 2>&1
echo "== capture diff (before daemon start vs after stop; capture --stable)"
diff -r /tmp/cap-before /tmp/cap-after && echo "captures identical"
kill $srv; wait $srv 2>/dev/null
echo "== apply/revert benchmark"; python3 benchmarks/apply_revert.py profiles/shared-host.toml --rounds 20
echo "== live integration tests (daemon, watcher)"
python3 -m pytest -q -p no:cacheprovider -s tests/integration/test_daemon_live.py tests/integration/test_procwatch_live.py 2>&1 | tail -8
tail -5 "$out/daemon.log"
