#!/usr/bin/env python3
"""Does this node's torch run on its GPUs? Prints one JSON record; exit 0 when it does.

    python /shared/benchmarks/gpu_check.py

Checks what a wrong wheel gets wrong: the CUDA torch was built with, the architectures
it carries against each GPU's compute capability, a small CUDA operation, and an NCCL
all-reduce among all of this node's GPUs (one process per GPU, as DDP runs them). The
training_runtime role runs it on every GPU node after installing torch and reads the
verdict with deployer.gpu_facts.check_problems, which names the node and the cause.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

from bench_common import nccl_version_text


def _allreduce(rank: int, world: int, init_file: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if int(t[0].item()) != world:
        raise RuntimeError(f"all-reduce of ones over {world} GPUs gave {t[0].item()}")
    dist.destroy_process_group()


# An all-reduce of 4 MB among one node's GPUs takes milliseconds; NCCL's first one, with
# its set-up, seconds. P2P over a badly virtualised PCIe (ACS/IOMMU left on in the VM) can
# instead hang forever: that is a finding, not a wait.
NCCL_TIMEOUT_S = int(os.environ.get("DEPLOYER_GPU_CHECK_NCCL_TIMEOUT_S", "180"))
STALLED = ("timed out after {s} s: the all-reduce among this node's GPUs stalled (often GPU peer-to-peer over "
           "a virtualised PCIe: ask the cloud about PCI ACS/IOMMU for this flavor, or try NCCL_P2P_DISABLE=1)")


def spawn_with_deadline(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, timeout_s: float) -> str:
    """Run fn(rank, *args) in `nprocs` processes; "ok", the first error, or a time-out after
    which every process is killed."""
    import time

    from torch.multiprocessing.spawn import start_processes

    ctx = start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                for proc in ctx.processes:
                    proc.kill()
                for proc in ctx.processes:
                    proc.join(10)
                return STALLED.format(s=round(timeout_s))
    except Exception as e:  # noqa: BLE001 - the cause goes into the record
        return " ".join(str(e).split())[-300:] or type(e).__name__
    return "ok"


def nccl_allreduce(world: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return spawn_with_deadline(_allreduce, (world, os.path.join(tmp, "init")), world, NCCL_TIMEOUT_S)


def main() -> int:
    record: dict[str, Any] = {"host": socket.gethostname()}
    try:
        import torch

        record.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
        try:
            record["cuda_available"] = torch.cuda.is_available()
        except Exception as e:  # noqa: BLE001
            record.update(cuda_available=False, cuda_error=str(e))
        if not record["cuda_available"]:
            print(json.dumps(record))
            return 1
        n = torch.cuda.device_count()
        record["arch_list"] = torch.cuda.get_arch_list()
        record["devices"] = [{"index": i, "name": torch.cuda.get_device_name(i),
                              "compute_cap": "{}.{}".format(*torch.cuda.get_device_capability(i))} for i in range(n)]
        try:
            x = torch.randn(256, 256, device="cuda")
            y = (x @ x.T).sum().item()
            record["cuda_op"] = "ok" if y == y else "matmul gave NaN"  # noqa: PLR0124 - NaN check
        except Exception as e:  # noqa: BLE001
            record["cuda_op"] = " ".join(str(e).split())[:300]
        record["nccl_version"] = nccl_version_text(torch.cuda.nccl.version())
        record["nccl"] = nccl_allreduce(n) if record["cuda_op"] == "ok" else "skipped: the CUDA operation failed"
    except Exception:  # noqa: BLE001 - e.g. torch does not import: say why, in the record
        record["error"] = traceback.format_exc().strip().splitlines()[-1]
    print(json.dumps(record))
    return 0 if record.get("cuda_op") == "ok" and record.get("nccl") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
