#!/bin/bash
# The checks `deployer check` and the health timer (`deployer heal`) run on a GPU node,
# run on this machine's GPUs as they run on a node: benchmarks/node_check.py at the quick
# and standard levels and benchmarks/node_health.py, with the raw outputs their GPU readers
# read (nvidia-smi -q, the kernel's messages). scripts/gpu_proof.py runs it as its
# node_checks step; alone:
#
#   bash scripts/gpu_health_proof.sh OUT_DIR [GPUS]
#
# It changes nothing outside its own folders: it runs in a mount namespace of its own
# (unshare -m), where the shared dir is a tmpfs mount, as the NFS mount is on a node (the
# check fails a plain directory on /), and the login shell the checks use (bash -l: the
# training venv first on PATH, as the training_runtime role's profile.d file sets it)
# reads a HOME of its own. Root only (the mount), as on the lent GPU machines.
set -u
if [ -z "${DEPLOYER_PROOF_NS:-}" ]; then
  DEPLOYER_PROOF_NS=1 exec unshare --mount --propagation private "$BASH" "$0" "$@"
fi
out=${1:?usage: gpu_health_proof.sh OUT_DIR [GPUS]}; gpus=${2:-1}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "$out" && cd "$out" && pwd)
work=$(mktemp -d /tmp/gpu-health-proof.XXXXXX)
trap 'cd / && umount "$work/shared"; rm -rf "$work"' EXIT
shared=$work/shared
mkdir -p "$shared" "$work/state" "$work/home"
mount -t tmpfs -o size=64g deployer-proof "$shared" || exit 2
cp -r "$here/benchmarks" "$shared/"
# the python with torch (scripts/gpu_proof.py passes its --python), first on a login shell's PATH
py=$(dirname "${DEPLOYER_PROOF_PYTHON:-$(command -v python3)}")
iface=$(ip -o route show default 2>/dev/null | awk '{print $5; exit}')
[ -n "$iface" ] || iface=$(ls /sys/class/net | grep -vx lo | head -1)
printf 'export PATH=%q:$PATH NCCL_SOCKET_IFNAME=%q GLOO_SOCKET_IFNAME=%q PYTHONPATH=%q\n' \
  "$py" "$iface" "$iface" "${PYTHONPATH:-}" > "$work/home/.bash_profile"
export HOME=$work/home
cd "$shared/benchmarks"
timed() {  # timed NAME CMD...: CMD's output into NAME.txt, its seconds into NAME.seconds
  local name=$1 t0 rc; shift; t0=$(date +%s.%N)
  "$@" > "$out/$name.txt" 2>&1; rc=$?
  python3 -c "print(f'{$(date +%s.%N) - $t0:.1f} s')" > "$out/$name.seconds"
  echo "$name: rc $rc in $(cat "$out/$name.seconds")"
}
for level in quick standard; do
  timed "node_check_$level" python3 node_check.py --shared "$shared" --token "proof-$level" --level "$level" --gpus "$gpus"
done
timed node_health python3 node_health.py --shared "$shared" --gpus "$gpus" --state "$work/state" \
  --textfile "$out/node_health.prom"
cp "$work/state/last.json" "$out/node_health_last.json"
# what its GPU readers read, as they read it
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1
if command -v journalctl >/dev/null; then journalctl -k --no-pager -o short-iso; else dmesg; fi 2>&1 \
  | tail -400 > "$out/kernel-messages.txt"
