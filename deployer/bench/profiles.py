"""What a `deployer bench` sweep runs: the named profiles, the options the flags and the
profile resolve to (BenchOptions), and the sizing that keeps ranks sharing a host's cores
from oversubscribing them. No I/O: deployer/bench/sweep.py runs what this decides."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import UsageError

if TYPE_CHECKING:
    from ..cluster import Cluster

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
MODES = ("dp", "ensemble")
ALLREDUCE_BACKENDS = ("auto", "mpi", "torch")
LAUNCHERS = ("mpirun", "slurm")  # --via: mpirun over the hostfile, or an sbatch job per run
_SIZE = re.compile(r"(\d+)([KMG]?)", re.IGNORECASE)


# Named sets of the sizing flags. horovod: the defaults of Horovod's synthetic benchmark,
# comparable with its published figures (minutes per run on a GPU, about an hour for a
# 1..3 sweep on CPU containers). quick: the whole sweep in a few minutes on CPUs.
# standard: ResNet-50 at a size a CPU cluster finishes in tens of minutes.
PROFILES: dict[str, dict[str, Any]] = {
    "quick": {"model": "resnet18", "image_size": 64, "batch_size": 16, "num_warmup_batches": 3,
              "num_batches_per_iter": 5, "num_iters": 5, "allreduce_max": "16M"},
    "standard": {"model": "resnet50", "image_size": 128, "batch_size": 32, "num_warmup_batches": 5,
                 "num_batches_per_iter": 10, "num_iters": 5, "allreduce_max": "64M"},
    "horovod": {"model": "resnet50", "image_size": 224, "batch_size": 32, "num_warmup_batches": 10,
                "num_batches_per_iter": 10, "num_iters": 10, "allreduce_max": "64M"},
}


@dataclass(frozen=True)
class BenchOptions:
    nodes: tuple[int, ...]
    model: str = "resnet50"
    batch_size: int = 32
    image_size: int = 224
    mode: str = "dp"
    num_warmup_batches: int = 10
    num_batches_per_iter: int = 10
    num_iters: int = 10
    profile: str = "horovod"
    profile_reason: str = "--profile"
    threads: int | None = None  # torch threads per rank; None: the benchmark's own choice
    fp16_allreduce: bool = False  # opt-in, as in Horovod's pytorch_synthetic_benchmark.py
    amp: bool = False
    channels_last: bool = False
    auto_flags: tuple[str, ...] = ()  # which of amp / channels_last were chosen by the hardware, not asked for
    ensemble_every_n: bool = False
    net: bool = False  # iperf3 between every pair of nodes
    timeline: bool = False  # torch.profiler trace of every rank at the largest N, merged
    allreduce_min: str = "1K"
    allreduce_max: str = "64M"
    allreduce_backend: str = "auto"
    run_timeout_s: int = 3600  # wall-clock bound of one mpirun (of one Slurm job once it runs)
    via: str = "mpirun"
    queue_timeout_s: int = 3600  # --via slurm: how long one job may wait in the queue


def parse_node_counts(text: str | None, cluster_size: int) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); None -> 1, 2, 4, ... up to the cluster size, and the size itself."""
    if text is None or not text.strip():
        counts, n = [], 1
        while n < cluster_size:
            counts.append(n)
            n *= 2
        return tuple(counts + [cluster_size])
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UsageError(f"--nodes {text!r} is not a list of node counts: use e.g. --nodes 1,2,4")
    counts = [int(p) for p in parts]
    if min(counts) < 1:
        raise UsageError("--nodes: node counts start at 1: use e.g. --nodes 1,2,4")
    if len(set(counts)) != len(counts):
        raise UsageError(f"--nodes {text!r} repeats a node count: list each count once")
    if max(counts) > cluster_size:
        raise UsageError(f"--nodes: the cluster has {cluster_size} node(s), not {max(counts)}: "
                         f"use counts up to {cluster_size} or scale the cluster up first")
    return tuple(sorted(counts))


def size_bytes(text: str) -> int:
    m = _SIZE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"message size {text!r}: use bytes with an optional K/M/G suffix, e.g. 64M")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def choose_profile(cluster: Cluster, profile: str | None) -> tuple[str, str]:
    """The profile to run and why: the one asked for, else by the hardware."""
    if profile is not None:
        if profile not in PROFILES:
            raise UsageError(f"--profile {profile!r}: use one of {', '.join(PROFILES)}")
        return profile, "--profile"
    if cluster.has_gpus:
        return "horovod", "GPU nodes: Horovod's synthetic-benchmark defaults"
    return "quick", ("CPU-only nodes: Horovod's ResNet-50 at 224 px takes about an hour here; "
                     "`--profile horovod` runs the comparable study")


