"""`deployer bench --data` (deployer.bench.training) in the fast tier: real resnet_train.py output replayed.

tests/fixtures/bench/train_digits/ holds what benchmarks/resnet_train.py printed on this
machine, training on the digits dataset to top-1 0.9 at 1 and 2 ranks, and a 2-rank run
that stops below its target (how: the README there). Here each command the sweep sends
gets the recorded answer, so the sweep's commands, the report, time to accuracy per N,
the plots and the Slurm job scripts are checked in seconds; tests/unit/test_resnet_train.py
runs the script itself.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path

import pytest

from deployer import ui
from deployer.bench import commands, metrics, storage_reads
from deployer.bench import report as bench_report
from deployer.bench import schema as bench_schema
from deployer.bench import training as bench_train
from deployer.bench.progress import RunProgress
from deployer.cluster import Cluster
from deployer.errors import UsageError
from deployer.launch import mpirun
from deployer.launch.failure import untag

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "train_digits"
MANIFEST = (FIX / "dataset.json").read_text()
RUNS = {"train-1": (FIX / "train-1.out").read_text(), "train-2": (FIX / "train-2.out").read_text(),
        "miss-2": (FIX / "miss-2.out").read_text()}
# What `storage_reads.query_cmd` printed on a local cluster's master (curl against its Prometheus)
PROMETHEUS = (FIX / "storage_queries.out").read_text()


def record(name: str) -> dict:
    return mpirun.parse_json_line(RUNS[name], name)


def make_cluster(shared: str) -> Cluster:
    node = {"gpus": 0, "public_ip": None, "role": "worker"}
    return Cluster.parse({"name": "t", "provider": "local", "ssh_user": "deployer", "shared_dir": shared, "shared_cpus": None,
            "shared_storage": "host_bind",
            "access": "direct", "machine": {"image": "debian-bookworm (LXC, debootstrap)", "flavor": "container"},
            "nodes": [{**node, "name": "t-master", "id": "a", "private_ip": "10.9.0.10", "role": "master"},
                      {**node, "name": "t-worker-1", "id": "b", "private_ip": "10.9.0.11"}]})


class ReplayRunner:
    """Answers the manifest check, the hostfiles and each training run (by its node count)
    with what was recorded; `slurm`: the follower's lines, which carry no mpirun rank tags."""

    def __init__(self, answers: dict[int, str], *, manifest: str = MANIFEST, slurm: bool = False):
        self.answers, self.manifest, self.slurm = answers, manifest, slurm
        self.commands: list[str] = []

    def run(self, cmd: str, *, timeout: float, on_line=None) -> tuple[int, str, str]:
        self.commands.append(cmd)
        if "dataset.json" in cmd:
            return 0, self.manifest, ""
        if "/api/v1/query" in cmd:
            return 0, PROMETHEUS, ""
        if "resnet_train.py" not in cmd:
            return 0, "", ""
        n = int(re.search(r"ckpt-(\d+)", cmd).group(1))
        out = self.answers[n]
        if self.slurm:
            out = "".join(untag(line)[2] + "\n" for line in out.splitlines())
        for line in out.splitlines():
            if on_line:
                on_line(line)
        return 0, out, ""


@pytest.fixture
def cluster(tmp_path):
    return make_cluster(str(tmp_path / "shared"))


def sweep(cluster, runner, tmp_path, **flags):
    opts = bench_train.make_train_options(cluster, data="digits", target_acc=0.9, nodes="1,2", **flags)
    out = tmp_path / "bench" / "run1"
    return bench_train.run_train(runner, cluster, opts, "run1", out), out


def test_the_sweep_sends_the_check_the_hostfiles_and_one_training_run_per_n(cluster, tmp_path):
    runner = ReplayRunner({1: RUNS["train-1"], 2: RUNS["train-2"]})
    rep, out = sweep(cluster, runner, tmp_path)
    shared = cluster.shared_dir
    assert runner.commands[0] == bench_train.manifest_cmd(cluster, "digits")
    assert runner.commands[1] == commands.hostfiles_cmd(cluster, "run1", (1, 2))
    for cmd, n in zip(runner.commands[2:4], (1, 2), strict=True):
        assert cmd == commands.mpirun_cmd(cluster, "run1", n, 3600, "resnet_train.py", [
            "--data", f"{shared}/datasets/digits", "--target-acc", "0.9",
            "--checkpoint-dir", f"{shared}/bench/run1/ckpt-{n}", "--json", "--progress", "--heartbeat 1"])
        assert f" -np {n} " in cmd
    # then, after both runs, the shared storage's reads during each from the master's Prometheus
    for cmd, n in zip(runner.commands[4:], (1, 2), strict=True):
        e = record(f"train-{n}")["history"]
        assert cmd == storage_reads.query_cmd("10.9.0.10", e[0]["started_at"], e[-1]["ended_at"])
    assert (out / "commands.sh").read_text().splitlines()[1:] == runner.commands


