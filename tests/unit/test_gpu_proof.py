"""scripts/gpu_proof.py without a GPU: its dry-run end to end on the recordings under
tests/fixtures/gpu/, a doctored recording that contradicts a reader (the run must fail),
a benchmarks' Python without torch (said, not a crash), the GPU mode on stand-in tools
printing the recordings, and (slow) the CPU benchmarks it runs in the dry-run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_proof.py"
FIXTURES = ROOT / "tests" / "fixtures" / "gpu"
SMI_Q = FIXTURES / "health" / "nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt"


def proof(out: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, dict, str]:
    """Run the script; (exit status, summary.json, what it printed)."""
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True,
                       cwd=ROOT, timeout=timeout, env=env, check=False)
    summary = json.loads((out / "summary.json").read_text())
    return p.returncode, summary, p.stdout + p.stderr


def steps(summary: dict) -> dict[str, dict]:
    return {s["name"]: s for s in summary["steps"]}


def bare_python(tmp_path: Path) -> Path:
    """This interpreter without its site-packages: no torch, numpy or mpi4py for the benchmarks."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    return python


def test_the_dry_run_reads_every_recording_with_the_projects_readers(tmp_path):
    rc, summary, printed = proof(tmp_path / "out", "--dry-run", "--no-benchmarks")
    assert rc == 0 == summary["exit_code"], printed
    assert summary["mode"] == "dry-run" and summary["verdict"] == "pass"
    s = steps(summary)
    assert list(s) == ["environment", "raw", "gpu_facts", "gpu_runtime", "check", "gpu_check", "node_checks", "torch_fit",
                       "allreduce", "rank_watch", "resnet_1", "resnet_all"]

    facts = s["gpu_facts"]["figures"]
    assert facts["count"] == 8 and facts["models"] == ["NVIDIA H100 80GB HBM3"]
    assert facts["virtualization"] == "none" and facts["whole_gpu"] is True
    assert facts["pci_virtualization"] == "cannot-tell"  # an H100's device id is its vGPUs' too
    assert facts["nvswitches"] == 4 and facts["fabric_ready"] is True
    assert facts["topo"] == {"gpus": 8, "links": {"NV18": 56}, "all_nvlink": True}

    runtime = s["gpu_runtime"]["figures"]
    assert runtime["driver"] == "535.161.08" and runtime["driver_cuda"] == "12.2"
    assert runtime["compute_cap_by_name"] == {"NVIDIA H100 80GB HBM3": "9.0"}
    assert runtime["choice"]["requirement"] == "torch==2.13.0+cu126" and runtime["choice_fits_driver"] is True
    assert runtime["choice_within_driver_cuda"] is False  # 12.6 on a 12.2 driver: minor-version compatibility

    check = s["check"]["figures"]
    assert check["verdict"] == "warn" and check["expected_gpus"] == 8
    found = {f["check"]: f for f in check["findings"]}
    assert found["gpus"]["status"] == "pass" and found["gpus"]["value"]["count"] == 8
    assert found["dcgm"]["status"] == "warn" and "Persistence Mode" in found["dcgm"]["detail"]  # DCGM 4's software test

    # gpu_check.py really ran: whatever this machine's torch, check_problems agrees with its exit status
    assert s["gpu_check"]["status"] == "pass" and s["gpu_check"]["figures"]["rc"] != 0
    assert s["gpu_check"]["figures"]["problems"]
    assert all(s[n]["status"] == "skipped" and s[n]["detail"] == "--no-benchmarks"
               for n in ("allreduce", "rank_watch", "resnet_1", "resnet_all"))

    raw = summary["raw"]
    assert raw["smi_q"]["fixture"] == str(SMI_Q.relative_to(ROOT)) and raw["smi_q"]["stands_for"] == "nvidia-smi -q"
    assert (tmp_path / "out" / raw["smi_q"]["file"]).read_text() == SMI_Q.read_text()
    assert raw["smi_x"]["file"] is None and "no recording" in raw["smi_x"]["why"]
    assert summary["machine"]["driver"] == "535.161.08" and summary["machine"]["nvswitches"] == 4
    table = (tmp_path / "out" / "summary.md").read_text()
    assert "| step | verdict | what it showed |" in table and "| gpu_facts | pass | 8 x NVIDIA H100 80GB HBM3;" in table