# Flags whose default follows the hardware: on GPUs the field measures with mixed precision
# and NHWC (NVIDIA's published ResNet-50 figures are AMP, channels-last), so a run without
# them reads as a slow GPU; on CPUs neither helps the gloo runs this repository measures.
GPU_DEFAULTS = ("amp", "channels_last")


def gpu_defaults(cluster: Cluster, asked: dict[str, bool | None]) -> tuple[dict[str, bool], tuple[str, ...]]:
    """amp and channels_last: what was asked for (True/False), else on with GPU nodes and off
    on CPU-only ones. Returns the values and the names chosen automatically."""
    on = cluster.has_gpus
    values = {k: on if asked.get(k) is None else bool(asked[k]) for k in GPU_DEFAULTS}
    return values, tuple(k for k in GPU_DEFAULTS if asked.get(k) is None)


def threads_per_rank(cluster: Cluster, counts: tuple[int, ...]) -> int | None:
    """Torch threads per rank so that the largest run does not oversubscribe the CPUs.

    Nodes that share one machine's cores (the cluster output's `shared_cpus`: local
    containers all see every host core) would each start a thread per core: N nodes,
    N x cores threads. The same count is used at every N, so E(N) compares like with
    like. None where every node has its own CPUs (the benchmark sizes itself).
    """
    shared = cluster.shared_cpus
    if not shared:
        return None
    ranks = len(cluster.rank_nodes(max(counts)))
    return max(1, int(shared) // ranks)


def cpu_sharing(cluster: Cluster, opts: Sized) -> dict[str, Any] | None:
    """For the report: nodes share cores, so E(N) cannot pass cores / (ranks x threads)."""
    shared = cluster.shared_cpus
    if not shared or not opts.threads:
        return None
    ceiling = {}
    for n in opts.nodes:
        ranks = len(cluster.rank_nodes(n))
        ceiling[str(n)] = round(min(1.0, int(shared) / (ranks * opts.threads)), 3)
    return {"shared_cpus": int(shared), "threads_per_rank": opts.threads, "efficiency_ceiling": ceiling}


def make_options(cluster: Cluster, *, nodes: str | None = None, profile: str | None = None, **flags: Any) -> BenchOptions:
    """Validate the bench flags against the cluster before anything runs (UsageError, exit 2).
    Flags left None take the profile's value; the profile is chosen by the hardware
    unless named."""
    name, why = choose_profile(cluster, profile)
    given = {k: v for k, v in flags.items() if v is not None}
    counts = parse_node_counts(nodes, len(cluster.nodes))
    chosen, auto = gpu_defaults(cluster, {k: flags.get(k) for k in GPU_DEFAULTS})
    merged = {**PROFILES[name], **given, **chosen, "auto_flags": auto, "profile": name, "profile_reason": why}
    if "threads" not in given:
        merged["threads"] = threads_per_rank(cluster, counts)
    opts = BenchOptions(nodes=counts, **merged)
    if opts.model not in MODELS:
        raise UsageError(f"--model {opts.model!r} is not known: use one of {', '.join(MODELS)}")
    if opts.mode not in MODES:
        raise UsageError(f"--mode {opts.mode!r}: use dp or ensemble")
    if opts.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if opts.image_size < 32:
        raise UsageError("--image-size must be at least 32 (ResNet downsamples 32x)")
    for name in ("num_warmup_batches", "num_batches_per_iter", "num_iters", "run_timeout_s"):
        if getattr(opts, name) < (0 if name == "num_warmup_batches" else 1):
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if opts.threads is not None and opts.threads < 1:
        raise UsageError("--threads must be at least 1")
    if opts.via not in LAUNCHERS:
        raise UsageError(f"--via {opts.via!r}: use one of {', '.join(LAUNCHERS)}")
    if opts.queue_timeout_s < 1:
        raise UsageError("--queue-timeout must be positive")
    if opts.allreduce_backend not in ALLREDUCE_BACKENDS:
        raise UsageError(f"--allreduce-backend: use one of {', '.join(ALLREDUCE_BACKENDS)}")
    if size_bytes(opts.allreduce_min) < 4 or size_bytes(opts.allreduce_max) < size_bytes(opts.allreduce_min):
        raise UsageError("all-reduce sizes: need 4 <= min <= max, e.g. 1K and 64M")
    return opts


class Launch(Protocol):
    """What a sweep's options say about launching runs (BenchOptions, training.TrainOptions)."""
    @property
    def via(self) -> str: ...
    @property
    def run_timeout_s(self) -> int: ...
    @property
    def queue_timeout_s(self) -> int: ...


class Sized(Protocol):
    """What a sweep's options say about its size (BenchOptions, training.TrainOptions)."""
    @property
    def nodes(self) -> tuple[int, ...]: ...
    @property
    def threads(self) -> int | None: ...