def test_time_to_target_per_n_and_a_valid_report_on_disk(cluster, tmp_path):
    runner = ReplayRunner({1: RUNS["train-1"], 2: RUNS["train-2"]})
    rep, out = sweep(cluster, runner, tmp_path)
    tr = rep["training"]
    assert tr["dataset"] == "digits" and tr["target_acc"] == 0.9
    for run, name in zip(tr["runs"], ("train-1", "train-2"), strict=True):
        rec = record(name)
        assert run["reached"] is True and run["time_to_target_s"] == rec["time_to_target_s"] > 0
        assert run["ranks"] == rec["world_size"] and run["global_batch"] == 16 * rec["world_size"]
        assert run["peak_lr"] == pytest.approx(0.8 * run["global_batch"] / 256)
        assert run["epochs_run"] == len(run["history"]) == rec["epochs_run"]
        assert run["final_top1"] == rec["history"][-1]["top1"] >= 0.9
        assert run["history"][-1]["elapsed_s"] == pytest.approx(run["time_to_target_s"])
    # results: the median epoch's img/s (data loading included), E(N) against N=1
    one, two = rep["results"]
    assert (one["mode"], one["ranks"], two["ranks"]) == ("train", 1, 2)
    assert two["efficiency"] == pytest.approx(two["img_per_sec"] / (2 * one["img_per_sec"]))
    assert rep["versions"]["dataset"]["name"] == "digits" and rep["versions"]["dataset"]["train_samples"] == 1437
    again = bench_schema.load(out / "results.json")
    assert again == rep and again["schema"] == 7
    assert {Path(p).name for p in rep["files"]["plots"]} == {"throughput.png", "efficiency.png", "accuracy.png",
                                                             "time_to_accuracy.png", "data_loading.png"}
    assert all(Path(p).stat().st_size > 1000 for p in rep["files"]["plots"])
    rows = list(csv.DictReader((out / "results.csv").open()))
    training = [r for r in rows if r["kind"] == "training"]
    assert len(training) == sum(len(r["history"]) for r in tr["runs"])
    assert {r["nodes"] for r in training} == {"1", "2"} and all(r["reached"] == "True" for r in training)


def test_a_run_below_its_target_is_reported_with_a_warning_and_the_sweep_goes_on(cluster, tmp_path, monkeypatch):
    warned: list[str] = []
    monkeypatch.setattr(ui, "warn", warned.append)
    runner = ReplayRunner({1: RUNS["train-1"], 2: RUNS["miss-2"]})
    rep, out = sweep(cluster, runner, tmp_path)  # returns: the CLI exits 0
    hit, miss = rep["training"]["runs"]
    assert hit["reached"] and not miss["reached"]
    assert miss["time_to_target_s"] is None and miss["epochs_to_target"] is None and miss["epochs_run"] == miss["epochs"]
    assert len(warned) == 1 and warned[0].startswith("2 node(s): target top-1 0.9 not reached in 1 epoch(s)")
    assert bench_report.speedups(rep["training"]) == {1: 1.0, 2: None}
    table = bench_report.tables(rep)[0]
    assert table.title.startswith("time to top-1 0.9 — digits")
    assert "not reached" in list(table.columns[5].cells)
    assert (out / "time_to_accuracy.png").exists()


def test_a_missing_dataset_is_a_usage_error_before_anything_runs(cluster, tmp_path):
    runner = ReplayRunner({}, manifest=bench_train.NO_MANIFEST + "\n")
    with pytest.raises(UsageError, match=re.escape("dataset digits is not on the cluster: run `deployer data fetch digits` first")):
        sweep(cluster, runner, tmp_path)
    assert runner.commands == [bench_train.manifest_cmd(cluster, "digits")]
    assert not (tmp_path / "bench").exists(), "nothing written here either"


