#!/usr/bin/env python3
"""`deployer up` from a baked image against the plain base image, side by side in one run.

Run as root from the repo root (base image cached):
`sudo .venv/bin/python scripts/bench_baked_up.py [--nodes 1,8] [--image NAME]`.
Bakes a local image first unless --image names one (and prints how long the bake took),
then for each N: a cold `up` from the plain image, then from the baked one (interleaved,
each a fresh cluster `benchbk`, or --name, in a temporary dir, torn down after), and on the last baked
cluster with more than one node an `up --replace worker-1` (the replaced node's
Ansible). Prints per run the wall time, Ansible's seconds (timings.json) and the slowest
roles, then the ratios docs/performance.md quotes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEPLOYER = [sys.executable, "-m", "deployer"]
NAME = "benchbk"


def timed(args: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    p = subprocess.run([*DEPLOYER, *args], cwd=cwd, text=True, capture_output=True)
    return time.perf_counter() - t0, p


def must(p: subprocess.CompletedProcess[str], what: str) -> None:
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-3000:])
        raise SystemExit(f"{what} failed ({p.returncode})")


def last_timings(cwd: Path) -> dict[str, Any]:
    from deployer.pipeline import timings

    run = sorted((cwd / ".deployer" / NAME / "runs").glob("*-up"))[-1]
    rec = timings.read(run)
    assert rec is not None
    return rec


def one(n: int, image: str | None) -> dict[str, Any]:
    """A cold `up` of n nodes (from `image`, or the plain image), then, baked and n > 1, a
    replaced worker; the cluster torn down."""
    with tempfile.TemporaryDirectory(prefix="bench-baked-") as d:
        cwd = Path(d)
        args = ["up", "--name", NAME, "--nodes", str(n), "--json"] + (["--image", image] if image else [])
        try:
            wall, p = timed(args, cwd)
            must(p, f"up --nodes {n}")
            rec = last_timings(cwd)
            row: dict[str, Any] = {"nodes": n, "image": image or "plain", "up_s": round(wall, 1),
                                   "ansible_s": rec["stages_s"].get("ansible"),
                                   "roles": dict(list(rec["ansible_roles_s"].items())[:4])}
            if n > 1:
                rwall, rp = timed(["up", "--name", NAME, "--replace", "worker-1", "--json"], cwd)
                must(rp, "up --replace worker-1")
                rrec = last_timings(cwd)
                configured = sorted(json.loads(rp.stdout).get("configured") or {})
                row.update(replace_s=round(rwall, 1), replace_ansible_s=rrec["stages_s"].get("ansible"),
                           replace_configured=configured)
            return row
        finally:
            subprocess.run([*DEPLOYER, "down", "--name", NAME, "--yes"], cwd=cwd, capture_output=True)


def main() -> int:
    global NAME
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", default="1,8")
    ap.add_argument("--image", help="a baked image to use (default: bake one now)")
    ap.add_argument("--json", action="store_true", help="the rows as JSON on stdout")
    ap.add_argument("--name", default=NAME, help=f"the clusters' name (default {NAME}; containers are named after it)")
    a = ap.parse_args()
    NAME = a.name
    image = a.image
    if image is None:
        with tempfile.TemporaryDirectory(prefix="bench-bake-") as d:
            wall, p = timed(["image", "build", "--provider", "local", "--json"], Path(d))
            must(p, "image build")
            image = json.loads(p.stdout)["name"]
            print(f"bake: {image} in {wall:.1f}s")
    rows = []
    for n in [int(x) for x in a.nodes.split(",")]:
        for img in (None, image):  # side by side: plain, then baked, for each N
            row = one(n, img)
            rows.append(row)
            extra = (f"; --replace worker-1 {row['replace_s']}s (ansible {row['replace_ansible_s']}s "
                     f"on {len(row['replace_configured'])} node(s))"
                     if "replace_s" in row else "")
            print(f"N={n} {row['image']:<28} up {row['up_s']:6.1f}s  ansible {row['ansible_s']}s  "
                  f"roles {row['roles']}{extra}", flush=True)
    for n in sorted({r["nodes"] for r in rows}):
        plain = next(r for r in rows if r["nodes"] == n and r["image"] == "plain")
        baked = next(r for r in rows if r["nodes"] == n and r["image"] != "plain")
        print(f"N={n}: up {plain['up_s']}s -> {baked['up_s']}s; ansible {plain['ansible_s']}s -> {baked['ansible_s']}s "
              f"(x{baked['ansible_s'] / plain['ansible_s']:.2f})")
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
