#!/usr/bin/env python3
"""Point-to-point latency between every pair of ranks: the latency matrix of `deployer check`.

    mpirun -np N --hostfile hostfile --map-by node python pingpong.py [--iters 200] [--json] [--heartbeat 1]

One pair at a time (the others wait at a barrier), rank i sends 8 bytes to rank j and j
sends them back, `--iters` times after a warm-up; the pair's latency is the median
half round trip in microseconds. Rank 0 prints the matrix, and with --json one line
{"benchmark": "pingpong", "hosts": [...], "pairs": [{"a", "b", "us"}...]}. With
--heartbeat S every rank prints HEARTBEAT lines every S seconds (bench_common.Heartbeat):
a rank that stops is named by the silence of its own.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from contextlib import nullcontext

import numpy as np
from bench_common import Heartbeat
from mpi4py import MPI

TAG = 7


def pair_latency(comm: MPI.Comm, a: int, b: int, iters: int, warmup: int) -> float | None:
    """Median half round trip (us) between ranks a and b, seen from a; None elsewhere."""
    buf = np.zeros(2, dtype=np.float32)
    times: list[float] = []
    for i in range(warmup + iters):
        if comm.rank == a:
            t0 = time.perf_counter()
            comm.Send(buf, dest=b, tag=TAG)
            comm.Recv(buf, source=b, tag=TAG)
            if i >= warmup:
                times.append((time.perf_counter() - t0) / 2 * 1e6)
        elif comm.rank == b:
            comm.Recv(buf, source=a, tag=TAG)
            comm.Send(buf, dest=a, tag=TAG)
    return statistics.median(times) if times else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.add_argument("--heartbeat", type=float, default=0, help="seconds between HEARTBEAT lines (0: none)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    hosts = comm.allgather(socket.gethostname())
    beat = Heartbeat(comm.rank, args.heartbeat) if args.heartbeat else None
    pairs = []
    with beat or nullcontext():
        for a in range(comm.size):
            for b in range(a + 1, comm.size):
                if beat:
                    beat.step = f"pair {a}-{b}"
                comm.Barrier()
                us = pair_latency(comm, a, b, args.iters, args.warmup)
                us = comm.bcast(us, root=a)
                pairs.append({"a": a, "b": b, "us": round(us, 1)})
        comm.Barrier()
    if comm.rank == 0:
        for pr in pairs:
            print(f"# {hosts[pr['a']]:>16s} <-> {hosts[pr['b']]:<16s} {pr['us']:10.1f} us", flush=True)
        if args.json:
            print(json.dumps({"benchmark": "pingpong", "hosts": hosts, "iters": args.iters, "pairs": pairs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
