#!/usr/bin/env python3
"""PyTorch synthetic benchmark: Horovod's pytorch_synthetic_benchmark.py, flags and
output lines, on torch.distributed DDP (NCCL on GPUs, gloo on CPUs) under mpirun.

    mpirun -np 4 --hostfile hostfile --bind-to none -x PATH python resnet_synthetic.py --model resnet50

Rank, world size, local rank and the rendezvous (rank 0's address, a free port) come
from mpi4py. Every rank times itself; rank 0 gathers the per-rank rates and reports
their sum, so a slow node shows up in the total instead of being hidden by N x rank 0.
--mode ensemble runs the same step with no gradient exchange (no DDP): the ratio
dp/ensemble at the same N is the share of time the all-reduce costs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import timeit
from typing import Any, NamedTuple

from bench_common import Heartbeat, beating_from_import, mpi_library, nccl_version_text, quiet_barrier, rendezvous

beating_from_import(sys.argv[1:])  # MPI and the heartbeat before torch's imports: bench_common says why

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from mpi4py import MPI  # noqa: E402
from torch import nn, optim  # noqa: E402

try:  # torchvision when it imports; a torchvision build that mismatches torch raises
    from torchvision import models as tv_models
except Exception:  # noqa: BLE001 - any import failure means: use the built-in ResNets
    tv_models = None

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


# --- a ResNet with torchvision's architecture (same layers, same parameter count) ---
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1, down: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu, self.downsample = nn.ReLU(inplace=True), down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.downsample is None else self.downsample(x)
        out: torch.Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)) + idt)
        return out


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1, down: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)  # stride on 3x3 (v1.5)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(width * 4)
        self.relu, self.downsample = nn.ReLU(inplace=True), down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idt = x if self.downsample is None else self.downsample(x)
        out: torch.Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.relu(self.bn3(self.conv3(out)) + idt)
        return out


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock | Bottleneck], layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(64), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin, stages = 64, []
        for i, (width, n) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            stride = 1 if i == 0 else 2
            down = None
            if stride != 1 or cin != width * block.expansion:
                down = nn.Sequential(nn.Conv2d(cin, width * block.expansion, 1, stride, bias=False),
                                     nn.BatchNorm2d(width * block.expansion))
            blocks = [block(cin, width, stride, down)]
            cin = width * block.expansion
            blocks += [block(cin, width) for _ in range(n - 1)]
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.fc(torch.flatten(self.avgpool(x), 1))
        return x


ARCH: dict[str, tuple[type[BasicBlock | Bottleneck], list[int]]] = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]), "resnet34": (BasicBlock, [3, 4, 6, 3]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]), "resnet101": (Bottleneck, [3, 4, 23, 3]),
    "resnet152": (Bottleneck, [3, 8, 36, 3])}


def build_model(name: str) -> tuple[nn.Module, str]:
    if tv_models is not None and hasattr(tv_models, name):
        return getattr(tv_models, name)(), "torchvision"
    if name not in ARCH:
        raise SystemExit(f"unknown model {name!r} (torchvision not importable): use one of {', '.join(MODELS)}")
    return ResNet(*ARCH[name]), "builtin"


# --- launch plumbing --------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="PyTorch Synthetic Benchmark",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression of gradients (DDP comm hook)")
    p.add_argument("--model", default="resnet50", help="model to benchmark")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size (per rank)")
    p.add_argument("--num-warmup-batches", type=int, default=10, help="warm-up batches, not timed")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="batches per benchmark iteration")
    p.add_argument("--num-iters", type=int, default=10, help="number of benchmark iterations")
    p.add_argument("--no-cuda", action="store_true", help="disables CUDA training")
    p.add_argument("--mode", choices=["dp", "ensemble"], default="dp",
                   help="dp: DDP data parallel; ensemble: same step, no gradient exchange")
    p.add_argument("--amp", action="store_true", help="autocast (fp16 on GPU, bf16 on CPU)")
    p.add_argument("--channels-last", action="store_true", help="NHWC memory format")
    p.add_argument("--image-size", type=int, default=224, help="square image side")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: cores per local rank)")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON line with all figures")
    p.add_argument("--timeline", metavar="DIR",
                   help="after the timed iterations, profile --timeline-steps more steps with torch.profiler; "
                        "every rank writes DIR/rank<r>-<host>.json (Chrome trace; merge_timeline.py joins them)")
    p.add_argument("--timeline-steps", type=int, default=3, help="steps under the profiler with --timeline")
    p.add_argument("--heartbeat", type=float, default=0,
                   help="every rank prints HEARTBEAT lines every this many seconds (bench_common.Heartbeat; 0: none)")
    p.add_argument("--seconds-per-iter", type=float, default=0,
                   help="time-boxed iterations instead of --num-batches-per-iter: every rank starts each one together "
                        "and runs batches for this many seconds, so ranks that share CPUs are timed over the same "
                        "window (deployer check's straggler step)")
    p.add_argument("--progress", action="store_true",
                   help="rank 0 prints a 'PROGRESS {json}' line after every batch (deployer bench shows them)")
    args = p.parse_args(argv)
    if args.seconds_per_iter and args.mode == "dp":
        # Each rank ends its window on its own clock: under DDP one rank's extra step would
        # wait in an all-reduce the others never join.
        p.error("--seconds-per-iter needs --mode ensemble")
    return args


def gpu_inventory(cuda: bool) -> tuple[int, str | None]:
    """This rank's view of its node: how many GPUs torch sees, and their name."""
    if not cuda:
        return 0, None
    return torch.cuda.device_count(), torch.cuda.get_device_name(torch.cuda.current_device())


