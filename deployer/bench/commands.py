"""The shell command strings a sweep runs on the master: pure functions of the options.
The same strings are saved to commands.sh beside the results (deployer/bench/sweep.py), so
each run can be repeated by hand. The mpirun line, the stop and the iperf3 pairs are
deployer/launch/'s, shared with `deployer check`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..launch.mpirun import cleanup_cmd, mpirun_line
from .profiles import GPU_DEFAULTS

if TYPE_CHECKING:
    from ..cluster import Cluster
    from .profiles import BenchOptions, Launch


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
    # mpirun_line says why each flag; on GPU nodes every rank also gets NCCL's warning log:
    # a file per process in the run dir, so a warning on a worker is not lost in rank 0's stdout.
    return mpirun_line(cluster, f"{run_dir(cluster, run_id)}/hostfile.{n}", np_, timeout_s, script, args,
                       env=nccl_env(cluster, run_id))


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
