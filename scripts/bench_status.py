#!/usr/bin/env python3
"""How long `deployer status` takes on a running cluster, as a user types it.

Run from the directory that holds the cluster's state (.deployer/), with the venv:

    sudo .venv/bin/python scripts/bench_status.py --name demo --runs 15

Times whole processes (interpreter start, imports, the provider's observation, the SSH
probes), after one warm-up run. Prints every run and the median, min and max; the
target for 8 local nodes is a median under 0.3 s. With --compare-help it also times
`deployer --help` in alternation, to show what the interpreter and imports alone cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# As a user's shell runs it: Python caches compiled modules. (With PYTHONDONTWRITEBYTECODE
# set, every run compiles the deployer's own modules again: about 40 ms more.)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=ENV)
    return time.perf_counter() - t0, p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", help="cluster name (default: the only one)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--compare-help", action="store_true")
    a = ap.parse_args()
    status = [sys.executable, "-m", "deployer", "status", "--json"] + (["--name", a.name] if a.name else [])
    helpcmd = [sys.executable, "-m", "deployer", "--help"]
    _, warm = timed(status)
    if warm.returncode != 0:
        print(f"status failed: {warm.stderr.strip()}", file=sys.stderr)
        return 1
    info = json.loads(warm.stdout)
    states = [n["state"] for n in info["nodes"]]
    print(f"cluster {info['name']}: {len(states)} node(s), states {sorted(set(states))}")
    got: dict[str, list[float]] = {"status": [], "--help": []}
    for i in range(a.runs):
        dt, _ = timed(status)
        got["status"].append(dt)
        line = f"run {i + 1:2d}: status {dt:.3f}s"
        if a.compare_help:
            dh, _ = timed(helpcmd)
            got["--help"].append(dh)
            line += f"   --help {dh:.3f}s"
        print(line)
    for what, xs in got.items():
        if xs:
            print(f"{what}: median {statistics.median(xs):.3f}s  min {min(xs):.3f}s  max {max(xs):.3f}s  (n={len(xs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
