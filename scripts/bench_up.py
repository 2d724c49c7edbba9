#!/usr/bin/env python3
"""Wall time of `deployer up` for N = 1, 2, 4, 8 local nodes, and of a no-change re-run.

Run as root from the repo root, with the base image already cached (any earlier `up`
builds it; its package lists are refreshed, when due, before each timed `up`, not in it):
`sudo .venv/bin/python scripts/bench_up.py [--nodes 1,2,4,8] [--rounds 3]`.
Each N gets a fresh cluster (name `benchup`, its own subnet and state dir) that is
torn down afterwards. Prints one row per N and the ratios docs/performance.md quotes.
Also times `deployer --help` and `status` (startup cost: heavy imports only where used).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEPLOYER = [sys.executable, "-m", "deployer"]


def timed(args: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.perf_counter()
    p = subprocess.run([*DEPLOYER, *args], cwd=cwd, text=True, capture_output=True)
    return time.perf_counter() - t0, p


def first_up_timings(cwd: Path) -> dict[str, Any]:
    """The cold `up`'s own timings.json (deployer/pipeline/timings.py): stages, roles, one line."""
    from deployer.pipeline import timings
    from deployer.pipeline.timings import summary

    run = sorted((cwd / ".deployer" / "benchup" / "runs").glob("*-up"))[0]
    rec = timings.read(run)
    assert rec is not None  # the cold `up` just wrote it
    nodes = int(json.loads((cwd / ".deployer" / "benchup" / "spec.json").read_text())["spec"]["nodes"])
    top = ", ".join(f"{k} {v:.0f} s" for k, v in list(rec["ansible_roles_s"].items())[:4])
    return {**rec, "summary": f"{summary('up', nodes, rec)}; slowest roles: {top}"}


def best_of(args: list[str], cwd: Path, n: int = 5) -> float:
    return min(timed(args, cwd)[0] for _ in range(n))


def print_ratios(rows: list[dict[str, Any]]) -> None:
    """T(N)/T(1) within each round (a round starts at each N=1 row), then per N the median
    of the rounds' ratios with their range, and the median T(N)."""
    rounds: list[dict[int, float]] = []
    for r in rows:
        if r["nodes"] == 1 or not rounds:
            rounds.append({})
        rounds[-1][r["nodes"]] = r["up_s"]
    for i, rnd in enumerate(rounds, 1):
        if 1 in rnd:
            ratio_text = ", ".join(f"T({n})/T(1) = {t / rnd[1]:.2f}" for n, t in rnd.items() if n != 1)
            print(f"round {i}: " + ", ".join(f"T({n}) {t:.1f}s" for n, t in rnd.items()) + (f"; {ratio_text}" if ratio_text else ""))
    if len(rounds) > 1:
        for n in sorted({n for rnd in rounds for n in rnd}):
            times = [rnd[n] for rnd in rounds if n in rnd]
            ratios = [rnd[n] / rnd[1] for rnd in rounds if n in rnd and 1 in rnd]
            line = f"N={n}: median T {statistics.median(times):.1f}s (min {min(times):.1f}, max {max(times):.1f})"
            if n != 1 and ratios:
                line += f"; T({n})/T(1) median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"
            print(line)


def main() -> int:
    from deployer.providers.local.image import ensure_base_image

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--no-reruns", action="store_true", help="time only the cold `up` of each N (skip re-runs and status)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the whole list of N this many times, interleaved (1,2,4,8,1,2,4,8...): "
                         "each round's T(N)/T(1) is measured side by side, so a noisy moment shows as one bad round")
    a = ap.parse_args()
    rows = []
    for n in [int(x) for x in a.nodes.split(",")] * a.rounds:
        with tempfile.TemporaryDirectory(prefix="benchup-") as d:
            cwd = Path(d)
            (cwd / "cluster.yaml").write_text(f"name: benchup\nnodes: {n}\nlocal:\n  subnet: 10.80.0.0/24\n  memory_mb: 1024\n")
            try:
                # Outside the timing: the image's package lists are refreshed once they are
                # 30 min old (a new image version, ~8 s); a long run would otherwise pay it
                # in whichever N crosses that mark, and not in the others.
                ensure_base_image()
                t_up, p = timed(["up"], cwd)
                if p.returncode != 0:
                    print(p.stderr[-3000:], file=sys.stderr)
                    return 1
                stages = first_up_timings(cwd)
                print(f"N={n}: {stages['summary']}", flush=True)
                row = {"nodes": n, "up_s": round(t_up, 1), "stages_s": stages["stages_s"], "ansible_roles_s": stages["ansible_roles_s"],
                       "bytes_from_outside": stages.get("bytes_from_outside", {})}
                if not a.no_reruns:
                    t_rerun, _ = timed(["up"], cwd)
                    t_reconf, _ = timed(["up", "--reconfigure"], cwd)
                    t_status = best_of(["status"], cwd)
                    row |= {"rerun_s": round(t_rerun, 1), "reconfigure_s": round(t_reconf, 1), "status_s": round(t_status, 3)}
                    print(
                        f"N={n}: up {t_up:.1f}s, no-change re-run {t_rerun:.1f}s, "
                        f"--reconfigure re-run {t_reconf:.1f}s, status {t_status:.3f}s",
                        flush=True,
                    )
                rows.append(row)
            finally:
                subprocess.run([*DEPLOYER, "down", "--yes"], cwd=cwd, capture_output=True)
    t_help = best_of(["--help"], Path.cwd())
    print(f"deployer --help: {t_help:.3f}s (best of 5)")
    print_ratios(rows)
    print(json.dumps({"rows": rows, "help_s": round(t_help, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
