"""The benchmark report's schema: what results.json, `bench --json`, the console tables,
the plots and the Pushgateway series are made from.

The bench builds the report as a plain dict (deployer/bench/report.py) and validates it
here before anything is written, so a report on disk always has this shape. Version 2
added `network` (bench --net), `files.timeline` and `versions.kernel`; version 3 `reference`
(NVIDIA's published figure for the run's GPU) and `files.nccl_logs`; version 4
`files.job_scripts` (bench --via slurm: the sbatch script of every run); version 5 `training`
(bench --data: time to a target accuracy on real data, per node count) and
`versions.dataset`; version 6 the data-loading figures of each training run (img/s in
memory, loading cost, data wait, read MB/s) and the shared storage's reads from
node_exporter; version 7 `hosts` on each scaling row (how many hypervisors the run's nodes
spanned, from the cluster record's placement); `load` reads 1 to 7.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import RecordError, UsageError

SCHEMA = 7
READABLE = (1, 2, 3, 4, 5, 6, 7)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScalingRow(_Model):
    nodes: int = Field(ge=1)
    ranks: int = Field(ge=1)
    img_per_sec: float = Field(ge=0)
    img_per_sec_per_rank: float = Field(ge=0)
    efficiency: float | None  # E(N) = T_N / (N * T_1)
    mode: str
    model: str | None
    batch_size: int | None
    image_size: int | None
    baseline_nodes: int
    ensemble_img_per_sec: float | None = None
    comm_share: float | None = None  # 1 - dp / ensemble; negative means noise: rerun
    hosts: int | None = None  # hypervisors the run's nodes spanned (placement); None: not known


class AllreduceRow(_Model):
    nodes: int = Field(ge=2)
    bytes: int = Field(ge=4)
    time_us: float
    algbw_gb_s: float
    busbw_gb_s: float
    wrong: int = Field(ge=0)


class Link(_Model):
    tool: str = "iperf3"
    gbit_s: float
    bidir_gbit_s: float | None = None


class Pair(_Model):
    src: str
    dst: str
    gbit_s: float | None


class Network(_Model):
    tool: str = "iperf3"
    pairs: list[Pair]
    slowest: Pair | None
    median_gbit_s: float | None


class Files(_Model):
    json_: str | None = Field(None, alias="json")
    csv: str | None = None
    plots: list[str] = []
    timeline: str | None = None  # bench --timeline: every rank's trace, merged (Chrome trace format)
    nccl_logs: str | None = None  # GPU runs: the non-empty NCCL_DEBUG_FILE logs, copied back from the run dir
    job_scripts: list[str] = []  # bench --via slurm: each run's sbatch script, a template for the user's own jobs


class Source(_Model):
    url: str
    table: str
    note: str | None = None


class Reference(_Model):
    """NVIDIA's published training throughput for the run's GPU (deployer/data/nvidia_resnet50_reference.json)."""
    model: str
    gpu: str  # the name the run's GPU reported (torch.cuda.get_device_name())
    gpu_pattern: str  # the regular expression of the file's entry it matched
    system: str
    img_per_sec_per_gpu: float = Field(gt=0)
    gpus: int = Field(ge=1)
    precision: str
    image_size: int | None = None  # the input size NVIDIA trained at (224): only a run at it is compared
    batch_size: int | None = None
    memory_format: str | None = None
    container: str | None = None
    source: Source


class Epoch(_Model):
    """One epoch of benchmarks/resnet_train.py (its --json history), as the report keeps it."""
    epoch: int = Field(ge=1)
    top1: float = Field(ge=0, le=1)  # on the whole test split
    img_per_sec: float = Field(ge=0)  # training images / training seconds, data loading included
    epoch_s: float = Field(ge=0)  # training + evaluation
    elapsed_s: float = Field(ge=0)  # the run's training + evaluation so far: the time-to-accuracy clock
    loss: float | None = None
    lr: float | None = None  # at the epoch's last step
    data_wait_frac: float | None = Field(None, ge=0)  # of training time, a rank waited for its loader (mean of ranks)
    read_mb_per_s: float | None = Field(None, ge=0)  # dataset bytes the loaders read / training seconds


class StorageReads(_Model):
    """The shared storage's reads during one run, from node_exporter (deployer/bench/storage_reads.py)."""
    window_s: int = Field(ge=1)  # the query's range: the run plus one scrape interval
    run_s: float = Field(ge=0)
    nfs_clients_mb_per_s: float | None  # None: no NFS client counters (local: a bind mount)
    master_disk_mb_per_s: float | None
    note: str | None  # why a figure is missing, or what it means here


