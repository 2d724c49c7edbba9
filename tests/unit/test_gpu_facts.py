"""Reading GPU nodes' own tools (deployer/gpu_facts.py) on recorded outputs (tests/fixtures/gpu)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deployer import gpu_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("fixture", "mode"), [
    ("nvidia-smi-q.vgpu-v100d-8c.txt", "vgpu"),
    ("nvidia-smi-q.passthrough-gh200.txt", "pass-through"),
    ("nvidia-smi-q.baremetal-h100nvl-x2.txt", "none"),
])
def test_virtualization_mode_from_nvidia_smi_q(fixture, mode):
    assert gpu_facts.virtualization((FIXTURES / fixture).read_text()) == mode


def test_virtualization_unknown_without_the_section():
    assert gpu_facts.virtualization("") == "unknown"
    assert gpu_facts.virtualization("Attached vGPUs : 1\n") == "vgpu"


def test_a_vgpu_guest_and_a_whole_v100_look_alike_on_pci():
    """The V100D-8C guest (IDs from its real nvidia-smi -q, names from Debian 12's pci.ids) and
    a whole V100 differ only in a subsystem id pci.ids does not name: can't tell, so ask."""
    vgpu = (FIXTURES / "lspci-vmm.vgpu-v100d-8c.txt").read_text()
    whole = (FIXTURES / "lspci-vmm.passthrough-v100.txt").read_text()
    assert not gpu_facts.pci_vgpu(vgpu) and not gpu_facts.pci_vgpu(whole)
    assert gpu_facts.pci_virtualization(vgpu) == gpu_facts.pci_virtualization(whole) == "cannot-tell"


@pytest.mark.parametrize(("lspci", "verdict"), [
    # real `lspci -nn` lines, as published
    ("3b:00.0 3D controller [0302]: NVIDIA Corporation GV100GL [Tesla V100 PCIe 32GB] [10de:1db6] (rev a1)\n", "cannot-tell"),
    ((FIXTURES / "lspci-nn.hgx-a100.txt").read_text(), "cannot-tell"),
    ("01:00.0 VGA compatible controller [0300]: NVIDIA Corporation TU106 [GeForce RTX 2060] [10de:1f08] (rev a1)\n",
     "passthrough"),  # vGPU does not run on a GeForce: a whole GPU
    # a GPU newer than the node's pci.ids: unnamed, so no guess
    ("Slot:\t00:05.0\nClass:\t3D controller [0302]\nVendor:\tNVIDIA Corporation [10de]\nDevice:\tDevice [2901]\n", "cannot-tell"),
    # a profile named in the subsystem (where a pci.ids has one)
    ("Slot:\t00:05.0\nClass:\t3D controller [0302]\nVendor:\tNVIDIA Corporation [10de]\nDevice:\tGV100GL [1db6]\n"
     "SDevice:\tGRID V100D-8C [1396]\n", "vgpu"),
], ids=["v100-pcie", "hgx-a100", "geforce", "unnamed", "named-profile"])
def test_what_pci_says_before_a_driver(lspci, verdict):
    assert gpu_facts.pci_virtualization(lspci) == verdict


def test_driver_packages():
    assert gpu_facts.driver_packages("Ubuntu", 535) == ["nvidia-driver-535-server", "nvidia-utils-535-server"]
    assert gpu_facts.driver_packages("Ubuntu", None) == []  # ubuntu-drivers picks
    assert gpu_facts.driver_packages("Debian", None) == ["nvidia-driver", "nvidia-smi", "libcuda1", "firmware-misc-nonfree"]
    assert gpu_facts.driver_packages("Debian", 470)[:3] == [
        "nvidia-tesla-470-driver", "nvidia-tesla-470-smi", "libnvidia-tesla-470-cuda1"]
    # The CUDA driver library comes only through Recommends, which the role does not install.
    for branch in gpu_facts.DEBIAN_BRANCHES:
        assert any("cuda1" in pkg for pkg in gpu_facts.driver_packages("Debian", branch)), branch
    with pytest.raises(ValueError, match="branches 535, 470"):
        gpu_facts.driver_packages("Debian", 580)
    with pytest.raises(ValueError, match="Ubuntu or Debian"):
        gpu_facts.driver_packages("Rocky", None)


@pytest.mark.parametrize(("kernel", "arch", "available", "packages", "upgrade"), [
    ("6.1.0-28-cloud-amd64", "x86_64", True, ["linux-headers-6.1.0-28-cloud-amd64", "linux-headers-cloud-amd64"], False),
    ("6.1.0-28-cloud-amd64", "x86_64", False, ["linux-image-cloud-amd64", "linux-headers-cloud-amd64"], True),
    ("6.1.0-28-amd64", "x86_64", False, ["linux-image-amd64", "linux-headers-amd64"], True),
    ("6.1.0-28-arm64", "aarch64", False, ["linux-image-arm64", "linux-headers-arm64"], True),  # GH200: never -amd64
    ("6.1.0-28-cloud-arm64", "aarch64", False, ["linux-image-cloud-arm64", "linux-headers-cloud-arm64"], True),
    ("6.18.44-fc-v782", "x86_64", False, ["linux-image-amd64", "linux-headers-amd64"], True),  # a kernel not Debian's
])
def test_kernel_headers_for_the_kernel_the_node_will_run(kernel, arch, available, packages, upgrade):
    assert gpu_facts.kernel_packages(kernel, arch, available) == {"packages": packages, "upgrade": upgrade}


def test_nvidia_smi_for_the_branch_ubuntu_drivers_chose():
    dpkg = "libc6\nnvidia-headless-no-dkms-535-server\nlinux-modules-nvidia-535-server-generic\nzlib1g\n"
    assert gpu_facts.driver_utils_package(dpkg) == ["nvidia-utils-535-server"]
    assert gpu_facts.driver_utils_package("libc6\n") == []


GOOD = {"host": "w1", "torch": "2.13.0+cu126", "torch_cuda": "12.6", "cuda_available": True,
        "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
        "devices": [{"index": 0, "name": "NVIDIA L40S", "compute_cap": "8.9"}], "cuda_op": "ok", "nccl": "ok",
        "nccl_version": "2.29.3"}
CHOICE = {"torch": "2.13.0", "variant": "cu126", "cuda": "12.6", "requirement": "torch==2.13.0+cu126"}


def test_check_passes_a_working_node():
    assert gpu_facts.check_problems("w1", GOOD, CHOICE) == []


def test_check_names_node_and_cause():
    no_volta = {**GOOD, "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
                "devices": [{"index": 0, "name": "Tesla V100-SXM2-16GB", "compute_cap": "7.0"}], "torch_cuda": "13.0"}
    problems = gpu_facts.check_problems("w2", no_volta, CHOICE)
    assert any("w2: GPU 0 (Tesla V100-SXM2-16GB, 7.0) has no code" in p for p in problems)
    assert any("torch reports CUDA 13.0" in p for p in problems)
    nccl = gpu_facts.check_problems("w1", {**GOOD, "nccl": "NCCL error: unhandled system error"}, CHOICE)
    assert nccl == ["w1: NCCL all-reduce between the node's GPUs failed: NCCL error: unhandled system error"]
    dead = gpu_facts.check_problems("w3", {"host": "w3", "torch_cuda": "12.6", "cuda_available": False,
                                           "cuda_error": "CUDA driver version is insufficient"}, CHOICE)
    assert dead == ["w3: torch sees no GPU (CUDA driver version is insufficient); check the driver (nvidia-smi) "
                    "and that CUDA 12.6 runs on it"]


def test_gpu_check_script_on_this_machine_reports_no_gpu():
    """benchmarks/gpu_check.py for real here (no GPU; PyPI's torch, a CUDA build, or a CPU build): a
    record, exit 1, and a verdict naming the cause."""
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")], capture_output=True, text=True,
                       timeout=120, check=False)
    record = json.loads(r.stdout)
    if record.get("cuda_available"):
        pytest.skip("this machine has a GPU: the device run covers it")
    assert r.returncode == 1 and record["cuda_available"] is False
    import torch

    assert record["torch"] == torch.__version__ and record["torch_cuda"] == torch.version.cuda
    problems = gpu_facts.check_problems(record["host"], record, {"cuda": None})
    assert problems and "torch sees no GPU" in problems[0]


