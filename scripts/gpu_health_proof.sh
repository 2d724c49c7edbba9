#!/bin/bash
# The checks `deployer check` and the health timer (`deployer heal`) run on a GPU node,
# run on this machine's GPUs as they run on a node: benchmarks/node_check.py at the quick
# and standard levels and benchmarks/node_health.py, with the raw outputs their GPU readers
# read (nvidia-smi -q, the kernel's messages). A companion of scripts/gpu_proof.py for a
# lent GPU machine: the training environment is the machine's own python (its torch), put
# first on a login shell's PATH, as the training_runtime role does on a node.
#
#   bash scripts/gpu_health_proof.sh OUT_DIR [GPUS]
set -u
out=${1:?usage: gpu_health_proof.sh OUT_DIR [GPUS]}; gpus=${2:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out" /tmp/health-proof/shared /tmp/health-proof/state
# the shared dir is a mount on a node (NFS); its check fails a plain directory on /
mountpoint -q /tmp/health-proof/shared || mount -t tmpfs -o size=64g deployer-proof /tmp/health-proof/shared
cp -r "$here/benchmarks" /tmp/health-proof/shared/
py=$(dirname "$(command -v python3)")
iface=$(ls /sys/class/net | grep -vx lo | head -1)
# a login shell's environment on a node: the venv first, NCCL's interface (the role's profile.d file)
printf 'export PATH=%s:$PATH NCCL_SOCKET_IFNAME=%s GLOO_SOCKET_IFNAME=%s PYTHONPATH=%s\n' \
  "$py" "$iface" "$iface" "${PYTHONPATH:-}" > /etc/profile.d/zz-deployer-proof.sh
cd /tmp/health-proof/shared/benchmarks
timed() {  # timed NAME CMD...: CMD's output into NAME.txt, its seconds into NAME.seconds
  local name=$1 t0 rc; shift; t0=$(date +%s.%N)
  "$@" > "$out/$name.txt" 2>&1; rc=$?
  python3 -c "print(f'{$(date +%s.%N) - $t0:.1f} s')" > "$out/$name.seconds"
  echo "$name: rc $rc in $(cat "$out/$name.seconds")"
}
for level in quick standard; do
  timed "node_check_$level" python3 node_check.py --shared /tmp/health-proof/shared --token "proof-$level" \
    --level "$level" --gpus "$gpus"
done
timed node_health python3 node_health.py --shared /tmp/health-proof/shared --gpus "$gpus" \
  --state /tmp/health-proof/state --textfile "$out/node_health.prom"
cp /tmp/health-proof/state/last.json "$out/node_health_last.json" 2>/dev/null
# what its GPU readers read, as they read it
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1
if command -v journalctl >/dev/null; then journalctl -k --no-pager -o short-iso; else dmesg; fi 2>&1 \
  | tail -400 > "$out/kernel-messages.txt"
rm -f /etc/profile.d/zz-deployer-proof.sh
cd / && umount /tmp/health-proof/shared
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rec = json.load(open(f"{out}/node_health_last.json"))
print("health:", rec["verdict"], "-", rec["reason"])
for f in rec["findings"]:
    print(f"  {f['check']}: {f['status']} {f.get('detail', '')[:160]}")
for level in ("quick", "standard"):
    for line in open(f"{out}/node_check_{level}.txt"):
        if line.startswith("CHECK"):
            f = json.loads(line.split(" ", 1)[1]) if line.split(" ", 1)[1].lstrip().startswith("{") else None
            if f:
                print(f"  check {level} {f['check']}: {f['status']} {f.get('detail', '')[:160]}")
PY
