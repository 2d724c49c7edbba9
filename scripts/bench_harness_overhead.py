#!/usr/bin/env python3
"""Harness overhead: resnet_synthetic.py under mpirun (1 rank) vs a bare training loop.

Both train the same model (the benchmark's own build_model, so torchvision or the
built-in ResNet alike), same batch, same image size, same thread count, on the same
machine, interleaved A B A B so drift hits both. Prints img/s medians and the ratio;
the target is a ratio >= 0.95 (the harness adds nothing measurable).

    python scripts/bench_harness_overhead.py --model resnet18 --image-size 64 --batch-size 16 --reps 3

Run it on a node (`deployer ssh`, then with /shared/benchmarks) or on any machine with
torch and mpi4py; it needs mpirun on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH = next(p for p in (HERE.parent / "benchmarks", HERE) if (p / "resnet_synthetic.py").exists())


def bare_loop(model_name: str, batch: int, size: int, warmup: int, batches: int, iters: int, threads: int) -> float:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(BENCH))
    from resnet_synthetic import build_model  # the same model definition the harness uses

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model, _ = build_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(batch, 3, size, size)
    target = torch.randint(0, 1000, (batch,))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    for _ in range(warmup):
        step()
    rates = []
    for _ in range(iters):
        t0 = time.perf_counter()
        for _ in range(batches):
            step()
        rates.append(batch * batches / (time.perf_counter() - t0))
    return statistics.mean(rates)


def harness(model_name: str, batch: int, size: int, warmup: int, batches: int, iters: int, threads: int) -> float:
    cmd = ["mpirun", "-np", "1", "--bind-to", "none", sys.executable, str(BENCH / "resnet_synthetic.py"), "--json",
           "--model", model_name, "--batch-size", str(batch), "--image-size", str(size), "--threads", str(threads),
           "--num-warmup-batches", str(warmup), "--num-batches-per-iter", str(batches), "--num-iters", str(iters),
           # as `deployer bench` runs it: with a progress line per batch
           "--progress"]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    out = subprocess.run(cmd, text=True, capture_output=True, check=True, env=env).stdout
    rate: float = json.loads(next(line for line in out.splitlines() if line.startswith("{")))["img_per_sec"]
    return rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--num-warmup-batches", type=int, default=3)
    ap.add_argument("--num-batches-per-iter", type=int, default=5)
    ap.add_argument("--num-iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reps", type=int, default=3, help="A/B pairs")
    a = ap.parse_args()
    args = (a.model, a.batch_size, a.image_size, a.num_warmup_batches, a.num_batches_per_iter, a.num_iters, a.threads)
    bare, harn, ratios = [], [], []
    for i in range(a.reps):
        b = bare_loop(*args) if i % 2 == 0 else None
        h = harness(*args)
        if b is None:
            b = bare_loop(*args)
        bare.append(b)
        harn.append(h)
        ratios.append(h / b)
        print(f"pair {i + 1}: bare {b:.1f} img/s, harness {h:.1f} img/s, ratio {h / b:.3f}", flush=True)
    print(f"median: bare {statistics.median(bare):.1f} img/s, harness {statistics.median(harn):.1f} img/s, "
          f"harness/bare {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
