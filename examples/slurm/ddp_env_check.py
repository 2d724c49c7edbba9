"""A minimal torch.distributed program for env:// rendezvous (what torchrun sets up): every
rank adds its number in an all-reduce and says where it ran. gloo on CPUs, NCCL on GPUs.
Run by ddp_torchrun.sbatch; tests/integration/test_slurm.py runs both as they are here."""

import socket

import torch
import torch.distributed as dist

dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", rank % torch.cuda.device_count()) if torch.cuda.is_available() else torch.device("cpu")
total = torch.ones(1, device=device) * (rank + 1)
dist.all_reduce(total)
print(f"rank {rank} of {world} on {socket.gethostname()}: sum {int(total.item())}", flush=True)
dist.destroy_process_group()