@pytest.mark.parametrize(("old", "new", "said"), [
    ("Attached GPUs                             : 8", "Attached GPUs                             : 9",
     "gpu_facts.smi_gpus reads 8 GPU(s); nvidia-smi -q's header says Attached GPUs: 9"),
    ("        Virtualization Mode               : None", "        Virtualization Mode               : SR-IOV Guest",
     "nvidia-smi -q names a virtualization mode gpu_facts.virtualization does not know"),
])
def test_a_recording_that_contradicts_a_reader_fails_the_run(tmp_path, old, new, said):
    doctored = tmp_path / "nvidia-smi-q.txt"
    text = SMI_Q.read_text()
    assert old in text
    doctored.write_text(text.replace(old, new, 1))
    rc, summary, printed = proof(tmp_path / "out", "--dry-run", "--no-benchmarks", "--fixture", f"smi_q={doctored}",
                                 "--python", str(bare_python(tmp_path)))  # the readers are the point: no torch to wait for
    assert rc == 1 and summary["verdict"] == "fail", printed
    facts = steps(summary)["gpu_facts"]
    assert facts["status"] == "fail" and any(c.startswith(said) for c in facts["contradictions"]), facts
    assert summary["raw"]["smi_q"]["fixture"] == str(doctored)
    assert f"contradicts: {said}" in printed


def test_a_benchmark_python_without_torch_is_named_not_a_crash(tmp_path):
    python = bare_python(tmp_path)
    rc, summary, printed = proof(tmp_path / "out", "--dry-run", "--python", str(python))
    assert rc == 0, printed
    s = steps(summary)
    assert f"torch is not installed for {python}" in " ".join(s["environment"]["notes"])
    assert s["gpu_check"]["status"] == "pass" and "No module named 'torch'" in s["gpu_check"]["detail"]
    for name in ("allreduce", "rank_watch", "resnet_1", "resnet_all"):
        assert s[name]["status"] == "skipped" and s[name]["detail"].startswith("torch, numpy, mpi4py"), s[name]


def stand_in(folder: Path, name: str, cases: dict[str, str]) -> None:
    """A tool that prints a recording for each argument list it was recorded with, and fails otherwise."""
    arms = "".join(f'  "{args}") {what} ;;\n' for args, what in cases.items())
    script = folder / name
    script.write_text(f'#!/bin/sh\ncase "$*" in\n{arms}  *) echo "stand-in {name}: $* was not recorded" >&2; exit 6 ;;\nesac\n')
    script.chmod(0o755)


@pytest.mark.skipif(os.geteuid() != 0, reason="node_check runs lspci and dcgmi through sudo when not root, past the stand-ins")
def test_the_gpu_mode_on_stand_in_tools_reads_what_they_print(tmp_path):
    """nvidia-smi, lspci and dcgmi print the recordings: the GPU mode's own collection
    (the commands, node_check.check_gpus and check_dcgm) runs and is read; what the
    stand-ins do not print, and the missing torch, make the proof incomplete, by name."""
    tools = tmp_path / "tools"
    tools.mkdir()
    h = FIXTURES / "health"
    # --query-gpu: the recording's model and driver, and the H100's compute capability, as the role's query prints them
    query = "for i in 0 1 2 3 4 5 6 7; do echo 'NVIDIA H100 80GB HBM3, 535.161.08, 9.0'; done"
    stand_in(tools, "nvidia-smi", {"-q": f"cat {SMI_Q}", "topo -m": f"cat {h / 'nvidia-smi-topo-m_h100-x8_nv18.txt'}",
                                   "--query-gpu=name,driver_version,compute_cap --format=csv,noheader": query})
    vvv, nn = h / "lspci-vvv_h100-sxm-x8_gpu-stanzas_healthy.txt", FIXTURES / "lspci-nn.hgx-h100-nvswitch.txt"
    stand_in(tools, "lspci", {"-nn": f"cat {nn}", "-vmm -nn -d 10de:": f"cat {nn}", "-vvv": f"cat {vvv}",
                              "-vv -d 10de:": f"cat {vvv}"})
    stand_in(tools, "dcgmi", {"discovery -l": "true", "diag -r 1 -j": f"cat {h / 'dcgm-json' / 'dcgm4.2.3_gb10_r1_softwarefail.json'}"})
    python = bare_python(tmp_path)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    rc, summary, printed = proof(tmp_path / "out", "--python", str(python), "--no-benchmarks", env=env)
    assert rc == 3 and summary["verdict"] == "incomplete" and summary["mode"] == "gpu", printed
    s = steps(summary)
    assert s["environment"]["status"] == "error" and "torch (benchmarks' Python" in s["environment"]["notes"][-1]
    assert s["raw"]["status"] == "error" and "smi_x (rc 6)" in s["raw"]["notes"][0]
    assert s["gpu_facts"]["status"] == "pass" and s["gpu_facts"]["figures"]["count"] == 8
    assert s["gpu_runtime"]["status"] == "pass"
    assert s["gpu_runtime"]["figures"]["compute_cap_reported"] == ["9.0"] * 8
    assert s["check"]["status"] == "pass" and s["check"]["figures"]["verdict"] == "warn"
    assert s["gpu_check"]["status"] == "error" and "torch is not installed" in s["gpu_check"]["detail"]
    raw = summary["raw"]
    assert raw["query"]["command"] == "nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader"
    assert raw["smi_q"]["rc"] == 0 and raw["smi_q"]["utc"] and raw["smi_q"]["host"] == summary["host"]
    assert raw["dcgm_diag"]["command"] == "dcgmi diag -r 1 -j"
    assert json.loads((tmp_path / "out" / raw["dcgm_diag"]["file"]).read_text())["DCGM Diagnostic"]


