"""`deployer bench`: the node-count sweep, run on the master, aggregated into results.

Every remote step is one shell command string run on the master through a Runner
(the caller's SSH session); the same strings are saved to commands.sh beside the
results, so each run can be repeated by hand on the master. Order:

  1. hostfile.N for each N (the first N lines of <shared>/hostfile)
  2. for each N: resnet_synthetic.py in --mode (dp), and ensemble at the largest N
     (or at every N with ensemble_every_n) for the communication share
  3. allreduce.py at the largest N (when it is >= 2)
  With --via slurm each run of 2 and 3 is an sbatch job instead of an mpirun: its script
  saved in the run dir (here and on the master), submitted and followed by
  benchmarks/slurm_job.py on the master, which prints the same lines mpirun would.
  3b. on GPU nodes: the non-empty NCCL warning logs the runs left in the run dir, copied back
  4. iperf3 master -> first worker, one way and --bidir: the rates busbw is read against
  5. with --net: iperf3 between every pair of nodes (a ring beyond 8 nodes), one at a
     time, for the matrix and the slowest link

`bench --data` (deployer/bench/training.py: time to a target accuracy on real data) runs its
own sweep on the same Session: the commands log, the launch by mpirun or sbatch, the stop
of every rank after a failure and the NCCL logs are one code path for both.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from deployer import ui
from deployer.bench import report as bench_report
from deployer.bench.failure import diagnose, untag
from deployer.bench.progress import RunProgress, SweepProgress
from deployer.errors import OperationFailed, UsageError

if TYPE_CHECKING:
    from deployer.cluster import Cluster, Node

MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
MODES = ("dp", "ensemble")
ALLREDUCE_BACKENDS = ("auto", "mpi", "torch")
LAUNCHERS = ("mpirun", "slurm")  # --via: mpirun over the hostfile, or an sbatch job per run
_SIZE = re.compile(r"(\d+)([KMG]?)", re.IGNORECASE)


class Runner(Protocol):
    def run(self, cmd: str, *, timeout: float, on_line: Callable[[str], None] | None = None) -> tuple[int, str, str]:
        """Run `cmd` in a bash login shell on the master as the cluster user: rc, stdout,
        stderr; each stdout line also goes to `on_line` as it arrives."""
        ...


class Launch(Protocol):
    """What a sweep's options say about launching runs (BenchOptions, training.TrainOptions)."""
    via: str
    run_timeout_s: int
    queue_timeout_s: int


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


def cpu_sharing(cluster: Cluster, opts: "BenchOptions") -> dict[str, Any] | None:
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


# --- the remote commands: each one string a user could type on the master ---------
def run_dir(cluster: Cluster, run_id: str) -> str:
    return f"{cluster.shared_dir}/bench/{run_id}"


def hostfiles_cmd(cluster: Cluster, run_id: str, counts: tuple[int, ...]) -> str:
    d = run_dir(cluster, run_id)
    return (f"mkdir -p {d} && for n in {' '.join(map(str, counts))}; do "
            f"head -n $n {cluster.shared_dir}/hostfile > {d}/hostfile.$n; done")


NCCL_DEBUG = "WARN"


def nccl_log_pattern(cluster: Cluster, run_id: str) -> str:
    """Where every rank of a GPU run writes NCCL's warnings: the run dir on the shared
    storage, one file per process (NCCL expands %h to the host, %p to the pid)."""
    return f"{run_dir(cluster, run_id)}/nccl.%h.%p.log"


def nccl_env(cluster: Cluster, run_id: str) -> dict[str, str]:
    """NCCL_DEBUG / NCCL_DEBUG_FILE for the runs on GPU nodes; none on CPU nodes (gloo)."""
    if not cluster.has_gpus:
        return {}
    return {"NCCL_DEBUG": NCCL_DEBUG, "NCCL_DEBUG_FILE": nccl_log_pattern(cluster, run_id)}


