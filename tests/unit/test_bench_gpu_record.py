"""A GPU run's record and report: NVIDIA's published ResNet-50 figure for the GPU, the
versions (GPU, CUDA, driver, NCCL), the NCCL logs; and the whole sweep replayed from
tests/fixtures/bench/sweep_2node_gpu_derived.json.

That fixture is DERIVED, not recorded on a GPU: the CPU recording (sweep_2node_recorded.json)
with the nodes given a GPU each and the benchmark's JSON records edited to a GPU run (its
"about" says what changed). It checks the logic a GPU run takes, not GPU figures.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest
from rich.console import Console

from deployer.bench import profiles
from deployer.bench import report as bench_report
from deployer.bench import schema as bench_schema
from deployer.bench import sweep as bench
from deployer.cluster import Cluster
from deployer.errors import OperationFailed
from deployer.launch import mpirun

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
DERIVED = json.loads((FIXTURES / "sweep_2node_gpu_derived.json").read_text())
RECORDED = json.loads((FIXTURES / "sweep_2node_recorded.json").read_text())


# ---- the reference figures ----------------------------------------------------------------------


@pytest.mark.parametrize("gpu, figure", [
    ("NVIDIA A100-SXM4-80GB", 2470),
    ("A100-SXM4-80GB", 2470),  # older drivers leave out "NVIDIA "
    ("Tesla V100-SXM2-16GB", 1200),
    ("Tesla V100-SXM2-32GB", 1156),
])
def test_known_gpus_have_nvidias_figure_and_its_source(gpu, figure):
    ref = bench_report.nvidia_reference("resnet50", gpu)
    assert ref["img_per_sec_per_gpu"] == figure and ref["gpu"] == gpu and ref["precision"] == "AMP"
    assert ref["source"]["url"].startswith("https://github.com/NVIDIA/DeepLearningExamples/")
    assert "Training performance" in ref["source"]["table"]


@pytest.mark.parametrize("gpu", [
    "NVIDIA H100 80GB HBM3",  # no figure found in a published source: no reference, not a guess
    "NVIDIA A100-SXM4-40GB",  # NVIDIA's table is the 80 GB DGX A100
    "Tesla V100-PCIE-16GB",
    "Tesla T4",
    None,  # a CPU run
])
def test_other_gpus_get_no_reference(gpu):
    assert bench_report.nvidia_reference("resnet50", gpu) is None


@pytest.mark.parametrize("model", ["resnet18", "resnet101", None])
def test_only_resnet50_is_compared(model):
    assert bench_report.nvidia_reference(model, "NVIDIA A100-SXM4-80GB") is None


def test_every_entry_names_its_source_and_ships_in_the_package():
    data = json.loads(bench_report.REFERENCE_FILE.read_text())
    assert data["model"] == "resnet50" and data["entries"]
    pkg = Path(bench_report.__file__).parents[1]  # deployer/
    assert bench_report.REFERENCE_FILE.is_relative_to(pkg)  # inside deployer/: the wheel carries it
    for e in data["entries"]:
        re.compile(e["gpu_pattern"])
        assert e["img_per_sec_per_gpu"] > 0 and e["gpus"] == 1 and e["precision"] == "AMP"
        assert e["source"]["url"].startswith("https://") and e["source"]["table"]
        bench_schema.Reference.model_validate({"model": data["model"], "gpu": "x", **e})


# ---- the report line, from a benchmark JSON record with GPU versions ------------------------------


def gpu_run(world: int, per_rank: float, model: str = "resnet50", gpu: str | None = "NVIDIA A100-SXM4-80GB") -> dict:
    versions = {"torch": "2.13.0+cu124", "hosts": ["gpu-a", "gpu-b"][:world], "world_size": world}
    if gpu:
        versions.update(cuda="12.4", cudnn=90100, nccl="2.21.5", gpu=gpu, driver="550.54.15",
                        gpu_count={h: 1 for h in versions["hosts"]}, gpu_names={h: gpu for h in versions["hosts"]})
    return {"benchmark": "resnet_synthetic", "model": model, "mode": "dp", "device": "GPU" if gpu else "CPU",
            "batch_size": 32, "image_size": 224, "world_size": world, "img_per_sec": per_rank * world,
            "img_per_sec_per_rank": per_rank, "versions": versions}


def report_for(*runs: dict, amp: bool = True) -> dict:
    versions = {"benchmark": runs[0]["versions"], "flags": {"amp": amp, "channels_last": True, "fp16_allreduce": False,
                                                            "auto_flags": ["amp", "channels_last"] if amp else ["channels_last"]}}
    return bench_report.aggregate("r1", [(r["world_size"], r) for r in runs], versions=versions)


def test_the_report_line_sets_img_per_gpu_against_nvidias():
    rep = report_for(gpu_run(1, 1235.0), gpu_run(2, 1111.5))
    assert rep["reference"]["img_per_sec_per_gpu"] == 2470
    assert bench_report.reference_line(rep) == (
        "img/s per GPU: 1235.0 (NVIDIA published: 2470 for NVIDIA A100-SXM4-80GB, AMP at 224 px; 50 %)"
    )
    assert bench_report.reference_share(rep["results"][1], rep["reference"]) == pytest.approx(0.45)


def test_a_run_without_amp_gets_no_comparable_figure():
    rep = report_for(gpu_run(1, 600.0, gpu="Tesla V100-SXM2-16GB"), amp=False)
    assert rep["reference"] is None
    assert bench_report.reference_line(rep) == "img/s per GPU: 600.0 (no comparable NVIDIA figure: no AMP, NVIDIA's AMP)"


def test_a_run_at_another_image_size_gets_no_comparable_figure():
    """--profile standard runs 128 px: about 3x the images of NVIDIA's 224 px, so a share
    of NVIDIA's figure would read ~3x too high. No figure, and the console says why."""
    run = {**gpu_run(1, 3600.0), "image_size": 128}
    rep = report_for(run)
    assert rep["reference"] is None
    line = "img/s per GPU: 3600.0 (no comparable NVIDIA figure: 128 px, NVIDIA's 224 px)"
    assert bench_report.reference_line(rep) == line
    text = render(rep)
    assert line in text and "of NVIDIA" not in text and "NVIDIA published" not in text


