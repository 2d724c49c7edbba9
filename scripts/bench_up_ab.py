#!/usr/bin/env python3
"""Cold `deployer up --nodes N` of two checkouts, side by side: A B A B …

Measures what a change costs the whole `up` (e.g. before and after a change to the
boot path). Run as root from the repo root with its venv:

    git worktree add /tmp/before <commit>
    sudo .venv/bin/python scripts/bench_up_ab.py --a /tmp/before --b . --nodes 8 --pairs 2

Each checkout runs with this venv's packages and its own code (PYTHONPATH) and its own
base-image cache (the image's package list may differ), built before timing starts.
Every timed `up` starts with no container (cold) and a cached image, and is followed by
`down`. Prints each run, the medians and the B/A ratio of each pair.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def env_for(checkout: Path, label: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(checkout.resolve()),
        "DEPLOYER_IMAGE_DIR": f"/var/lib/deployer/images-bench-{label}",
    }


def run_up(checkout: Path, label: str, nodes: int) -> float:
    env = env_for(checkout, label)
    with tempfile.TemporaryDirectory(prefix=f"benchab-{label}-") as d:
        cwd = Path(d)
        (cwd / "cluster.yaml").write_text(f"name: benchab\nnodes: {nodes}\nlocal:\n  subnet: 10.81.0.0/24\n  memory_mb: 1024\n")
        try:
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "deployer", "up"], cwd=cwd, env=env, text=True, capture_output=True)
            elapsed = time.perf_counter() - t0
            if p.returncode != 0:
                raise SystemExit(f"{label}: up failed:\n{p.stderr[-3000:]}")
            return elapsed
        finally:
            subprocess.run([sys.executable, "-m", "deployer", "down", "--yes"], cwd=cwd, env=env, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="checkout A (e.g. before the change)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B (e.g. after)")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=2)
    a = ap.parse_args()
    for label, checkout in (("a", a.a), ("b", a.b)):
        # The driver's module as that checkout names it (providers/local/ since 2026-11-25).
        driver = "deployer.providers.local.lxc" if (checkout / "deployer/providers/local/lxc.py").exists() else "deployer.providers.lxc"
        subprocess.run([sys.executable, "-m", driver, "base-image"], env=env_for(checkout, label), check=True, capture_output=True)
    times: dict[str, list[float]] = {"a": [], "b": []}
    for i in range(a.pairs):
        for label, checkout in (("a", a.a), ("b", a.b)):
            t = run_up(checkout, label, a.nodes)
            times[label].append(t)
            print(f"pair {i + 1} {label.upper()} ({checkout}): up --nodes {a.nodes} {t:.1f}s", flush=True)
    ma, mb = statistics.median(times["a"]), statistics.median(times["b"])
    ratios = [b / x for x, b in zip(times["a"], times["b"], strict=True)]
    print(f"median A {ma:.1f}s, B {mb:.1f}s, B-A {mb - ma:+.1f}s; B/A per pair: {', '.join(f'{r:.2f}' for r in ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