def mpirun_cmd(cluster: Cluster, run_id: str, n: int, timeout_s: int, script: str, args: list[str]) -> str:
    np_ = len(cluster.rank_nodes(n))
    root = " --allow-run-as-root" if cluster.ssh_user == "root" else ""
    # why these flags: --bind-to none lets torch use every core of a node (Open MPI
    # binds to one core by default for np <= 2); -x carries the login shell's PATH
    # (the training env's python) and the socket interface to every rank; an unset
    # name is only a warning. timeout --kill-after bounds a hung rank.
    # --tag-output prefixes each line with its rank, so a failure names the rank that died.
    # On GPU nodes -x NAME=value also sets NCCL's warning log for every rank: a file per
    # process in the run dir, so a warning on a worker is not lost in rank 0's stdout.
    nccl = "".join(f" -x {k}={v}" for k, v in nccl_env(cluster, run_id).items())
    return (f"timeout --kill-after=30 {timeout_s} mpirun{root} --tag-output --hostfile {run_dir(cluster, run_id)}/hostfile.{n}"
            f" -np {np_} --map-by slot --bind-to none -x PATH -x GLOO_SOCKET_IFNAME -x NCCL_SOCKET_IFNAME{nccl}"
            f" python {cluster.shared_dir}/benchmarks/{script} " + " ".join(args))


# --- --via slurm: one sbatch job per run -------------------------------------------
def job_name(run_id: str) -> str:
    """Every job of one bench run has this name: `scancel --name` stops them all."""
    return f"deployer-bench-{run_id}"


def sbatch_script(cluster: Cluster, run_id: str, n: int, timeout_s: int, name: str, script: str, args: list[str]) -> str:
    """The batch script of one run: the same benchmark command mpirun_cmd starts, as an sbatch
    job a user can copy. The cluster's nodes are alike (one flavor), so the first node's GPU
    count is every node's: one task per GPU, one per node on CPU nodes (the hostfile's rule)."""
    d = run_dir(cluster, run_id)
    node = cluster.master
    lines = [
        # a login shell: the training venv and gloo/NCCL settings from /etc/profile.d, as on the master
        "#!/bin/bash -l",
        f"# deployer bench {run_id}: {name} on {n} node(s); a template for your own jobs (docs/slurm.md)",
        f"#SBATCH --job-name={job_name(run_id)}",
        f"#SBATCH --nodes={n}",
        f"#SBATCH --ntasks-per-node={node.slots}",
        *([f"#SBATCH --gpus-per-node={node.gpus}"] if node.gpus else []),
        # whole nodes, as the mpirun path has them: without it the job gets one core per task
        "#SBATCH --exclusive",
        f"#SBATCH --time={math.ceil(timeout_s / 60)}",
        f"#SBATCH --output={d}/{name}.out",
        f"#SBATCH --error={d}/{name}.err",
        *(f"export {k}={v}" for k, v in nccl_env(cluster, run_id).items()),
        # --cpu-bind=none as mpirun's --bind-to none (torch uses every core); --kill-on-bad-exit:
        # one dead rank ends the step, the rest do not hang. No --label: with it srun cuts lines
        # at 1024 bytes (Slurm 22.05), and rank 0's JSON record is longer
        f"srun --mpi=pmix --cpu-bind=none --kill-on-bad-exit=1 python {cluster.shared_dir}/benchmarks/{script} "
        + " ".join(args),
    ]
    return "\n".join(lines) + "\n"


def submit_cmd(cluster: Cluster, run_id: str, name: str, job_script: str, queue_timeout_s: int) -> str:
    """Write the job script into the run dir on the master, submit it and follow it there."""
    path = f"{run_dir(cluster, run_id)}/{name}.sbatch"
    return (f"cat > {path} <<'EOF_SBATCH'\n{job_script}EOF_SBATCH\n"
            f"python {cluster.shared_dir}/benchmarks/slurm_job.py --queue-timeout {queue_timeout_s} {path}")


def stop_cmd(cluster: Cluster, run_id: str, opts: Launch) -> str:
    """What leaves no rank running after a failed or interrupted run: under Slurm, cancel
    this bench's jobs (killing by process name could hit other users' jobs); else pkill."""
    return f"scancel --name={job_name(run_id)}" if opts.via == "slurm" else cleanup_cmd(cluster)


NCCL_LOG_TAIL = 65536  # bytes of each NCCL log brought back; WARN-level logs are far smaller


def nccl_logs_cmd(cluster: Cluster, run_id: str) -> str:
    """Print every non-empty NCCL log of the run, each after a '==> name <==' line (as tail does;
    the echo after each ends a last line that has no newline, so the next header starts a line)."""
    return (f"cd {run_dir(cluster, run_id)} && for f in nccl.*.log; do [ -s \"$f\" ] || continue; "
            f"echo \"==> $f <==\"; tail -c {NCCL_LOG_TAIL} \"$f\"; echo; done; true")


