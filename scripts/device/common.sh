# Sourced by scripts/device/*.sh on the lent machine: gputuned's wheels (carried in .whl/: the
# machine has no package index) into /tmp/site, this checkout first on the path, and ctl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ctl() { python3 -m gputuned.cli "$@"; }
nproc; uname -r; nvidia-smi -L 2>/dev/null | head -2
