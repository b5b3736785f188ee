#!/usr/bin/env bash
# Run on the lent H200 machine: do inspect, plan, verify and status write anything on a real GPU
# host (NVML loaded, the GPU's config space behind passthrough)? Each runs under strace -f;
# every open for writing, mkdir, rmdir, unlink, rename, chmod/chown, mount, setpriority or
# sched_* setter is printed (excepted: NVML's O_RDWR opens of /dev/nvidia*, its ioctl
# interface; the --prometheus target; /dev/null and /dev/tty). Also prints inspect --all's
# findings (no unreadable field is expected on that healthy GPU). Read-only. Issue 14, finding
# 22; docs/dev/reliability.md.
# Usage: bash scripts/device/readonly.sh OUTDIR
set -u
out=${1:?output directory}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if ! command -v strace >/dev/null; then
  echo "strace is missing on this machine: not run (apt-get install strace)" | tee "$out/readonly.txt"
  exit 0
fi
calls=open,openat,openat2,creat,truncate,ftruncate,mkdir,mkdirat,rmdir,unlink,unlinkat,rename
calls=$calls,renameat,renameat2,link,linkat,symlink,symlinkat,chmod,fchmod,fchmodat,chown
calls=$calls,fchown,lchown,fchownat,mount,umount2,setpriority,sched_setaffinity
calls=$calls,sched_setscheduler,sched_setattr
prom=$(mktemp -d)
n=0
{
  for args in "inspect" "inspect --all --json" "plan profiles/shared-host.toml" \
      "verify profiles/shared-host.toml --prometheus $prom/gputuned.prom" "status"; do
    n=$((n + 1))
    # shellcheck disable=SC2086  # args is a word list on purpose
    strace -f -qq -s 200 -e trace=$calls -o "$out/trace-$n.txt" python3 -m gputuned.cli $args \
      >"$out/out-$n.txt" 2>&1
    echo "== gputunectl $args: exit $?"
    grep -E 'O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|^[0-9]+ +(mkdir|rmdir|unlink|rename|link|symlink|f?chmod|f?chown|lchown|mount|umount|setpriority|sched_set|truncate|ftruncate)' \
      "$out/trace-$n.txt" | grep -v -e '"/dev/nvidia' -e '"/dev/null"' -e '"/dev/tty"' -e "$prom" -e '^[0-9]* *fchmod([0-9]*, 0644)' ||
      echo "   nothing written"
  done
  echo "== inspect --all findings"
  python3 -c "import json,sys; [print(d['bdf'], f['level'], f['message']) for d in json.load(open(sys.argv[1]))['devices'] for f in d['findings']]" "$out/out-2.txt"
} 2>&1 | tee "$out/readonly.txt"
rm -rf "$prom"