@pytest.mark.parametrize(("flags", "msg"), [
    ({"data": "My Data"}, "dataset name 'My Data': use lower-case letters, digits"),
    ({"data": "digits", "target_acc": 90}, "--target-acc 90 is not a top-1 fraction"),
    ({"data": "digits", "nodes": "1,3"}, "the cluster has 2 node(s), not 3"),
    ({"data": "digits", "epochs": 0}, "--epochs must be at least 1"),
    ({"data": "digits", "via": "pbs"}, "--via 'pbs': use one of mpirun, slurm"),
])
def test_bad_flags_are_usage_errors(cluster, flags, msg):
    with pytest.raises(UsageError, match=re.escape(msg)):
        bench_train.make_train_options(cluster, **flags)


def test_data_loading_cost_per_n_against_the_same_step_in_memory(cluster, tmp_path):
    rep, out = sweep(cluster, ReplayRunner({1: RUNS["train-1"], 2: RUNS["train-2"]}), tmp_path)
    for run, name in zip(rep["training"]["runs"], ("train-1", "train-2"), strict=True):
        rec = record(name)
        assert run["compute_img_per_sec"] == rec["compute_img_per_sec"] > 0
        assert run["img_per_sec"] == bench_report.median_img_per_sec(rec)
        assert run["loading_cost"] == pytest.approx(1 - run["img_per_sec"] / run["compute_img_per_sec"])
        # every epoch read the 1,437 training records once: 65 bytes each
        assert all(e["read_mb_per_s"] * 1e6 * h["train_s"] == pytest.approx(1437 * 65)
                   for e, h in zip(run["history"], rec["history"], strict=True))
        assert 0 <= run["data_wait_frac"] < 1
    table = bench_report.tables(rep)[1]
    cells = {c.header: list(c.cells) for c in table.columns}
    assert table.title == "data loading — digits — run1"
    assert cells["cost"] == [f"{r['loading_cost']:.0%}" for r in rep["training"]["runs"]]
    assert cells["NFS MB/s"] == ["—", "—"] and all(c != "—" for c in cells["disk MB/s"])
    assert "bind mount here, not NFS" in table.caption
    assert (out / "data_loading.png").stat().st_size > 1000


def test_the_shared_storage_reads_come_from_the_masters_prometheus(cluster, tmp_path):
    rep, out = sweep(cluster, ReplayRunner({1: RUNS["train-1"], 2: RUNS["train-2"]}), tmp_path)
    expected = storage_reads.parse(PROMETHEUS, 0, 1, "host_bind")  # the recorded answer, one second long
    for run, name in zip(rep["training"]["runs"], ("train-1", "train-2"), strict=True):
        e = record(name)["history"]
        st, seconds = run["storage"], e[-1]["ended_at"] - e[0]["started_at"]
        assert st["window_s"] == storage_reads.window(e[0]["started_at"], e[-1]["ended_at"])[0]
        assert st["master_disk_mb_per_s"] == pytest.approx(expected["master_disk_mb_per_s"] / seconds)
        assert st["nfs_clients_mb_per_s"] is None and "not NFS" in st["note"]
    assert bench_schema.load(out / "results.json")["training"]["runs"][0]["storage"] == rep["training"]["runs"][0]["storage"]
    pushed = {(s.labels["nodes"], s.labels["source"]) for f in metrics.bench_registry(rep).collect() for s in f.samples
              if s.name == "deployer_bench_data_read_mb_per_s"}
    assert pushed == {("1", "loader"), ("1", "master_disk"), ("2", "loader"), ("2", "master_disk")}


def test_without_monitoring_no_prometheus_is_asked(cluster, tmp_path):
    runner = ReplayRunner({1: RUNS["train-1"], 2: RUNS["train-2"]})
    rep, _ = sweep(cluster, runner, tmp_path, storage_metrics=False)
    assert not any("/api/v1/query" in c for c in runner.commands)
    assert all(r["storage"] is None for r in rep["training"]["runs"])


def test_a_dataset_the_user_imported_is_benched_by_its_name(cluster, tmp_path):
    m = {**json.loads(MANIFEST), "name": "mydigits", "training": {**json.loads(MANIFEST)["training"], "target_acc": 0.8}}
    opts = bench_train.make_train_options(cluster, data="mydigits", nodes="1")
    assert opts.dataset == "mydigits" and opts.target_acc is None  # not known here: the manifest on the master says
    runner = ReplayRunner({1: RUNS["train-1"]}, manifest=json.dumps(m))
    rep = bench_train.run_train(runner, cluster, opts, "run1", tmp_path / "out")
    assert rep["training"]["target_acc"] == 0.8 and rep["versions"]["dataset"]["name"] == "mydigits"
    assert f"--data {cluster.shared_dir}/datasets/mydigits --target-acc 0.8 " in runner.commands[2]