def resnet_args(opts: BenchOptions, mode: str) -> list[str]:
    args = ["--json", "--mode", mode, "--model", opts.model, "--batch-size", str(opts.batch_size),
            "--image-size", str(opts.image_size), "--num-warmup-batches", str(opts.num_warmup_batches),
            "--num-batches-per-iter", str(opts.num_batches_per_iter), "--num-iters", str(opts.num_iters)]
    for flag in ("fp16_allreduce", *GPU_DEFAULTS):
        if getattr(opts, flag):
            args.append("--" + flag.replace("_", "-"))
    if opts.threads:
        args += ["--threads", str(opts.threads)]
    return args


def modes_at(opts: BenchOptions, n: int, top: int) -> list[str]:
    """The runs at N nodes: the chosen mode, and ensemble beside dp at the largest N (or
    every N) for the communication share. At N=1 there is nothing to exchange."""
    modes = [opts.mode]
    if opts.mode == "dp" and (opts.ensemble_every_n or n == top) and n > 1:
        modes.append("ensemble")
    return modes


def allreduce_args(opts: BenchOptions) -> list[str]:
    return ["--json", "-b", opts.allreduce_min, "-e", opts.allreduce_max, "-f", "2",
            "--backend", opts.allreduce_backend]


def iperf_cmd(worker_ip: str, bidir: bool = False) -> str:
    ip = shlex.quote(worker_ip)
    return (f"ssh -o BatchMode=yes {ip} iperf3 -s -1 -D && sleep 1 && "
            f"timeout 30 iperf3 -c {ip} -J -t 3" + (" --bidir" if bidir else ""))


def cleanup_cmd(cluster: Cluster) -> str:
    shared = cluster.shared_dir.rstrip("/")
    # why the brackets: the regex [/]shared/... matches the benchmark processes but not
    # this command line (nor the shell running it), so pkill cannot kill itself.
    pattern = f"[{shared[0]}]{shared[1:]}/benchmarks/"
    remote = shlex.quote(f"pkill -f {shlex.quote(pattern)}")
    hosts = " ".join(shlex.quote(n.private_ip) for n in cluster.nodes)
    return f"for h in {hosts}; do ssh -o BatchMode=yes -o ConnectTimeout=5 $h {remote}; done; true"


# --- parsing -----------------------------------------------------------------------
def parse_json_line(stdout: str, what: str) -> dict[str, Any]:
    """The last line of stdout that is a JSON object (rank 0's --json record)."""
    for line in reversed(stdout.splitlines()):
        line = untag(line)[2].strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    raise OperationFailed(f"{what} printed no JSON result line")


ALL_PAIRS_UP_TO = 8  # n(n-1)/2 pairs: 28 at 8 nodes, about 2 minutes; a ring beyond


