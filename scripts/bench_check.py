#!/usr/bin/env python3
"""How long `deployer check` takes, per level, on a running cluster, as a user types it.

Run from the directory that holds the cluster's state (.deployer/), with the venv:

    sudo .venv/bin/python scripts/bench_check.py --name demo --levels quick,standard --runs 3

Times whole processes; the check's own figure (report `seconds`) beside it, and the
slowest node of each run. The issue's target for the quick check (the end of every
`up`): under 30 s on 8 local nodes. Prints every run, then median, min and max per level.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--name", help="cluster name (default: the only one)")
    ap.add_argument("--levels", default="quick", help="comma-separated: quick,standard,full")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    got: dict[str, list[float]] = {}
    for level in a.levels.split(","):
        for i in range(a.runs):
            argv = [sys.executable, "-m", "deployer", "check", "--level", level, "--json"] + (["--name", a.name] if a.name else [])
            t0 = time.perf_counter()
            p = subprocess.run(argv, capture_output=True, text=True)
            dt = time.perf_counter() - t0
            if not p.stdout.strip():
                print(f"{level} run {i + 1}: no report (rc {p.returncode}): {p.stderr.strip()[-300:]}", file=sys.stderr)
                return 1
            report = json.loads(p.stdout)
            slowest = max(report["nodes"], key=lambda n: n["seconds"] or 0)
            print(f"{level} run {i + 1}: {dt:.1f}s whole process, {report['seconds']:.1f}s check, {len(report['nodes'])} "
                  f"node(s), verdict {report['verdict']}, slowest node {slowest['name']} {slowest['seconds']:.1f}s")
            got.setdefault(level, []).append(dt)
    for level, xs in got.items():
        print(f"{level}: median {statistics.median(xs):.1f}s  min {min(xs):.1f}s  max {max(xs):.1f}s  (n={len(xs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