@pytest.mark.parametrize("run", [gpu_run(1, 900.0, model="resnet18"), gpu_run(1, 900.0, gpu="NVIDIA H100 80GB HBM3"),
                                 gpu_run(1, 9.0, gpu=None)])
def test_no_reference_line_without_a_published_figure(run):
    rep = report_for(run)
    assert rep["reference"] is None and bench_report.reference_line(rep) is None
    text = render(rep)
    assert "NVIDIA published" not in text and "of NVIDIA" not in text


def render(report: dict) -> str:
    console = Console(width=200, record=True)
    for t in bench_report.tables(report):
        console.print(t)
    return console.export_text()


def test_the_table_is_headed_by_the_gpu_stack_and_ends_with_the_comparison():
    text = render(report_for(gpu_run(1, 1235.0), gpu_run(2, 1111.5)))
    assert "GPU NVIDIA A100-SXM4-80GB, 1 per node · CUDA 12.4 · driver 550.54.15 · NCCL 2.21.5" in text
    assert "AMP on (auto), channels_last on (auto), fp16 all-reduce off" in text
    assert "img/s per GPU: 1235.0 (NVIDIA published: 2470 for NVIDIA A100-SXM4-80GB, AMP at 224 px; 50 %)" in text
    assert "NVIDIA DGX A100 (8x A100 80GB), 1 GPU, batch 256/GPU" in text
    assert "50%" in text and "45%" in text  # the "of NVIDIA" column, per node count


def test_a_report_with_a_reference_survives_the_schema(tmp_path):
    rep = bench_report.write_files(report_for(gpu_run(1, 1235.0)), tmp_path)
    again = bench_schema.load(tmp_path / "results.json")
    assert again["schema"] == bench_schema.SCHEMA and again["reference"] == rep["reference"] and again["reference"]["batch_size"] == 256


# ---- the sweep on a GPU cluster, replayed -------------------------------------------------------


def kind(cmd: str) -> str:
    m = re.search(
        r"(resnet_synthetic\.py --json --mode \w+|allreduce\.py|nccl\.\*\.log|iperf3 -c \S+(?: -J -t \d+)?(?: --bidir)?|hostfile)", cmd
    )
    return m.group(1) if m else cmd.split()[0]


class ReplayRunner:
    def __init__(self, calls: list[dict]):
        self.calls = list(calls)
        self.commands: list[str] = []

    def run(self, cmd: str, *, timeout: float, on_line=None) -> tuple[int, str, str]:
        self.commands.append(cmd)
        want = self.calls.pop(0)
        assert kind(cmd) == kind(want["cmd"]), f"sent {cmd!r}, the fixture has {want['cmd']!r} here"
        if on_line:
            for line in want["stdout"].splitlines():
                on_line(line)
        return want["rc"], want["stdout"], want["stderr"]


@pytest.fixture
def gpu_replay(tmp_path):
    shared = str(tmp_path / "shared")
    fixture = json.loads(json.dumps(DERIVED).replace("{shared}", shared))
    return Cluster.parse(fixture["cluster"]), ReplayRunner(fixture["calls"]), shared


