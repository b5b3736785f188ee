#!/usr/bin/env bash
# Run on the lent H200 machine: apply shared-host.toml to a running torch process (PCIe tuners
# report-only), show verify, the partition, IRQ and thread placement; revert; compare captures;
# time apply/revert; run the live integration tests. Usage: bash scripts/device/engine.sh OUTDIR
set -u
out=${1:?output directory}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
ctl() { python3 -m gputuned.cli "$@"; }
mkdir -p /tmp/vllm
cat >/tmp/vllm/serve.py <<'PY'
import threading, time, torch
x = torch.ones(1 << 20, device="cuda")
def work():
    while True:
        torch.cuda.synchronize(); time.sleep(0.01)
for _ in range(3):
    threading.Thread(target=work, daemon=True).start()
time.sleep(600)
PY
python3 /tmp/vllm/serve.py & srv=$!
sleep 10
echo "== guard: no PCIe write may be planned outside report-only"
ctl plan profiles/shared-host.toml --json >"$out/plan.json"
python3 - "$out/plan.json" <<'PY' || { kill $srv; exit 1; }
import json, sys
p = json.load(open(sys.argv[1]))
bad = [c for c in p["changes"] if c["tuner"].startswith("pcie") and not c["report_only"]]
print("PCIe changes not report-only:", bad); sys.exit(1 if bad else 0)
PY
rm -rf /tmp/cap-before /tmp/cap-after
ctl capture --stable /tmp/cap-before >/dev/null 2>&1
echo "== apply"; ctl apply profiles/shared-host.toml; ctl apply profiles/shared-host.toml --json >"$out/apply-again.json"
echo "apply again wrote: $(python3 -c "import json;print(len(json.load(open('$out/apply-again.json'))['written']))")"
echo "== verify"; ctl verify; echo "verify exit $?"; ctl verify --json >"$out/verify.json"
echo "== partition"; g=/sys/fs/cgroup/gputuned.inference
for f in cpuset.cpus cpuset.cpus.exclusive cpuset.cpus.partition cpuset.cpus.effective cgroup.procs; do echo "$f: $(cat $g/$f | tr '\n' ' ')"; done
echo "root cpuset.cpus.effective: $(cat /sys/fs/cgroup/cpuset.cpus.effective)"
echo "== GPU IRQs"; for i in 42 43 44 45 46 47 48 49; do echo "irq $i: $(cat /proc/irq/$i/smp_affinity_list) effective $(cat /proc/irq/$i/effective_affinity_list 2>/dev/null)"; done
echo "default_smp_affinity: $(cat /proc/irq/default_smp_affinity)"
echo "== server threads (tid comm nice policy cpus_allowed last_cpu)"
for t in /proc/$srv/task/*; do s=$(cat $t/stat); echo "$(basename $t) $(cat $t/comm) nice=$(echo "${s##*)}" | awk '{print $17}') policy=$(echo "${s##*)}" | awk '{print $39}') $(grep Cpus_allowed_list $t/status | tr -d '\t') cpu=$(echo "${s##*)}" | awk '{print $37}')"; done
echo "server cgroup: $(cat /proc/$srv/cgroup)"
ctl status
echo "== revert"; ctl revert; ctl capture --stable /tmp/cap-after >/dev/null 2>&1
echo "== capture diff (before apply vs after revert; capture --stable)"
diff -r /tmp/cap-before /tmp/cap-after && echo "captures identical"
echo "== benchmark"; python3 benchmarks/apply_revert.py profiles/shared-host.toml --rounds 20 --json "$out/bench.json"
kill $srv; wait $srv 2>/dev/null
echo "== live integration tests"; python3 -m pytest -q -p no:cacheprovider tests/integration -rA 2>&1 | tail -15