def net_pairs(cluster: Cluster) -> list[tuple[Node, Node]]:
    """(src, dst) node pairs to measure: every pair up to 8 nodes, else a ring."""
    nodes = cluster.nodes
    if len(nodes) <= ALL_PAIRS_UP_TO:
        return [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    return [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]


def pair_cmd(src_ip: str, dst_ip: str) -> str:
    """iperf3 from src to dst, typed on the master: a one-shot server on dst, the client on src."""
    src, dst = shlex.quote(src_ip), shlex.quote(dst_ip)
    return (f"ssh -o BatchMode=yes {dst} iperf3 -s -1 -D && sleep 1 && "
            f"ssh -o BatchMode=yes {src} timeout 30 iperf3 -c {dst} -J -t 2")


def parse_iperf(stdout: str) -> float:
    """Gbit/s received, from iperf3 -J; with --bidir the slower of the two directions."""
    end = json.loads(stdout[stdout.index("{"):])["end"]
    rates = [end[k]["bits_per_second"] for k in ("sum_received", "sum_received_bidir_reverse") if k in end]
    return min(rates) / 1e9


def cluster_record(cluster: Cluster) -> dict[str, Any]:
    """The cluster a sweep ran on, for the report's reproducibility record (both sweeps)."""
    machine = cluster.machine or {}
    return {"provider": cluster.provider, "image": machine.get("image"), "flavor": machine.get("flavor"),
            "cluster_nodes": len(cluster.nodes), "gpus_per_node": [n.gpus for n in cluster.nodes]}


# --- the sweep -----------------------------------------------------------------------
class Session:
    """The remote steps of one bench run, shared by every sweep: each command appended to
    commands.sh in outdir and logged to <name>.log; a failed one stops every rank (stop_cmd)
    and raises OperationFailed naming its log. `launch` makes the command of one benchmark
    run: an mpirun over the hostfile, or (--via slurm) a job script saved here, then
    written, submitted and followed on the master."""

    def __init__(self, runner: Runner, cluster: Cluster, opts: Launch, run_id: str, outdir: Path):
        self.runner, self.cluster, self.opts, self.run_id = runner, cluster, opts, run_id
        self.outdir = Path(outdir)
        self.outdir.mkdir(parents=True, exist_ok=True)
        self.script = self.outdir / "commands.sh"
        self.script.write_text(f"# deployer bench {run_id}: the same runs, typed by hand on the master\n")
        self.nccl = nccl_env(cluster, run_id)  # GPU nodes: where every rank's NCCL warnings go
        self.job_scripts: list[str] = []
        # the runner waits past timeout's --kill-after; under Slurm also for the queue
        self.limit = opts.run_timeout_s + 60 + (opts.queue_timeout_s + 60 if opts.via == "slurm" else 0)

    def remote(self, name: str, cmd: str, timeout: float, *, cleanup: bool = True,
               on_line: Callable[[str], None] | None = None, nodes: int = 0) -> str:
        with self.script.open("a") as f:
            f.write(cmd + "\n")
        log = self.outdir / f"{name}.log"
        rc, out, err = self.runner.run(cmd, timeout=timeout,
                                       on_line=(lambda line: on_line(untag(line)[2])) if on_line else None)
        log.write_text(f"$ {cmd}\n# exit {rc}\n{out}\n# --- stderr ---\n{err}")
        if rc != 0:
            if cleanup:
                self.runner.run(stop_cmd(self.cluster, self.run_id, self.opts), timeout=60)  # leave no rank running
            why = diagnose(rc, out, err, self.cluster.rank_nodes(nodes), self.opts.run_timeout_s)
            if nodes and self.nccl:  # the sweep stops here, so the logs stay on the master: name them
                why += f"; NCCL warnings, if any: {self.nccl['NCCL_DEBUG_FILE']} on the master"
            raise OperationFailed(f"{name} failed: {why}", log=log)
        return out

    def launch(self, name: str, n: int, script: str, args: list[str]) -> str:
        opts = self.opts
        if opts.via != "slurm":
            return mpirun_cmd(self.cluster, self.run_id, n, opts.run_timeout_s, script, args)
        job = sbatch_script(self.cluster, self.run_id, n, opts.run_timeout_s, name, script, args)
        saved = self.outdir / f"{name}.sbatch"
        saved.write_text(job)
        self.job_scripts.append(str(saved))
        return submit_cmd(self.cluster, self.run_id, name, job, opts.queue_timeout_s)

    def copy_nccl_logs(self) -> Path | None:
        """GPU nodes: the non-empty NCCL warning logs the runs left in the run dir, copied to
        outdir/nccl.log (None: no GPUs, or no warnings). A failure to copy is a warning."""
        if not self.nccl:
            return None
        try:
            logs = self.remote("nccl-logs", nccl_logs_cmd(self.cluster, self.run_id), 120, cleanup=False)
        except OperationFailed as e:  # results stand without it; the files stay on the master
            logs = ""
            ui.warn(f"NCCL logs not copied ({e}); they are on the master: {self.nccl['NCCL_DEBUG_FILE']}")
        count = sum(1 for line in logs.splitlines() if line.startswith("==> "))
        if not count:
            ui.ok("NCCL wrote no warnings")
            return None
        copy = self.outdir / "nccl.log"
        copy.write_text(logs)
        ui.warn(f"NCCL wrote warnings in {count} log(s): {copy} (on the master: {self.nccl['NCCL_DEBUG_FILE']})")
        return copy


def run_bench(runner: Runner, cluster: Cluster, opts: BenchOptions, run_id: str,
              outdir: Path) -> dict[str, Any]:
    """Run the sweep on the cluster; write results into outdir; return the --json record."""
    session = Session(runner, cluster, opts, run_id, outdir)
    outdir, remote, launch, nccl, limit = session.outdir, session.remote, session.launch, session.nccl, session.limit
    job_scripts = session.job_scripts

    top = max(opts.nodes)
    ui.step(f"bench {run_id}: profile {opts.profile}: {opts.model}, batch {opts.batch_size}/rank, {opts.image_size}px, "
            f"mode {opts.mode}, nodes {','.join(map(str, opts.nodes))}"
            + (f", {opts.threads} thread(s) per rank" if opts.threads else "")
            + (", each run an sbatch job" if opts.via == "slurm" else ""))
    if opts.profile_reason != "--profile":
        ui.info(f"  profile {opts.profile}: {opts.profile_reason}")
    ui.info(f"  {bench_report.precision_text(asdict(opts))}"
            + (f" — auto: {'on with GPU nodes' if cluster.has_gpus else 'off on CPU-only nodes'}; "
               "--[no-]amp and --[no-]channels-last choose" if opts.auto_flags else ""))
    if nccl:
        ui.info(f"  NCCL_DEBUG={nccl['NCCL_DEBUG']}: each rank's NCCL warnings go to {nccl['NCCL_DEBUG_FILE']}")
    sharing = cpu_sharing(cluster, opts)
    if sharing:
        ui.info(f"  the nodes share this machine's {sharing['shared_cpus']} cores: {opts.threads} thread(s) per rank at every N, "
                f"so E(N) cannot pass {', '.join(f'{v:.2f} at N={k}' for k, v in sharing['efficiency_ceiling'].items())}")
    remote("hostfiles", hostfiles_cmd(cluster, run_id, opts.nodes), 60, cleanup=False)

    resnet: list[tuple[int, dict[str, Any]]] = []
    timeline: Path | None = None
    runs = [(n, mode) for n in opts.nodes for mode in modes_at(opts, n, top)]
    took: list[float] = []
    for i, (n, mode) in enumerate(runs, 1):
        # The sweep's ETA from the runs so far: rough (a larger N takes longer), said so.
        eta = f", sweep ETA about {sum(took) / len(took) * (len(runs) - i + 1):.0f}s" if took else ""
        ui.step(f"resnet_synthetic on {n} node(s), {mode} (run {i}/{len(runs)}{eta})")
        started = time.monotonic()
        extra = ["--progress"]
        profiled = opts.timeline and n == top and mode == opts.mode
        if profiled:
            extra += ["--timeline", f"{run_dir(cluster, run_id)}/timeline"]
        cmd = launch(f"resnet-{mode}-{n}", n, "resnet_synthetic.py", resnet_args(opts, mode) + extra)
        with RunProgress(f"{n} node(s) {mode}") as progress:
            out = remote(f"resnet-{mode}-{n}", cmd, limit, on_line=progress, nodes=n)
        res = parse_json_line(out, f"resnet_synthetic ({mode}, {n} nodes)")
        took.append(time.monotonic() - started)
        resnet.append((n, res))
        ui.ok(f"{n} node(s) {mode}: {res['img_per_sec']:.1f} img/s total, {res['img_per_sec_per_rank']:.1f} per rank")
        if profiled:
            merged = remote("timeline", f"python {cluster.shared_dir}/benchmarks/merge_timeline.py {run_dir(cluster, run_id)}/timeline", 300)
            timeline = outdir / "timeline.json"
            timeline.write_text(merged)
            ui.ok(f"timeline of every rank at {n} node(s): {timeline} (open in ui.perfetto.dev or chrome://tracing)")

    allreduce: list[tuple[int, dict[str, Any]]] = []
    if top >= 2:
        ui.step(f"all-reduce sweep on {top} nodes ({opts.allreduce_min}..{opts.allreduce_max})")
        cmd = launch(f"allreduce-{top}", top, "allreduce.py", allreduce_args(opts))
        ar = parse_json_line(remote(f"allreduce-{top}", cmd, limit, nodes=top, on_line=SweepProgress()), "allreduce")
        allreduce.append((top, ar))
        ui.ok(f"all-reduce: avg busbw {ar['avg_busbw_gb_s']:.3f} GB/s, "
              f"max {max(r['busbw_gb_s'] for r in ar['rows']):.3f} GB/s, {ar['wrong']} wrong")
    else:
        ui.info("all-reduce skipped: it needs 2 or more nodes")

    nccl_copy = session.copy_nccl_logs()

    link = bidir = None
    workers = [n for n in cluster.nodes if n.role != "master"]
    if workers:
        ui.step(f"iperf3 link rate: master -> {workers[0].name}")
        ip = workers[0].private_ip
        try:
            link = parse_iperf(remote("iperf3", iperf_cmd(ip), 60, cleanup=False))
            # why also --bidir: a ring all-reduce sends and receives at once; where the
            # CPU moves the bytes (LXC veth) that halves what each direction gets
            bidir = parse_iperf(remote("iperf3-bidir", iperf_cmd(ip, bidir=True), 60, cleanup=False))
        except (OperationFailed, ValueError, KeyError) as e:  # results stand without it
            ui.warn(f"iperf3 failed ({e}); busbw is reported without a link rate")
        if link:
            ui.ok(f"link {link:.2f} Gbit/s = {bench_report.gbit_to_gbyte(link):.3f} GB/s one way"
                  + (f", {bidir:.2f} Gbit/s each way with --bidir" if bidir else ""))

    network = None
    if opts.net and len(cluster.nodes) > 1:
        pairs = net_pairs(cluster)
        ui.step(f"iperf3 between {'every pair of nodes' if len(cluster.nodes) <= ALL_PAIRS_UP_TO else 'neighbours in a ring'} "
                f"({len(pairs)} pair(s), one at a time)")
        measured = []
        for i, (a, b) in enumerate(pairs, 1):
            try:
                rate = parse_iperf(remote(f"net-{a.name}-{b.name}", pair_cmd(a.private_ip, b.private_ip), 60, cleanup=False))
                ui.info(f"  [{i}/{len(pairs)}] {a.name} -> {b.name}: {rate:.2f} Gbit/s")
            except (OperationFailed, ValueError, KeyError) as e:
                rate = None
                ui.warn(f"{a.name} -> {b.name}: no rate ({e})")
            measured.append({"src": a.name, "dst": b.name, "gbit_s": rate})
        network = bench_report.network_summary(measured)
        if network["slowest"]:
            ui.ok(f"slowest link {network['slowest']['src']} -> {network['slowest']['dst']}: "
                  f"{network['slowest']['gbit_s']:.2f} Gbit/s (median {network['median_gbit_s']:.2f})")

    versions = {
        "benchmark": resnet[0][1].get("versions", {}) if resnet else {},
        "allreduce": allreduce[0][1].get("versions", {}) if allreduce else None,
        **cluster_record(cluster),
        "node_counts": list(opts.nodes),
        "flags": asdict(opts),
        "cpu_sharing": sharing,
        "nccl_debug": nccl or None,  # the NCCL_DEBUG / NCCL_DEBUG_FILE every GPU run had
    }
    report = bench_report.aggregate(run_id, resnet, allreduce, link, versions, mode=opts.mode,
                                    link_bidir_gbit_s=bidir, network=network)
    if timeline:
        report["files"]["timeline"] = str(timeline)
    if nccl_copy:
        report["files"]["nccl_logs"] = str(nccl_copy)
    if job_scripts:
        report["files"]["job_scripts"] = job_scripts
        ui.ok(f"job scripts, templates for your own sbatch jobs: {outdir}/*.sbatch")
    bench_report.write_files(report, outdir)
    ui.ok(f"results in {outdir}")
    return report


Sweep = Callable[[Runner, "Cluster", Any, str, Path], dict[str, Any]]


def run_on_cluster(state: Any, cluster: Cluster, opts: Launch, sweep: Sweep | None = None) -> dict[str, Any]:
    """A sweep on the master (run_bench, or training.run_train for --data), under the
    cluster's bench lock (one benchmark at a time); on Ctrl-C no rank is left running on any node."""
    from deployer.remote import MasterRunner

    runner = MasterRunner(state, cluster)
    with state.lock("bench"):
        run_id = time.strftime("%Y%m%d-%H%M%S")
        try:
            return (sweep or run_bench)(runner, cluster, opts, run_id, state.bench_dir / run_id)
        except KeyboardInterrupt:
            if opts.via == "slurm":
                ui.warn(f"interrupted: cancelling this bench's Slurm jobs (scancel --name={job_name(run_id)})")
            runner.run(stop_cmd(cluster, run_id, opts), timeout=60)
            raise


def push_results(state: Any, cluster: Cluster, report: dict[str, Any]) -> bool:
    """The report -> the Pushgateway on the master, through an SSH tunnel (-> Grafana's
    Benchmarks dashboard). A failure is a warning: the results are in the state dir."""
    from deployer.bench import metrics
    from deployer.credentials import pushgateway_login
    from deployer.remote import ssh_argv
    from deployer.tunnel import open_tunnel

    master = cluster.master
    try:
        with open_tunnel(ssh_argv(state, master), master.private_ip, metrics.PUSHGATEWAY_PORT) as port:
            metrics.push_bench_results(f"http://127.0.0.1:{port}", report, login=pushgateway_login(state.secrets_dir))
    except (OperationFailed, OSError) as e:
        ui.warn(f"results not pushed to the Pushgateway ({e}); they are saved in the state dir")
        return False
    ui.ok("results pushed to the Pushgateway (deployer_bench_* series; Grafana: Benchmarks dashboard)")
    return True
