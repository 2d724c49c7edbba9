"""The GPU proof's run on a real NVIDIA H200 (tests/fixtures/gpu/proof-h200-2026-11-27/,
2026-11-27, driver 580.159.04, torch 2.11.0+cu130): each of the project's readers on that
machine's own outputs, and the proof replayed on them without a GPU must read what it read
on the GPU (a reader changed since would show here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from deployer import gpu_facts, gpu_runtime
from deployer.bench import report
from deployer.check import analyse
from deployer.check.model import Finding, NodeReport
from deployer.launch.mpirun import parse_json_line

ROOT = Path(__file__).resolve().parents[2]
PROOF = ROOT / "tests" / "fixtures" / "gpu" / "proof-h200-2026-11-27"
RAW = PROOF / "raw"
# The same machine kind 10 minutes later, with the node_checks step (raw/health/) in the run itself
RUN2 = ROOT / "tests" / "fixtures" / "gpu" / "proof-h200-2026-11-27-run2"
# A later session's lent machine of the same kind (22:41 UTC), the proof as docs/gpu.md gives it
RUN3 = ROOT / "tests" / "fixtures" / "gpu" / "proof-h200-2026-11-27-run3"


def raw(name: str) -> str:
    return (RAW / name).read_text()


def recorded_steps(proof: Path = PROOF) -> dict[str, dict]:
    return {s["name"]: s for s in json.loads((proof / "summary.json").read_text())["steps"]}


def test_the_recording_is_the_gpu_run_with_its_provenance():
    summary = json.loads((PROOF / "summary.json").read_text())
    assert summary["mode"] != "dry-run" and summary["verdict"] == "pass" and summary["exit_code"] == 0
    prov = json.loads(raw("provenance.json"))
    assert prov["smi_q"]["command"] == "nvidia-smi -q" and prov["smi_q"]["rc"] == 0
    assert prov["smi_q"]["utc"].startswith("2026-11-27")
    assert prov["lspci_nn"] == {"file": None, "why": "lspci is not installed"}  # the lent machine had no lspci


def test_nvidia_smi_q_of_a_passed_through_h200():
    smi = raw("nvidia-smi-q.txt")
    gpus = gpu_facts.smi_gpus(smi)
    assert [bus for bus, _ in gpus] == ["00000000:00:06.0"]
    assert gpus[0][1]["Product Name"] == "NVIDIA H200"
    assert gpu_facts.virtualization(smi) == "pass-through"
    # one GPU, no NVSwitch: every fabric field N/A, which is not a fabric waiting to be trained
    assert gpu_facts.fabric_states(smi) == [("N/A", "N/A")] and gpu_facts.fabric_ready(smi)
    assert gpu_facts.gpu_problems(dict(gpus[0][1])) == []  # ECC zero, no remapping pending


def test_the_torch_choice_for_the_h200_query_line():
    gpus = gpu_runtime.parse_smi("vm", raw("nvidia-smi-query-gpu.csv"))
    assert [(g.name, g.driver, g.compute_cap) for g in gpus] == [("NVIDIA H200", "580.159.04", "9.0")]
    choice = gpu_runtime.choose(gpus)
    assert (choice.torch, choice.cuda) == ("2.13.0", "13.0")  # PyPI's default wheel: driver 580 runs CUDA 13
    assert gpu_runtime.driver_ok("580.159.04", choice.cuda)


def test_gpu_check_on_the_h200_finds_nothing_wrong_with_the_chosen_cuda():
    record = json.loads(raw("gpu_check.txt").strip().splitlines()[-1])
    choice = gpu_runtime.choose(gpu_runtime.parse_smi("vm", raw("nvidia-smi-query-gpu.csv")))
    assert gpu_facts.check_problems("vm", record, choice.as_dict()) == []
    # the same record with a build that lacks Hopper code is named, as on a node with an older torch
    no_hopper = {**record, "arch_list": ["sm_75", "sm_80", "sm_86"]}
    assert "no code in this torch build" in gpu_facts.check_problems("vm", no_hopper, choice.as_dict())[0]


def test_resnet_on_the_h200_as_bench_reads_it():
    result = parse_json_line(raw("resnet-1.log"), "resnet_synthetic")
    assert result["device"] == "GPU" and result["versions"]["gpu"] == "NVIDIA H200"
    assert round(result["img_per_sec"], 1) == 1240.7 and result["flags"]["amp"] and result["flags"]["channels_last"]
    assert report.nvidia_reference("resnet50", "NVIDIA H200") is None  # NVIDIA published no H200 figure


@pytest.mark.parametrize("proof", [PROOF, RUN2, RUN3], ids=["run1", "run2-with-node-checks", "run3"])
def test_the_proof_replayed_without_a_gpu_reads_what_it_read_on_the_gpu(tmp_path, proof):
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_proof.py"), "--dry-run", "--no-benchmarks",
                        "--replay", str(proof / "raw"), "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                       timeout=300, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    replayed = {s["name"]: s for s in json.loads((out / "summary.json").read_text())["steps"]}
    recorded = recorded_steps(proof)
    assert replayed["gpu_facts"]["figures"] == recorded["gpu_facts"]["figures"]
    assert "PCI not read (no lspci)" in replayed["gpu_facts"]["detail"]
    assert "no fabric reported" in replayed["gpu_facts"]["detail"]
    for key in ("driver", "choice", "choice_fits_driver"):
        assert replayed["gpu_runtime"]["figures"][key] == recorded["gpu_runtime"]["figures"][key], key
    assert replayed["check"]["figures"]["verdict"] == recorded["check"]["figures"]["verdict"] == "pass"
    checks = replayed["node_checks"]  # raw/health/, or health/ beside raw/ (run 1): the node checks, read again
    assert checks["status"] == "pass", checks
    if "node_checks" in recorded:
        assert checks["figures"] == recorded["node_checks"]["figures"]
    assert checks["figures"]["quick"]["verdict"] == checks["figures"]["standard"]["verdict"] == "pass"
    assert checks["figures"]["standard"]["checks"]["gpu_run"] == "pass"
    assert checks["figures"]["health"]["checks"]["gpus"] == "pass"
    prov = json.loads((out / "raw" / "provenance.json").read_text())
    assert prov["lspci_nvidia"]["file"] is None and "lspci is not installed" in prov["lspci_nvidia"]["why"]


# --- the node's own checks on the same machine (scripts/gpu_health_proof.sh, health/) ---------

HEALTH = PROOF / "health"


def _benchmark_module(name: str):  # noqa: ANN202 - a module loaded from benchmarks/
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_node(level: str) -> NodeReport:
    """node_check.py's CHECK lines on the H200, read as check/run.py reads them."""
    lines = (HEALTH / f"node_check_{level}.txt").read_text().splitlines()
    findings = [Finding.parse(json.loads(ln.split(" ", 1)[1])) for ln in lines if ln.startswith("CHECK ")]
    return NodeReport("vm", findings)