def test_an_unknown_name_lists_what_the_cluster_has(cluster, tmp_path):
    runner = ReplayRunner({}, manifest=f"{bench_train.NO_MANIFEST}\ndigits\npets\n")
    opts = bench_train.make_train_options(cluster, data="mnist")
    with pytest.raises(UsageError) as e:
        bench_train.run_train(runner, cluster, opts, "run1", tmp_path / "out")
    assert str(e.value) == ("unknown dataset 'mnist': on the cluster are digits, pets; `deployer data fetch` takes "
                            "cifar10, digits, imagenet, `deployer data import PATH --as mnist` your own")
    assert runner.commands == [bench_train.manifest_cmd(cluster, "mnist")] and not (tmp_path / "out").exists()


def test_defaults_the_dataset_target_and_the_synthetic_sweeps_thread_rule(cluster):
    opts = bench_train.make_train_options(dataclasses.replace(cluster, shared_cpus=4), data="digits")
    assert opts.target_acc == 0.9 and opts.nodes == (1, 2) and opts.threads == 2 and not opts.amp
    args = bench_train.train_args(cluster, "r", opts, 2)
    assert args[-2:] == ["--threads", "2"]
    gpu = dataclasses.replace(cluster, nodes=tuple(dataclasses.replace(n, gpus=1) for n in cluster.nodes))
    assert bench_train.make_train_options(gpu, data="digits").amp is True


def test_under_slurm_each_training_run_is_a_job_script(cluster, tmp_path):
    runner = ReplayRunner({1: RUNS["train-1"], 2: RUNS["train-2"]}, slurm=True)
    rep, out = sweep(cluster, runner, tmp_path, via="slurm")
    assert [Path(p).name for p in rep["files"]["job_scripts"]] == ["train-1.sbatch", "train-2.sbatch"]
    for path, cmd, n in zip(rep["files"]["job_scripts"], runner.commands[2:4], (1, 2), strict=True):
        text = Path(path).read_text()
        assert f"#SBATCH --nodes={n}" in text.splitlines() and "#SBATCH --job-name=deployer-bench-run1" in text
        srun = text.splitlines()[-1]
        assert srun.startswith("srun --mpi=pmix ") and f"/benchmarks/resnet_train.py --data {cluster.shared_dir}" in srun
        assert f"--checkpoint-dir {cluster.shared_dir}/bench/run1/ckpt-{n} --json --progress" in srun
        assert f"\n{text}EOF_SBATCH\n" in cmd and "slurm_job.py" in cmd
    assert [r["time_to_target_s"] for r in rep["training"]["runs"]] == [record("train-1")["time_to_target_s"],
                                                                        record("train-2")["time_to_target_s"]]


def test_on_gpu_nodes_amp_nccl_logs_and_the_nccl_warnings_copied_back(cluster, tmp_path):
    gpu = dataclasses.replace(cluster, nodes=tuple(dataclasses.replace(n, gpus=1) for n in cluster.nodes))

    class GpuRunner(ReplayRunner):
        def run(self, cmd, *, timeout, on_line=None):
            if cmd.startswith(f"cd {gpu.shared_dir}/bench/run1 && for f in nccl.*.log"):
                self.commands.append(cmd)
                return 0, "==> nccl.t-worker-1.77.log <==\nt-worker-1:77 NCCL WARN something\n\n", ""
            return super().run(cmd, timeout=timeout, on_line=on_line)

    runner = GpuRunner({1: RUNS["train-1"], 2: RUNS["train-2"]})
    rep, out = sweep(gpu, runner, tmp_path)
    assert all(" --amp" in c and "-x NCCL_DEBUG=WARN" in c for c in runner.commands[2:4])
    assert runner.commands[4] == commands.nccl_logs_cmd(gpu, "run1")
    assert rep["files"]["nccl_logs"] == str(out / "nccl.log") and "NCCL WARN" in (out / "nccl.log").read_text()


