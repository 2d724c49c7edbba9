#!/usr/bin/env python3
"""Where the training environment should live: on the shared dir (built once on the
master, what the training_runtime role does) or installed on every node's own disk from
a wheel cache on the shared dir (fetched once). Measured side by side on a running
cluster, through `deployer ssh` to the master and mpirun from there:

  install  wall time of the per-node alternative: one pip install per node, all at once,
           from the wheel cache (the shared venv's cost is the role's one install)
  import   `import torch, mpi4py` in every rank at once, median of 3 (the start of every
           benchmark and training job)
  run      ResNet-18 data-parallel img/s on every node (after import, code is in memory)

Run from the directory of the cluster's cluster.yaml (any provider):
`python scripts/bench_venv_place.py [--model resnet18]`. It removes what it adds (the
wheel cache and the local venvs). Locally /shared is a bind mount of this host's disk, so
the shared and local figures differ by nothing but noise here; on a cloud /shared is NFS
from the master and the same script measures what a network file system costs.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time

DEPLOYER = [sys.executable, "-m", "deployer"]
SHARED = "/shared/venv/bin/python"
LOCAL_DIR = "/var/tmp/deployer-venv-local"
LOCAL = f"{LOCAL_DIR}/bin/python"
WHEELS = "/shared/.bench-venv-wheels"


def on_master(cmd: str, timeout: float = 1800) -> str:
    p = subprocess.run([*DEPLOYER, "ssh", "--", cmd], text=True, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"on the master: {cmd}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


def everywhere(n: int, cmd: str) -> str:
    """cmd once on every node at the same time (one rank per node)."""
    return on_master(f"mpirun -np {n} --hostfile /shared/hostfile --map-by node --bind-to none sh -c {shlex.quote(cmd)}")


def import_seconds(n: int, python: str) -> float:
    code = "import time; t = time.perf_counter(); import torch, mpi4py.MPI; print('IMPORT', time.perf_counter() - t)"
    runs = []
    for _ in range(3):
        out = everywhere(n, f"{python} -c {shlex.quote(code)}")
        runs.append(max(float(x) for x in re.findall(r"IMPORT ([\d.]+)", out)))  # the slowest rank holds the job
    return statistics.median(runs)


def img_per_sec(n: int, python: str, model: str) -> float:
    out = on_master(f"mpirun -np {n} --hostfile /shared/hostfile --map-by node --bind-to none {python} "
                    f"/shared/benchmarks/resnet_synthetic.py --model {model} --image-size 64 --batch-size 16 "
                    f"--num-warmup-batches 2 --num-batches-per-iter 5 --num-iters 3 --no-cuda --json")
    return float(json.loads(out.strip().splitlines()[-1])["img_per_sec"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    a = ap.parse_args()
    n = len(json.loads(subprocess.run([*DEPLOYER, "status", "--json"], text=True, capture_output=True, check=True).stdout)["nodes"])
    pins = on_master(f"{SHARED} -m pip freeze --all | grep -iE '^(torch|mpi4py|numpy)=='").split()
    print(f"{n} nodes; runtime {' '.join(pins)}", flush=True)
    try:
        t0 = time.perf_counter()
        on_master(f"{SHARED} -m pip download --quiet --dest {WHEELS} {' '.join(pins)}")
        fetched = time.perf_counter() - t0
        t0 = time.perf_counter()
        everywhere(n, f"rm -rf {LOCAL_DIR} && python3 -m venv {LOCAL_DIR} && {LOCAL} -m pip install --quiet --no-compile "
                      f"--no-index --find-links {WHEELS} {' '.join(pins)}")
        installed = time.perf_counter() - t0
        print(f"install: wheel cache filled once in {fetched:.1f} s; then a local venv on all {n} nodes at once in "
              f"{installed:.1f} s (the shared venv: the role's one install on the master)", flush=True)
        rows = {}
        for label, python in (("shared", SHARED), ("local", LOCAL)):
            rows[label] = {"import_s": round(import_seconds(n, python), 2), "img_per_sec": round(img_per_sec(n, python, a.model), 1)}
            print(f"{label:6s}: import torch+mpi4py {rows[label]['import_s']:.2f} s (slowest rank, median of 3); "
                  f"{a.model} {rows[label]['img_per_sec']:.1f} img/s on {n} nodes", flush=True)
        ratio = rows["local"]["img_per_sec"] / rows["shared"]["img_per_sec"]
        print(f"local/shared: import {rows['local']['import_s'] / rows['shared']['import_s']:.2f}x, throughput {ratio:.2f}x")
        print(json.dumps({"nodes": n, "fetch_s": round(fetched, 1), "local_install_s": round(installed, 1), **rows}))
    finally:
        everywhere(n, f"rm -rf {LOCAL_DIR}")
        on_master(f"rm -rf {WHEELS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
