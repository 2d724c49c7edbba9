#!/usr/bin/env python3
"""The default `deployer bench --nodes 1,2,3` as a new user runs it: wall time and the
longest silence between progress lines; then the ensemble sweep's E(2).

Run from the directory that holds the cluster's state, on a local cluster of 3 nodes:

    sudo .venv/bin/python scripts/bench_default_sweep.py [--name NAME]

Targets on a 2-core machine: the sweep under 3 minutes, no gap over 10 s, ensemble
E(2) >= 0.9 (no gradient exchange: what is left of the loss is CPU sharing).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time


def run(argv: list[str]) -> tuple[int, float, float, str, str]:
    """rc, wall seconds, longest gap between stderr lines, stdout, stderr."""
    t0 = last = time.monotonic()
    gap = 0.0
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None  # both PIPE
    lines = []
    for line in proc.stderr:
        now = time.monotonic()
        gap = max(gap, now - last)
        last = now
        lines.append(line)
    out = proc.stdout.read()
    proc.wait()
    return proc.returncode, time.monotonic() - t0, gap, out, "".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name")
    ap.add_argument("--save-fixture", metavar="PATH",
                    help="also copy the default sweep's results.json here (tests/fixtures/bench/results_local_3node.json)")
    a = ap.parse_args()
    base = [sys.executable, "-m", "deployer", "bench", "--json"] + (["--name", a.name] if a.name else [])
    rc, wall, gap, out, err = run([*base, "--nodes", "1,2,3"])
    if rc != 0:
        print(err[-3000:], file=sys.stderr)
        return rc
    rep = json.loads(out)
    if a.save_fixture:
        shutil.copy(rep["files"]["json"], a.save_fixture)
        print(f"saved {rep['files']['json']} as {a.save_fixture}")
    flags = rep["versions"]["flags"]
    print(f"default sweep 1,2,3 (profile {flags['profile']}: {flags['model']} {flags['image_size']}px batch {flags['batch_size']}, "
          f"{flags['threads']} thread(s)/rank): wall {wall:.0f}s, longest gap between lines {gap:.1f}s")
    for r in rep["results"]:
        print(f"  N={r['nodes']}: {r['img_per_sec']:.1f} img/s, E={r['efficiency']:.2f}"
              + (f", ensemble {r['ensemble_img_per_sec']:.1f} img/s" if r.get("ensemble_img_per_sec") else ""))
    rc, wall, gap, out, err = run([*base, "--nodes", "1,2", "--mode", "ensemble"])
    if rc != 0:
        print(err[-3000:], file=sys.stderr)
        return rc
    ens = json.loads(out)["results"]
    print(f"ensemble sweep 1,2: E(2) = {ens[1]['efficiency']:.2f} ({ens[0]['img_per_sec']:.1f} -> {ens[1]['img_per_sec']:.1f} img/s), "
          f"wall {wall:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