def sweep_options(cluster: Cluster) -> profiles.BenchOptions:
    return profiles.make_options(cluster, nodes="1,2", model="resnet50", batch_size=32, image_size=224,
                              num_warmup_batches=1, num_batches_per_iter=2, num_iters=2,
                              allreduce_min="1K", allreduce_max="16K", run_timeout_s=300, net=True)


def test_the_fixture_says_it_is_derived():
    assert DERIVED["about"].startswith("DERIVED, not recorded on a GPU")
    assert all(n["gpus"] == 1 for n in DERIVED["cluster"]["nodes"])
    assert all(n["gpus"] == 0 for n in RECORDED["cluster"]["nodes"])


def test_a_gpu_sweep_records_the_stack_the_flags_and_nccls_logs(gpu_replay, tmp_path):
    cluster, runner, shared = gpu_replay
    out = tmp_path / "bench" / "run1"
    rep = bench.run_bench(runner, cluster, sweep_options(cluster), "run1", out)
    assert runner.calls == [], "every command of the fixture was sent, in order"

    mpiruns = [c for c in runner.commands if " mpirun " in f" {c}"]
    assert len(mpiruns) == 4  # dp at 1 and 2, ensemble at 2, the all-reduce
    for cmd in mpiruns:
        assert f"-x NCCL_DEBUG=WARN -x NCCL_DEBUG_FILE={shared}/bench/run1/nccl.%h.%p.log" in cmd
    for cmd in mpiruns[:3]:
        assert "--amp --channels-last" in cmd and "--fp16-allreduce" not in cmd

    # NCCL's warnings, copied back beside the results
    assert rep["files"]["nccl_logs"] == str(out / "nccl.log")
    assert (out / "nccl.log").read_text().startswith("==> nccl.vm.4242.log <==")
    assert rep["versions"]["nccl_debug"] == {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": f"{shared}/bench/run1/nccl.%h.%p.log"}

    # the stack and the flags, in the saved record
    saved = bench_schema.load(out / "results.json")
    v = saved["versions"]["benchmark"]
    assert (v["gpu"], v["cuda"], v["nccl"], v["driver"]) == ("NVIDIA A100-SXM4-80GB", "12.4", "2.21.5", "550.54.15")
    assert v["gpu_count"] == {"vm": 1}
    flags = saved["versions"]["flags"]
    assert (flags["amp"], flags["channels_last"], flags["fp16_allreduce"], flags["auto_flags"]) == (
        True,
        True,
        False,
        ["amp", "channels_last"],
    )

    # NVIDIA's figure beside img/s per GPU
    assert saved["reference"]["img_per_sec_per_gpu"] == 2470
    assert bench_report.reference_line(saved) == (
        "img/s per GPU: 1235.0 (NVIDIA published: 2470 for NVIDIA A100-SXM4-80GB, AMP at 224 px; 50 %)"
    )
    assert (out / "commands.sh").read_text().splitlines()[1:] == runner.commands


def test_the_cpu_sweep_sends_no_nccl_settings_and_copies_no_logs(tmp_path):
    shared = str(tmp_path / "shared")
    fixture = json.loads(json.dumps(RECORDED).replace("{shared}", shared))
    runner = ReplayRunner(fixture["calls"])
    cluster = Cluster.parse(fixture["cluster"])
    rep = bench.run_bench(runner, cluster, sweep_options(cluster), "run1", tmp_path / "out")
    assert runner.calls == [] and not any("NCCL_DEBUG" in c or "nccl.*.log" in c for c in runner.commands)
    assert rep["versions"]["nccl_debug"] is None and rep["files"]["nccl_logs"] is None and rep["reference"] is None
    assert not any("--amp" in c or "--channels-last" in c for c in runner.commands)


def test_a_failed_gpu_run_names_where_nccls_warnings_are(gpu_replay, tmp_path):
    cluster, runner, shared = gpu_replay
    runner.calls[1] = {**runner.calls[1], "rc": 1, "stdout": "", "stderr": "mpirun: something broke"}
    runner.calls.insert(2, {"cmd": mpirun.cleanup_cmd(cluster), "rc": 0, "stdout": "", "stderr": ""})
    with pytest.raises(OperationFailed) as e:
        bench.run_bench(runner, cluster, sweep_options(cluster), "run1", tmp_path / "out")
    assert f"NCCL warnings, if any: {shared}/bench/run1/nccl.%h.%p.log on the master" in str(e.value)
    assert "\n" not in e.value.message


def test_the_flags_in_the_record_are_the_options(gpu_replay):
    cluster, _, _ = gpu_replay
    o = profiles.make_options(cluster, nodes="1", amp=False)
    assert asdict(o)["auto_flags"] == ("channels_last",)
    assert bench_report.precision_text(asdict(o)) == "AMP off, channels_last on (auto), fp16 all-reduce off"