missing = [m for m in ("torch", "mpi4py", "numpy") if importlib.util.find_spec(m) is None]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed")
@pytest.mark.skipif(bool(missing), reason=f"python packages missing: {', '.join(missing)}")
def test_the_dry_run_runs_the_benchmarks_on_cpu_ranks(tmp_path):
    """allreduce.py over two gloo ranks as the check runs it, a rank stopped and named by
    the rank watch, and bench's ResNet run (a tiny step) on one rank and on two."""
    rc, summary, printed = proof(tmp_path / "out", "--dry-run", "--quiet-s", "4", timeout=600)
    assert rc == 0, printed
    s = steps(summary)
    ar = s["allreduce"]["figures"]
    assert ar["record"]["library"] == "gloo" and ar["record"]["world_size"] == 2 and ar["record"]["wrong"] == 0
    assert ar["finding"]["status"] == "pass" and ar["finding"]["value"]["bytes"] == 64 << 20
    assert ar["finding"]["value"]["busbw_gb_s"] > 0
    watch = s["rank_watch"]["figures"]
    assert s["rank_watch"]["status"] == "pass" and watch["named_rank"] == watch["stopped_rank"] == 1
    assert 3 <= watch["seconds_from_stop_to_named"] <= 6 and watch["left_running"] == []
    assert watch["named_step"] == "1048576 bytes"
    for name, ranks in (("resnet_1", 1), ("resnet_all", 2)):
        fig = s[name]["figures"]
        assert s[name]["status"] == "pass" and fig["world_size"] == ranks and fig["device"] == "CPU"
        assert fig["img_per_sec"] > 0 and fig["amp"] and fig["channels_last"]
        assert fig["reference"]["comparison"] == "no comparable figure"
    assert (tmp_path / "out" / "raw" / "rank-watch.log").exists()
    assert "HEARTBEAT" in (tmp_path / "out" / "raw" / "allreduce.log").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="the script mounts the stand-in shared dir in a namespace of its own: root")
def test_the_node_checks_script_leaves_the_machine_as_it_found_it(tmp_path):
    """scripts/gpu_health_proof.sh (the proof's node_checks step) runs the node's own checks
    with a tmpfs shared dir in a mount namespace of its own and a HOME of its own: its
    outputs are there after, and no mount, folder or profile file of it is left."""
    profile_d = sorted(os.listdir("/etc/profile.d"))
    env = {**os.environ, "DEPLOYER_PROOF_PYTHON": str(bare_python(tmp_path))}
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_health_proof.sh"), str(tmp_path / "health"), "1"],
                       capture_output=True, text=True, env=env, timeout=120, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    quick = (tmp_path / "health" / "node_check_quick.txt").read_text()
    shared = next(json.loads(ln[6:]) for ln in quick.splitlines() if ln.startswith('CHECK {"check": "shared_dir"'))
    assert shared["status"] == "pass", shared  # the tmpfs is a mount of its own, as NFS is on a node
    assert json.loads((tmp_path / "health" / "node_health_last.json").read_text())["findings"]
    assert "deployer-proof" not in Path("/proc/self/mountinfo").read_text()
    assert not list(Path("/tmp").glob("gpu-health-proof.*"))
    assert sorted(os.listdir("/etc/profile.d")) == profile_d