class Placement(NamedTuple):
    """Where this rank runs: its place in the job and on its node, its device, every rank's
    hostname and GPU view (rank order), and the cores it may use."""
    comm: Any
    rank: int
    size: int
    local_rank: int
    hosts: list[str]
    cuda: bool
    device: torch.device
    gpus: list[tuple[int, str | None]]
    cores: int


def place_rank(no_cuda: bool) -> Placement:
    """Rank, node-local rank and device from MPI, the same way in every benchmark script
    (resnet_train.py imports it): a GPU per local rank where torch sees GPUs."""
    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    hosts = comm.allgather(socket.gethostname())
    cuda = not no_cuda and torch.cuda.is_available()
    device = torch.device("cuda", local.rank % max(1, torch.cuda.device_count())) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    gpus = comm.allgather(gpu_inventory(cuda))  # after set_device: each rank asks about its own GPU
    # why: N ranks on one host each defaulting to all cores oversubscribe the CPU;
    # mpirun may also bind a rank to fewer cores than that (then respect the binding).
    cores = min(len(os.sched_getaffinity(0)), max(1, (os.cpu_count() or 1) // local.size))
    return Placement(comm, comm.rank, comm.size, local.rank, hosts, cuda, device, gpus, cores)


def versions(cuda: bool, hosts: list[str], impl: str, gpus: list[tuple[int, str | None]] | None = None) -> dict[str, Any]:
    """The software and hardware record; `gpus`: every rank's gpu_inventory(), in rank order."""
    v: dict[str, Any] = {"python": platform.python_version(), "kernel": platform.release(), "torch": torch.__version__, "model_impl": impl,
         "torchvision": getattr(sys.modules.get("torchvision"), "__version__", None) if tv_models else None,
         "mpi4py": __import__("mpi4py").__version__, "mpi": mpi_library(),
         "hosts": sorted(set(hosts)), "world_size": len(hosts)}
    if cuda:
        v.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                 nccl=nccl_version_text(torch.cuda.nccl.version()), gpu=torch.cuda.get_device_name())
        if gpus:  # per node, as its ranks saw it: a node with fewer GPUs, or others, shows here
            v["gpu_count"] = {h: n for h, (n, _) in zip(hosts, gpus, strict=True)}
            v["gpu_names"] = {h: name for h, (_, name) in zip(hosts, gpus, strict=True)}
        if shutil.which("nvidia-smi"):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, check=False)
            v["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None
    return v


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comm, rank, size, local_rank, hosts, args.cuda, device, gpus, cores = place_rank(args.no_cuda)
    torch.set_num_threads(args.threads or max(1, cores))
    # Beats from here to the process's end (a daemon thread): a rank stuck in the
    # rendezvous, a step or the final gather is named by the step it was in.
    beat = Heartbeat.started(rank, args.heartbeat)
    beat.step = "setup"

    dp = args.mode == "dp" and size > 1
    if size > 1:  # also for ensemble: the same process group, so only DDP differs
        addr, port = rendezvous(comm, hosts)
        dist.init_process_group("nccl" if args.cuda else "gloo", init_method=f"tcp://{addr}:{port}",
                                rank=rank, world_size=size, timeout=datetime.timedelta(minutes=10))

    torch.manual_seed(0)  # same initial weights everywhere; DDP broadcasts rank 0's anyway
    model, impl = build_model(args.model)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=fmt)  # type: ignore[call-overload]  # torch's overloads omit memory_format
    if dp:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if args.cuda else None)
        if args.fp16_allreduce:
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    # lr scaled by world size as Horovod does; the value does not change the timing
    optimizer = optim.SGD(model.parameters(), lr=0.01 * size)

    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    data = data.contiguous(memory_format=fmt)
    target = torch.randint(0, 1000, (args.batch_size,), device=device)
    amp_dtype = torch.float16 if args.cuda else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp and args.cuda)

    def benchmark_step() -> None:
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
            loss = F.cross_entropy(model(data), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    def progress(**fields: Any) -> None:
        # Outside the timed work as far as it can be: one short line per batch, rank 0 only.
        if args.progress and rank == 0:
            print("PROGRESS " + json.dumps(fields), flush=True)

    def timed(n: int, phase: str, it: int = 0) -> float:
        def run() -> None:
            for b in range(n):
                benchmark_step()
                progress(phase=phase, iter=it, batch=b + 1, batches=n)
            if args.cuda:
                torch.cuda.synchronize()  # the clock stops when the GPU is done
        return timeit.timeit(run, number=1)

    def timed_for(seconds: float) -> tuple[int, float]:
        """Batches until `seconds` passed, every rank starting together: (batches, seconds)."""
        quiet_barrier(comm)
        start, n = time.perf_counter(), 0
        while True:
            benchmark_step()
            if args.cuda:
                torch.cuda.synchronize()
            n += 1
            if (elapsed := time.perf_counter() - start) >= seconds:
                return n, elapsed

    def log(s: str) -> None:
        if rank == 0:
            print(s, flush=True)

    dev = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {dev}s: {size}")
    log("Running warmup...")
    progress(phase="start", iters=args.num_iters, warmup=args.num_warmup_batches, batches=args.num_batches_per_iter)
    beat.step = "warmup"
    timed(args.num_warmup_batches, "warmup")
    log("Running benchmark...")
    img_secs: list[float] = []
    windows: list[float] = []  # --seconds-per-iter: each window's seconds on this rank
    for x in range(args.num_iters):
        beat.step = f"iter {x + 1}"
        if args.seconds_per_iter:
            batches, secs = timed_for(args.seconds_per_iter)
            img_sec = args.batch_size * batches / secs
            windows.append(secs)
        else:
            img_sec = args.batch_size * args.num_batches_per_iter / timed(args.num_batches_per_iter, "iter", x + 1)
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {dev}")
        progress(phase="iter_done", iter=x + 1, iters=args.num_iters, img_per_sec=img_sec)
        img_secs.append(img_sec)
    beat.step = "timeline" if args.timeline else "report"

    if args.timeline:
        # After the timed iterations, so the profiler's own cost never enters the figures.
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(args.timeline_steps):
                benchmark_step()
            if args.cuda:
                torch.cuda.synchronize()
        os.makedirs(args.timeline, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.timeline, f"rank{rank}-{hosts[rank]}.json"))
        comm.Barrier()  # every rank's file is there when rank 0 reports

    mine = {"rank": rank, "host": hosts[rank], "local_rank": local_rank,
            "img_per_sec": float(np.mean(img_secs)), "conf": float(1.96 * np.std(img_secs))}
    if windows:
        mine["window_s"] = windows
    beat.done_together(comm)
    ranks = comm.gather(mine)
    if rank == 0:
        total = sum(r["img_per_sec"] for r in ranks)
        conf = sum(r["conf"] for r in ranks)  # equals Horovod's N x conf when ranks agree
        log(f"Img/sec per {dev}: {total / size:.1f} +-{conf / size:.1f}")
        log(f"Total img/sec on {size} {dev}(s): {total:.1f} +-{conf:.1f}")
        if args.json:
            log(json.dumps({
                "benchmark": "resnet_synthetic", "model": args.model, "mode": args.mode, "device": dev,
                "batch_size": args.batch_size, "image_size": args.image_size, "world_size": size,
                "img_per_sec": total, "img_per_sec_per_rank": total / size, "conf": conf,
                "ranks": ranks, "iters_rank0": img_secs, "flags": vars(args),
                "versions": versions(args.cuda, hosts, impl, gpus)}))
    if size > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
