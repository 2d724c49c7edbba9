"""`deployer bench --via slurm` in the fast tier: a recorded sweep replayed, the job scripts,
the follower's reading of Slurm, failure diagnosis and progress. No Slurm here.

Recorded on a real local 2-node cluster with `scheduler: slurm` (Slurm 22.05, Debian 12):
- tests/fixtures/bench/sweep_slurm_2node_recorded.json: every command of a `--via slurm`
  sweep (scripts/record_slurm_sweep.py) and what benchmarks/slurm_job.py printed back;
- tests/fixtures/bench/srun_rank_exception.txt: the follower's stdout and stderr for a job
  whose rank 1 raised (srun --kill-on-bad-exit then terminated rank 0);
- tests/fixtures/slurm/scontrol_show_job.txt: `scontrol show job -o` lines of jobs that
  completed, failed, were cancelled while pending or running, ran out of time, and one pending.
The integration test (tests/integration/test_slurm.py) runs the same path on real Slurm.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import pytest

from deployer.bench import commands, profiles
from deployer.bench import sweep as bench
from deployer.bench.progress import RunProgress, SweepProgress
from deployer.cluster import Cluster
from deployer.errors import OperationFailed, UsageError
from deployer.launch.failure import diagnose

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
RECORDED = json.loads((FIXTURES / "bench" / "sweep_slurm_2node_recorded.json").read_text())
FLAGS = dict(nodes="1,2", model="resnet18", image_size=32, batch_size=8, num_iters=2, num_batches_per_iter=3,
             num_warmup_batches=1, allreduce_max="64K", via="slurm")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


slurm_job = _load(ROOT / "benchmarks" / "slurm_job.py", "slurm_job")


class ReplayRunner:
    """Answers each command with the recorded answer, after checking it is the recorded command."""

    def __init__(self, shared: str, calls: list[dict]):
        self.calls = [{**c, "cmd": c["cmd"].replace("{shared}", shared)} for c in calls]
        self.commands: list[str] = []

    def run(self, cmd: str, *, timeout: float, on_line=None) -> tuple[int, str, str]:
        self.commands.append(cmd)
        want = self.calls.pop(0)
        assert cmd == want["cmd"], f"sent:\n{cmd}\nthe recorded sweep sent:\n{want['cmd']}"
        if on_line:
            for line in want["stdout"].splitlines():
                on_line(line)
        return want["rc"], want["stdout"], want["stderr"]


@pytest.fixture
def replay(tmp_path):
    shared = str(tmp_path / "shared")
    cluster = Cluster.parse(json.loads(json.dumps(RECORDED["cluster"]).replace("{shared}", shared)))
    return cluster, ReplayRunner(shared, RECORDED["calls"])


def test_the_recorded_slurm_sweep_sends_the_same_jobs_and_makes_the_report(replay, tmp_path):
    cluster, runner = replay
    opts = profiles.make_options(cluster, **FLAGS)
    out = tmp_path / "bench" / RECORDED["run_id"]
    rep = bench.run_bench(runner, cluster, opts, RECORDED["run_id"], out)
    assert runner.calls == [], "every recorded command was sent, in order, the same"
    assert [(r["nodes"], r["ranks"]) for r in rep["results"]] == [(1, 1), (2, 2)]
    assert all(r["img_per_sec"] > 0 for r in rep["results"])
    assert rep["allreduce"] and rep["versions"]["flags"]["via"] == "slurm"
    # the job scripts: saved here, one per run, each the script the command wrote on the master
    names = [Path(p).name for p in rep["files"]["job_scripts"]]
    assert names == ["resnet-dp-1.sbatch", "resnet-dp-2.sbatch", "resnet-ensemble-2.sbatch", "allreduce-2.sbatch"]
    for path, cmd in zip(rep["files"]["job_scripts"], runner.commands[1:5], strict=True):
        text = Path(path).read_text()
        assert text.startswith("#!/bin/bash -l\n") and f"\n{text}EOF_SBATCH\n" in cmd
    assert json.loads((out / "results.json").read_text())["files"]["job_scripts"] == rep["files"]["job_scripts"]


def test_the_job_script_asks_slurm_for_what_the_mpirun_path_uses(replay):
    cluster, _ = replay
    opts = profiles.make_options(cluster, **FLAGS)
    args = commands.resnet_args(opts, "dp")
    text = commands.sbatch_script(cluster, "r1", 2, 1800, "resnet-dp-2", "resnet_synthetic.py", args)
    lines = text.splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --ntasks-per-node=1" in lines
    assert "#SBATCH --exclusive" in lines and "#SBATCH --time=30" in lines
    assert "#SBATCH --job-name=deployer-bench-r1" in lines
    assert not any("gpus-per-node" in ln or "NCCL" in ln for ln in lines)
    srun = lines[-1]
    assert srun.startswith("srun --mpi=pmix --cpu-bind=none --kill-on-bad-exit=1 python ")
    assert srun.endswith("/benchmarks/resnet_synthetic.py " + " ".join(args))
    # the same benchmark command as the mpirun path's, launcher aside
    mpirun = commands.mpirun_cmd(cluster, "r1", 2, 1800, "resnet_synthetic.py", args)
    assert mpirun.endswith(srun.split(" python ", 1)[1])


def test_on_gpu_nodes_one_task_per_gpu_and_nccl_warnings_in_the_run_dir(replay):
    cluster, _ = replay
    cluster = dataclasses.replace(cluster, nodes=tuple(dataclasses.replace(n, gpus=2) for n in cluster.nodes))
    text = commands.sbatch_script(cluster, "r1", 2, 600, "allreduce-2", "allreduce.py", ["--json"])
    lines = text.splitlines()
    assert "#SBATCH --ntasks-per-node=2" in lines and "#SBATCH --gpus-per-node=2" in lines and "#SBATCH --time=10" in lines
    assert f"export NCCL_DEBUG_FILE={commands.nccl_log_pattern(cluster, 'r1')}" in lines and "export NCCL_DEBUG=WARN" in lines


def test_a_failed_job_is_named_by_rank_and_node_and_only_this_benchs_jobs_are_cancelled(replay, tmp_path):
    cluster, runner = replay
    out, _, err = (FIXTURES / "bench" / "srun_rank_exception.txt").read_text().partition("----\n")
    runner.calls[2] = {**runner.calls[2], "rc": 143, "stdout": out, "stderr": err}  # resnet-dp-2
    runner.calls.insert(3, {"cmd": f"scancel --name=deployer-bench-{RECORDED['run_id']}", "rc": 0, "stdout": "", "stderr": ""})
    opts = profiles.make_options(cluster, **FLAGS)
    with pytest.raises(OperationFailed) as e:
        bench.run_bench(runner, cluster, opts, RECORDED["run_id"], tmp_path / "b")
    assert str(e.value).startswith("resnet-dp-2 failed: rank 1 on sdev-worker-1: exited with exit code 1; "
                                   "its last words: ValueError: boom on rank 1")
    assert runner.commands[3] == f"scancel --name=deployer-bench-{RECORDED['run_id']}", "no pkill across the nodes under Slurm"


def test_diagnose_srun_prefers_the_task_that_exited_over_the_ones_killed_after_it():
    out, _, err = (FIXTURES / "bench" / "srun_rank_exception.txt").read_text().partition("----\n")
    assert "task 0: Terminated" in err  # rank 0 was killed after rank 1 died
    assert diagnose(143, out, err, [], 60).startswith("rank 1 on sdev-worker-1: exited with exit code 1")


@pytest.mark.parametrize(("flags", "msg"), [
    ({"via": "slrum"}, "--via 'slrum': use one of mpirun, slurm"),
    ({"via": "slurm", "queue_timeout_s": 0}, "--queue-timeout must be positive"),
])
def test_bad_launcher_flags_are_usage_errors(replay, flags, msg):
    cluster, _ = replay
    with pytest.raises(UsageError, match=re.escape(msg)):
        profiles.make_options(cluster, nodes="1,2", **flags)


# --- the follower on the master (benchmarks/slurm_job.py) ---------------------------
SCONTROL = {int(m.group(1)): line for line in (FIXTURES / "slurm" / "scontrol_show_job.txt").read_text().splitlines()
            if (m := re.match(r"JobId=(\d+) ", line))}


def by_state(state: str) -> dict[str, str]:
    for line in SCONTROL.values():
        f = slurm_job.job_fields(line)
        if f["JobState"] == state:
            return f
    raise AssertionError(f"no {state} job in the fixture")


def test_scontrol_fields_of_recorded_jobs():
    done = by_state("COMPLETED")
    assert done["StdOut"] == "/dev/null" and done["NumNodes"] == "1" and done["ExitCode"] == "0:0"
    assert by_state("FAILED")["StdErr"] == "/shared/f.err"
    pending = by_state("PENDING")
    assert pending["Reason"] == "Resources" and pending["NumNodes"] == "2-2" and slurm_job.node_count(pending) == 2


# FAILED: the batch script's exit, srun's 143 (its last task was terminated, 128 + SIGTERM);
# TIMEOUT: ExitCode=0:15 in Slurm's words, 124 as timeout(1) says it, so the bench says "timed out"
@pytest.mark.parametrize(("state", "rc"), [("COMPLETED", 0), ("FAILED", 143), ("TIMEOUT", 124)])
def test_exit_codes_as_a_shell_reports_them(state, rc):
    assert slurm_job.exit_code(by_state(state)) == rc


def test_a_cancelled_job_is_never_a_success():
    codes = {slurm_job.exit_code(slurm_job.job_fields(line)) for line in SCONTROL.values()
             if "JobState=CANCELLED" in line}
    assert codes and 0 not in codes


def test_the_follower_hands_on_whole_lines_only(tmp_path):
    f = tmp_path / "job.out"
    follow = slurm_job.Follower(str(f))
    assert follow.read() == []  # not there yet (the job has not started)
    f.write_text("Model: resnet18\n{\"img_per")
    assert follow.read() == ["Model: resnet18"]
    with f.open("a") as h:
        h.write("_sec\": 1}\nlast line without newline")
    assert follow.read() == ['{"img_per_sec": 1}']
    assert follow.read(final=True) == ["last line without newline"]


# --- progress while a job waits --------------------------------------------------------
def test_a_queued_job_says_what_it_waits_for_at_once():
    now, said = [0.0], []
    p = RunProgress("2 node(s) dp", every_s=5, clock=lambda: now[0], emit=said.append)
    p("slurm job 7 submitted (/shared/bench/r/resnet-dp-2.sbatch)")
    now[0] = 1.0
    p('PROGRESS {"phase": "start", "iters": 2, "warmup": 1, "batches": 3}')  # emitted (5 s since the last)
    now[0] = 2.0  # within the interval, but a wait must not look like a hang
    p('PROGRESS {"phase": "queued", "job": "7", "nodes": 2, "reason": "Resources", "waited_s": 1}')
    assert said[-1] == "2 node(s) dp · waiting for 2 node(s) (Resources), 1s in the queue"
    sweep: list[str] = []
    SweepProgress(emit=sweep.append)('PROGRESS {"phase": "queued", "job": "8", "nodes": 2, "reason": "Priority", "waited_s": 0}')
    assert sweep == ["all-reduce · waiting for 2 node(s) (Priority), 0s in the queue"]
