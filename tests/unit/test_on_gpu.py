"""On a machine with an NVIDIA GPU: the after-install check and the ResNet-50 benchmark
with AMP and channels_last, for real. Everywhere else these skip with the reason. Both
passed on an NVIDIA H200 on 2026-11-27 (driver 580.159.04, torch 2.11.0+cu130; ResNet-50
at batch 64: 2490 img/s); docs/gpu.md says what ran.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deployer import gpu_facts, gpu_runtime
from deployer.bench.report import nvidia_reference

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="no NVIDIA GPU on this machine: run `pytest tests/unit/test_on_gpu.py` on a GPU node"),
]


def test_gpu_check_passes_and_the_matrix_agrees():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True, text=True,
                       timeout=600, check=False)
    record = json.loads(r.stdout)
    print(json.dumps(record, indent=1))  # the closing note quotes it
    query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                           capture_output=True, text=True, check=True).stdout
    gpus = gpu_runtime.parse_smi("this-node", query)
    installed = {"cuda": torch.version.cuda, "requirement": f"torch=={torch.__version__}"}
    assert gpu_facts.check_problems("this-node", record, installed) == [] and r.returncode == 0
    choice = gpu_runtime.choose(gpus)
    print(choice.reason)
    # The build the matrix picks must fit what this driver and GPU proved they run.
    assert all(gpu_runtime.runs_on(g.compute_cap, choice.archs) for g in gpus)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
def test_resnet50_amp_channels_last_on_one_gpu():
    p = subprocess.run(["mpirun", "-np", "1", "--allow-run-as-root", "--bind-to", "none", sys.executable,
                        str(ROOT / "benchmarks" / "resnet_synthetic.py"), "--model", "resnet50", "--amp",
                        "--channels-last", "--batch-size", "64", "--num-iters", "5", "--json"],
                       capture_output=True, text=True, timeout=900, check=False, cwd=ROOT / "benchmarks")
    assert p.returncode == 0, p.stderr[-3000:]
    record = json.loads(p.stdout.strip().splitlines()[-1])
    assert record["device"] == "GPU" and record["img_per_sec"] > 0
    ref = nvidia_reference("resnet50", record["versions"]["gpu"])
    print(record["versions"]["gpu"], f"{record['img_per_sec']:.0f} img/s", "NVIDIA:", ref and ref["img_per_sec_per_gpu"])