# ---- NVSwitch boards: Fabric Manager ---------------------------------------------------------


def test_nvswitches_are_counted_from_real_lspci_recordings():
    assert gpu_facts.nvswitch_count((FIXTURES / "lspci-nn.hgx-a100.txt").read_text()) == 6
    assert gpu_facts.nvswitch_count((FIXTURES / "lspci-nn.hgx-h100-nvswitch.txt").read_text()) == 4
    assert gpu_facts.nvswitch_count((FIXTURES / "lspci-vmm.passthrough-v100.txt").read_text()) == 0  # a PCIe card
    assert gpu_facts.nvswitch_count("Slot:\t00:06.0\nClass:\tBridge [0680]\nVendor:\tNVIDIA Corporation [10de]\n") == 1  # -vmm


def test_fabric_manager_matches_the_drivers_branch():
    assert gpu_facts.fabricmanager_packages("Ubuntu", ["nvidia-driver-535-server", "nvidia-utils-535-server"]) == [
        "nvidia-fabricmanager-535", "libnvidia-nscq-535"]
    assert gpu_facts.fabricmanager_packages("Ubuntu", ["nvidia-utils-570-server"]) == [  # after ubuntu-drivers chose
        "nvidia-fabricmanager-570", "libnvidia-nscq-570"]
    with pytest.raises(ValueError, match="Debian's archive does not carry"):
        gpu_facts.fabricmanager_packages("Debian", ["nvidia-driver"])
    with pytest.raises(ValueError, match="set openstack.nvidia_driver_branch"):
        gpu_facts.fabricmanager_packages("Ubuntu", [])


def test_the_fabric_state_from_real_nvidia_smi_recordings():
    in_progress = (FIXTURES / "nvidia-smi-q-fabric.in-progress.txt").read_text()
    completed = (FIXTURES / "nvidia-smi-q-fabric.completed.txt").read_text()
    assert gpu_facts.fabric_states(in_progress) == [("In Progress", "N/A")]
    assert gpu_facts.fabric_states(completed) == [("Completed", "Success")]
    assert not gpu_facts.fabric_ready(in_progress) and gpu_facts.fabric_ready(completed)
    assert not gpu_facts.fabric_ready(completed + in_progress), "every GPU that reports must be trained"


def test_a_gpu_that_reports_no_fabric_state_does_not_block():
    """NVML reports the fabric on Hopper and newer; other GPUs print N/A (as recorded on
    V100 and A40 nodes), older drivers no section: the running Fabric Manager and
    gpu_check's CUDA operation are the evidence there."""
    na = "    Fabric\n        State                             : N/A\n        Status                            : N/A\n"
    assert gpu_facts.fabric_states(na) == [("N/A", "N/A")]
    assert gpu_facts.fabric_ready(na) and gpu_facts.fabric_ready("")