def test_progress_says_epoch_top1_against_the_target_and_an_eta():
    now, said = [0.0], []
    p = RunProgress("2 node(s) train", every_s=0, clock=lambda: now[0], emit=said.append, target=0.9)
    for i, line in enumerate(RUNS["train-2"].splitlines()):
        now[0] = float(i)
        p(untag(line)[2])
    rec = record("train-2")
    last = rec["history"][-1]
    assert said[-1] == (f"2 node(s) train · epoch {last['epoch']}/{rec['epochs']} done, target reached · "
                          f"{last['img_per_sec']:.1f} img/s · top-1 {last['top1']:.4f} (target 0.9)")
    assert any(re.search(r"epoch 1/\d+, batch \d+/\d+ · ETA ≤ \d+s$", s) for s in said), "an ETA before the first epoch ends"


def test_progress_eta_from_the_pace_so_far():
    now, said = [0.0], []
    p = RunProgress("1 node(s) train", every_s=0, clock=lambda: now[0], emit=said.append)
    p('PROGRESS {"phase": "train", "epoch": 1, "epochs": 4, "batch": 1, "batches": 10}')
    assert said[-1] == "1 node(s) train · epoch 1/4, batch 1/10"  # nothing timed yet: no ETA, not "ETA 0s"
    now[0] = 5.0
    p('PROGRESS {"phase": "train", "epoch": 1, "epochs": 4, "batch": 5, "batches": 10}')
    # 4 batches in 5 s since batch 1: 11.25 s an epoch; 6.25 s of this one + 3 more
    assert said[-1] == "1 node(s) train · epoch 1/4, batch 5/10 · ETA ≤ 40s"
    now[0] = 12.0
    p('PROGRESS {"phase": "epoch_done", "epoch": 1, "epochs": 4, "top1": 0.5, "img_per_sec": 100.0, "epoch_s": 12.0}')
    assert said[-1] == "1 node(s) train · epoch 1/4 done · 100.0 img/s · top-1 0.5000 · ETA ≤ 36s"


def test_the_training_report_pushes_throughput_and_time_to_accuracy(cluster, tmp_path):
    rep, _ = sweep(cluster, ReplayRunner({1: RUNS["train-1"], 2: RUNS["train-2"]}), tmp_path)
    names = {(s.name, s.labels.get("mode")) for f in metrics.bench_registry(rep).collect() for s in f.samples}
    assert ("deployer_bench_img_per_sec", "train") in names
    got = {(s.name, s.labels.get("nodes")): s.value for f in metrics.bench_registry(rep).collect() for s in f.samples
           if s.name in ("deployer_bench_time_to_target_seconds", "deployer_bench_final_top1")}
    assert got[("deployer_bench_time_to_target_seconds", "2")] == record("train-2")["time_to_target_s"]
    assert got[("deployer_bench_final_top1", "1")] == record("train-1")["history"][-1]["top1"]


def test_fixture_records_are_real_resnet_train_output():
    for name in RUNS:
        rec = record(name)
        assert rec["benchmark"] == "resnet_train" and rec["dataset"] == "digits" and rec["history"]
    assert json.loads(MANIFEST)["name"] == "digits"


def test_a_crashed_training_run_stops_every_rank_and_names_its_log(cluster, tmp_path):
    from deployer.errors import OperationFailed

    class Crash(ReplayRunner):
        def run(self, cmd, *, timeout, on_line=None):
            if "ckpt-2" in cmd:
                self.commands.append(cmd)
                return 1, "", "[1,1]<stderr>:RuntimeError: boom\n"
            return super().run(cmd, timeout=timeout, on_line=on_line)

    runner = Crash({1: RUNS["train-1"]})
    with pytest.raises(OperationFailed, match="train-2 failed") as e:
        sweep(cluster, runner, tmp_path)
    assert runner.commands[-1] == mpirun.cleanup_cmd(cluster), "no rank is left running"
    assert e.value.log == tmp_path / "bench" / "run1" / "train-2.log"


def test_a_training_section_out_of_shape_is_refused_before_any_file(cluster, tmp_path):
    from pydantic import ValidationError

    rep = bench_report.training_report("r1", json.loads(MANIFEST), 0.9, [(1, record("train-1"))], {})
    rep["training"]["runs"][0]["history"][0]["top1"] = 93.9  # a percentage is not a top-1 fraction
    with pytest.raises(ValidationError, match=r"training.runs.0.history.0.top1"):
        bench_report.write_files(rep, tmp_path / "out")
    assert not (tmp_path / "out").exists()