def test_deployer_check_passes_the_h200_at_the_quick_and_the_standard_level():
    for level in ("quick", "standard"):
        node = _check_node(level)
        analyse.gpus([node], {"vm": 1})
        analyse.dcgm([node])
        analyse.interface([node])
        assert node.verdict == "pass", (level, node.reason())
        assert node.first("pass") is not None
        by = {f.check: f for f in node.findings}
        assert by["dcgm"].status == "skip"  # DCGM was not installed there: said, not failed
    run = {f.check: f for f in _check_node("standard").findings}["gpu_run"]
    assert run.status == "pass" and run.value["devices"] == [{"index": 0, "name": "NVIDIA H200", "compute_cap": "9.0"}]


def test_the_health_timers_gpu_readings_on_the_h200():
    gpu = _benchmark_module("node_health_gpu")
    kernel = (HEALTH / "kernel-messages.txt").read_text()
    assert "NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100" in kernel  # the driver's own lines, not Xids
    xid = gpu.xid_findings(kernel)
    assert xid["status"] == "pass" and not xid.get("value", {}).get("xids")
    ecc = gpu.ecc_findings((HEALTH / "nvidia-smi-q.txt").read_text(), 1)
    assert ecc["status"] == "pass" and ecc["value"] == {"gpus": 1, "expected": 1}
    assert gpu.ecc_findings((HEALTH / "nvidia-smi-q.txt").read_text(), 2)["status"] == "fail"  # a GPU gone


def test_the_health_run_on_the_h200_as_it_recorded_itself():
    rec = json.loads((HEALTH / "node_health_last.json").read_text())
    by = {f["check"]: f for f in rec["findings"]}
    assert by["gpus"]["status"] == by["xid"]["status"] == by["runtime"]["status"] == "pass"
    # the lent machine has no systemd, so no timedatectl: the one warning, on a node it would answer
    assert rec["verdict"] == "warn" and rec["reason"].startswith("clock: NTP state unknown")
    prom = (HEALTH / "node_health.prom").read_text()
    assert 'deployer_health_check_status{check="gpus"} 0' in prom and "deployer_health_failing 0" in prom
