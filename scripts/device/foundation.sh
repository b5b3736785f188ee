#!/usr/bin/env bash
# Run on the lent H200 machine (read-only for PCIe): capture a tree, inspect, plan.
# Usage there: bash scripts/device/foundation.sh OUTDIR   (wheels for pydantic & co. in .whl/)
set -u
out=${1:?output directory}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
ctl() { python3 -m gputuned.cli "$@"; }
echo "== host"; uname -r; nvidia-smi -L; cat /proc/cmdline; nproc
pgrep -a irqbalance || echo "no irqbalance"
echo "== capture (probe writes: each IRQ affinity and the ASPM policy written back unchanged)"
rm -rf /tmp/h200-capture
ctl capture /tmp/h200-capture --probe-writes --json
tar -C /tmp -czf "$out/h200-capture.tar.gz" h200-capture
echo "== inspect"
ctl inspect
ctl inspect --json >"$out/inspect.json"
ctl inspect --root /tmp/h200-capture --json >"$out/inspect-tree.json"
ctl inspect --all --json >"$out/inspect-all.json"
echo "== a torch process whose command line matches shared-host's rule"
mkdir -p /tmp/vllm
cat >/tmp/vllm/serve.py <<'PY'
import threading, time, torch
x = torch.ones(1024, device="cuda")
for _ in range(3):
    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
time.sleep(120)
PY
python3 /tmp/vllm/serve.py &
srv=$!
sleep 8
echo "== plan (writes nothing)"
ctl plan profiles/shared-host.toml
ctl plan profiles/shared-host.toml --json >"$out/plan-shared-host.json"
ctl plan profiles/dedicated-inference.toml --json >"$out/plan-dedicated.json"
ctl plan profiles/latency-critical.toml >"$out/plan-latency.txt" 2>&1
kill "$srv"
echo "== done"