class TrainingRun(_Model):
    """resnet_train.py on N nodes: how long to the target top-1, and how it got there."""
    nodes: int = Field(ge=1)
    ranks: int = Field(ge=1)
    epochs: int = Field(ge=1)  # the most it could run
    epochs_run: int = Field(ge=0)
    reached: bool
    time_to_target_s: float | None  # None: not reached within `epochs`
    epochs_to_target: int | None
    final_top1: float | None
    best_top1: float | None
    model: str
    batch_size: int = Field(ge=1)  # per rank
    global_batch: int = Field(ge=1)
    base_lr: float  # per 256 images
    peak_lr: float  # base_lr * global_batch / 256
    history: list[Epoch]
    img_per_sec: float | None = Field(None, ge=0)  # the median epoch's, data loading included
    compute_img_per_sec: float | None = Field(None, ge=0)  # the same step on one batch in memory
    loading_cost: float | None = None  # 1 - img_per_sec / compute_img_per_sec
    data_wait_frac: float | None = Field(None, ge=0)  # the median epoch's
    read_mb_per_s: float | None = Field(None, ge=0)  # the median epoch's, the loaders' own count
    storage: StorageReads | None = None  # None: monitoring off, or no epoch run


class Training(_Model):
    dataset: str
    target_acc: float = Field(gt=0, le=1)
    runs: list[TrainingRun]


class Report(_Model):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    schema_: int = Field(alias="schema")
    run_id: str
    results: list[ScalingRow]
    allreduce: list[AllreduceRow]
    link: Link | None
    network: Network | None = None
    files: Files
    versions: dict[str, Any]  # the reproducibility record: software, flags, cluster
    reference: Reference | None = None
    training: Training | None = None  # bench --data


def validate(report: dict[str, Any]) -> dict[str, Any]:
    """The report, checked against the schema (a bench bug raises here, before any file)."""
    return Report.model_validate(report).model_dump(by_alias=True)


def load(path: Path) -> dict[str, Any]:
    """A results.json from disk; another version or a damaged file is one line naming it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not a readable benchmark report ({e.__class__.__name__})") from None
    if not isinstance(data, dict) or data.get("schema") not in READABLE:
        found = data.get("schema") if isinstance(data, dict) else None
        raise RecordError(f"{path}: report schema {found} is not one of {READABLE}; use the deployer version that wrote it")
    try:
        return Report.model_validate(data).model_dump(by_alias=True)
    except ValidationError as e:
        first = e.errors()[0]
        raise RecordError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def find(bench_dir: Path, run_id: str | None) -> Path:
    """The results.json of run `run_id` in a cluster's bench dir (None: the latest run);
    one that is not there is one line naming the runs that are."""
    runs = sorted(p.parent.name for p in Path(bench_dir).glob("*/results.json"))
    if not runs:
        raise UsageError(f"no benchmark results in {bench_dir}: run `deployer bench` first")
    if run_id is None:
        return Path(bench_dir) / runs[-1] / "results.json"  # run ids are timestamps: the last sorts last
    if run_id not in runs:
        shown = ", ".join(runs[-5:]) + (f" and {len(runs) - 5} older" if len(runs) > 5 else "")
        raise UsageError(f"no benchmark run {run_id!r} in {bench_dir}; there are: {shown}")
    return Path(bench_dir) / run_id / "results.json"
