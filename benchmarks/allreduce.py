#!/usr/bin/env python3
"""All-reduce bandwidth sweep in the style of NVIDIA nccl-tests' all_reduce_perf.

    mpirun -np 3 --hostfile hostfile --bind-to none python allreduce.py -b 8 -e 64M -f 2

Per size: time (us, mean per op, averaged over ranks), algbw = S/t and
busbw = algbw * 2(n-1)/n in GB/s (1e9 bytes), #wrong = elements that differ from
the exactly known float32 sum. Rank and world size come from mpi4py.

Backends:
  torch  torch.distributed all_reduce (in-place): gloo on CPU, NCCL on GPU.
  mpi    mpi4py Allreduce on numpy float32 buffers (out-of-place, like nccl-tests).
  auto   (default) torch: the library the training itself uses, so busbw predicts
         what DDP's gradient exchange can get.

# why torch/gloo and not MPI by default on CPUs: measured side by side over TCP on
# a busy 2-core host (2 ranks, 16-64 MiB), gloo gave 0.7-1.3 GB/s busbw and Open
# MPI's tcp btl 0.2-1.7 GB/s: MPI busy-polls, which collapses when ranks share
# cores (3 LXC nodes on 2 cores), gloo blocks in the kernel. --chunk (several ops in
# flight on --threads gloo workers) made no difference beyond the noise there; it
# stays as a knob for real NICs. Ceiling to read busbw against: a ring all-reduce
# sends and receives at once, so where the CPU moves the bytes (veth, loopback) the
# iperf3 --bidir rate per direction, about half the one-way rate, is the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import sys
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
from bench_common import Heartbeat, mpi_library, rendezvous
from mpi4py import MPI

if TYPE_CHECKING:  # annotations only: torch is imported where the torch backend runs
    import torch


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)B?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 8, 1K, 64M, 1G")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1, help="check correctness (0/1)")
    p.add_argument("--backend", choices=["auto", "mpi", "torch"], default="auto")
    p.add_argument("--chunk", type=parse_size, default=0,
                   help="torch: split tensors into chunks of this many bytes, all in flight")
    p.add_argument("--threads", type=int, default=2, help="torch/gloo: worker threads")
    p.add_argument("--no-cuda", action="store_true", help="torch: stay on CPU (gloo)")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON line at the end")
    p.add_argument("--heartbeat", type=float, default=0,
                   help="every rank prints HEARTBEAT lines every this many seconds (bench_common.Heartbeat; 0: none)")
    a = p.parse_args(argv)
    if a.minbytes < 4 or a.maxbytes < a.minbytes or a.stepfactor < 2 or a.iters < 1:
        p.error("need 4 <= minbytes <= maxbytes, stepfactor >= 2, iters >= 1")
    return a


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out: list[int]
    out, s = [], lo
    while s <= hi:
        out.append(s - s % 4)  # whole float32 elements, as nccl-tests aligns
        s *= factor
    return out


def bandwidths(nbytes: int, sec: float, nranks: int) -> tuple[float, float]:
    algbw = nbytes / 1e9 / sec
    return algbw, algbw * 2 * (nranks - 1) / nranks  # 0 for one rank, as nccl-tests


class MpiOp:
    name = "mpi"

    def __init__(self, comm: MPI.Comm, count: int) -> None:
        self.comm = comm
        self.send = np.empty(count, np.float32)
        self.recv = np.empty(count, np.float32)

    def fill(self, values: np.ndarray) -> None:
        self.send[:] = values

    def run(self) -> None:
        self.comm.Allreduce(self.send, self.recv, op=MPI.SUM)

    def result(self) -> np.ndarray:
        return self.recv

    def sync(self) -> None:
        pass


class TorchOp:
    name = "torch"

    def __init__(self, pg: Any, count: int, device: torch.device, chunk_elems: int) -> None:
        import torch
        self.torch, self.pg, self.device = torch, pg, device
        self.buf = torch.empty(count, dtype=torch.float32, device=device)
        step = chunk_elems or count
        self.chunks = list(self.buf.split(step))

    def fill(self, values: np.ndarray) -> None:
        self.buf.copy_(self.torch.from_numpy(values))

    def run(self) -> None:
        # all chunks in flight at once: gloo spreads them over its worker threads
        for w in [self.pg.allreduce([c]) for c in self.chunks]:
            w.wait()

    def result(self) -> np.ndarray:
        return self.buf.cpu().numpy()

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


def torch_group(comm: MPI.Comm, args: argparse.Namespace) -> tuple[Any, torch.device, str]:
    import datetime

    import torch
    import torch.distributed as dist
    cuda = not args.no_cuda and torch.cuda.is_available()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    device = torch.device("cuda", local.rank % max(1, torch.cuda.device_count())) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    addr, port = rendezvous(comm, comm.allgather(socket.gethostname()))
    timeout = datetime.timedelta(minutes=10)
    store = dist.TCPStore(addr, port, comm.size, comm.rank == 0, timeout=timeout)  # type: ignore[attr-defined]  # re-exported implicitly
    if cuda:
        dist.init_process_group("nccl", store=store, rank=comm.rank, world_size=comm.size, device_id=device)
        return dist.group.WORLD, device, "nccl"
    # why a hand-built ProcessGroupGloo: init_process_group cannot set gloo's worker
    # thread count, and chunks in flight need threads to overlap.
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private: not in torch's stubs
    names = [n for n in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n]
    opts._devices = ([dist.ProcessGroupGloo.create_device(interface=n) for n in names]
                     or [dist.ProcessGroupGloo.create_default_device()])
    opts._threads = args.threads
    opts._timeout = timeout
    return dist.ProcessGroupGloo(store, comm.rank, comm.size, opts), device, "gloo"


def versions(comm: MPI.Comm, backend: str, lib: str) -> dict[str, Any]:
    v = {"python": platform.python_version(), "numpy": np.__version__,
         "mpi4py": __import__("mpi4py").__version__,
         "mpi": mpi_library(), "backend": backend, "library": lib}
    if backend == "torch":
        import torch
        v["torch"] = torch.__version__
        if lib == "nccl":
            v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            v["cuda"] = torch.version.cuda
    v["hosts"] = sorted(set(comm.allgather(socket.gethostname())))
    return v


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, n = comm.rank, comm.size
    backend = args.backend
    if backend == "auto":
        try:
            import torch  # noqa: F401
            backend = "torch"
        except ImportError:
            backend = "mpi"
    if backend == "torch":
        pg, device, lib = torch_group(comm, args)
    else:
        lib = "mpi"

    def say(line: str = "") -> None:
        if rank == 0:
            print(line, flush=True)

    say(f"# nThread 1 nGpus 1 minBytes {args.minbytes} maxBytes {args.maxbytes} step: {args.stepfactor}(factor) "
        f"warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 validation: {args.check} graph: 0")
    chunk = f", chunk {args.chunk} B" if backend == "torch" and args.chunk else ""
    say(f"# backend: {backend} ({lib}{chunk})")
    say("#\n# Using devices")
    for r, (host, pid) in enumerate(comm.gather((socket.gethostname(), os.getpid())) or []):
        say(f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10s} device  0 [{'cuda' if lib == 'nccl' else 'cpu'}]")
    place = "in-place" if backend == "torch" else "out-of-place"
    say("#\n#" + " " * 62 + f"{place:12s}")
    say("#       size         count      type   redop    root     time   algbw   busbw #wrong")
    say("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       ")

    rows = []
    beat = Heartbeat(rank, args.heartbeat) if args.heartbeat else None
    with beat or nullcontext():  # the beat joined whatever happens (see Heartbeat.__exit__)
        for nbytes in sizes(args.minbytes, args.maxbytes, args.stepfactor):
            if beat:
                beat.step = f"{nbytes} bytes"
            count = nbytes // 4
            op: TorchOp | MpiOp
            if backend == "torch":
                op = TorchOp(pg, count, device, args.chunk // 4)
            else:
                op = MpiOp(comm, count)
            # timing data: 1/n per element keeps in-place sums near 1 (no overflow)
            op.fill(np.full(count, 1.0 / n, np.float32))
            for _ in range(args.warmup_iters):
                op.run()
            op.sync()
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                op.run()
            op.sync()
            sec = comm.allreduce((time.perf_counter() - t0) / args.iters) / n  # rank average
            wrong = -1
            if args.check:
                # rank r holds (r+1) + i%16: the sum n(n+1)/2 + n*(i%16) is exact in float32
                pattern = (np.arange(count) % 16).astype(np.float32)
                op.fill(pattern + (rank + 1))
                op.run()
                op.sync()
                expect = pattern * n + n * (n + 1) / 2
                wrong = comm.allreduce(int(np.count_nonzero(op.result() != expect)))
            algbw, busbw = bandwidths(nbytes, sec, n)
            us = sec * 1e6
            t = f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"
            say(f"{nbytes:12d}  {count:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}  {t}  {algbw:6.2f}  {busbw:6.2f}  "
                f"{wrong if args.check else 'N/A':>5}")
            rows.append({"bytes": nbytes, "count": count, "type": "float", "time_us": round(us, 3),
                         "algbw_gb_s": round(algbw, 6), "busbw_gb_s": round(busbw, 6), "wrong": wrong})

    avg = sum(r["busbw_gb_s"] for r in rows) / len(rows)
    total_wrong = sum(max(0, r["wrong"]) for r in rows)
    say(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
    say(f"# Avg bus bandwidth    : {avg:g} ")
    say("#")
    ver = versions(comm, backend, lib)
    if args.json:
        say(json.dumps({"benchmark": "allreduce", "backend": backend, "library": lib, "world_size": n,
                        "rows": rows, "avg_busbw_gb_s": avg, "wrong": total_wrong,
                        "flags": vars(args), "versions": ver}))
    if backend == "torch":
        comm.Barrier()  # nobody tears the store down while a peer still uses it
    return 1 if total_wrong else 0


if __name__ == "__main__":
    sys.exit(main())
