"""The GPU roles' decisions run by Ansible itself, on this machine, with the GPU tools
replaced by stand-ins that print recorded outputs (tests/fixtures/gpu): no NVIDIA GPU or
driver can run here. What runs for real: the roles' tasks, the filter plugin, deployer's
choice and parsing code. What does not: a driver install, a reboot, CUDA.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from tests.unit.test_openstack_roles import inventory, run_playbook

pytestmark = pytest.mark.slow  # each case is an ansible-playbook run

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gpu"


def stand_in(bindir: Path, name: str, script: str) -> None:
    path = bindir / name
    path.write_text(f"#!{sys.executable}\nimport sys\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def nvidia_smi(bindir: Path, query_out: str | None, q_fixture: str | None = None, old_driver: bool = False) -> None:
    """A stand-in nvidia-smi: -L and --query-gpu answer like the recorded machine; -q prints the fixture.
    old_driver: refuse the compute_cap field, as drivers before 510 do."""
    q = (FIXTURES / q_fixture).read_text() if q_fixture else ""
    stand_in(bindir, "nvidia-smi", f"""
args = sys.argv[1:]
if {old_driver!r} and any("compute_cap" in a for a in args):
    print('Field "compute_cap" is not a valid field to query.'); sys.exit(2)
if args[:1] == ["-q"]:
    sys.stdout.write({q!r}); sys.exit(0)
if args[:1] == ["-L"]:
    print("GPU 0: stand-in"); sys.exit(0)
sys.stdout.write({query_out!r})
""")


@pytest.fixture
def bindir(tmp_path, monkeypatch):
    if shutil.which("nvidia-smi") and "stand-in" not in (Path(shutil.which("nvidia-smi")).read_text(errors="ignore")):
        pytest.skip("this machine has a real NVIDIA driver")
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return d


def local_inventory(**group_vars) -> dict:
    inv = inventory(connection="local", **group_vars)
    del inv["all"]["hosts"]["horovod-worker-1"]
    inv["all"]["children"] = {"gpu": {"hosts": {"horovod-master": {}}}, "master": {"hosts": {"horovod-master": {}}}}
    return inv


DRIVER_PLAY = "---\n- name: NVIDIA driver\n  hosts: gpu\n  gather_facts: true\n  roles:\n    - nvidia_driver\n"


def lspci_prints(bindir: Path, fixture: str) -> None:
    if shutil.which("lspci") is None:
        pytest.skip("lspci (pciutils) is not installed here")
    text = (FIXTURES / fixture).read_text()
    stand_in(bindir, "lspci", f"sys.stdout.write({text!r})")


def test_a_working_vgpu_guest_driver_is_left_alone(tmp_path, bindir):
    lspci_prints(bindir, "lspci-vmm.vgpu-v100d-8c.txt")
    nvidia_smi(bindir, "GRID V100D-8C, 535.216.01\n", "nvidia-smi-q.vgpu-v100d-8c.txt")
    r = run_playbook(tmp_path, DRIVER_PLAY, local_inventory(), "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "driver present (vgpu)" in r.stdout
    assert "Install the driver packages" not in r.stdout


def test_pass_through_is_read_from_the_driver(tmp_path, bindir):
    lspci_prints(bindir, "lspci-vmm.passthrough-v100.txt")
    nvidia_smi(bindir, "NVIDIA GH200 480GB, 550.127.05\n", "nvidia-smi-q.passthrough-gh200.txt")
    r = run_playbook(tmp_path, DRIVER_PLAY, local_inventory(), "--check")
    assert r.returncode == 0 and "driver present (pass-through)" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("required", [False, True])
def test_a_node_without_an_nvidia_device_is_left_or_stopped_where_one_is_required(tmp_path, bindir, required):
    """A node whose flavor gave no GPU: left alone (site.yml); stopped where one is required
    (ansible/bake.yml's --gpu bake, which would otherwise save a "GPU image" without a driver)."""
    stand_in(bindir, "lspci", "pass")  # no NVIDIA device
    inv = local_inventory(nvidia_driver_require_device=required)
    r = run_playbook(tmp_path, DRIVER_PLAY, inv, "--check")
    assert "Install the driver packages" not in r.stdout
    if required:
        assert r.returncode != 0 and "its flavor gave it no GPU; set openstack.flavor to a GPU flavor" in r.stdout, r.stdout
    else:
        assert r.returncode == 0 and "no driver installed" in r.stdout, r.stdout + r.stderr


def test_a_vgpu_guest_without_a_driver_gets_none_installed(tmp_path, bindir):
    """The V100D-8C guest's PCI devices, with the flavor's word (resources:VGPU, recorded by
    the preflight as openstack.gpu_virtualization: vgpu)."""
    if shutil.which("lspci") is None:
        pytest.skip("lspci (pciutils) is not installed here")
    lspci = (FIXTURES / "lspci-vmm.vgpu-v100d-8c.txt").read_text()
    stand_in(bindir, "lspci", f"sys.stdout.write({lspci!r})")
    r = run_playbook(tmp_path, DRIVER_PLAY, local_inventory(deployer_gpu_virtualization="vgpu"), "--check")
    assert r.returncode != 0
    assert "is an NVIDIA vGPU guest" in r.stdout and "none is installed" in r.stdout, r.stdout
    assert "Install the driver packages" not in r.stdout and "Keep nouveau" not in r.stdout


def test_without_the_flavors_or_the_specs_word_a_datacenter_gpu_stops_and_asks(tmp_path, bindir):
    """The same guest with a flavor that says neither: PCI cannot tell a vGPU from a whole
    V100, so nothing is installed and the spec flag is named (before, a distribution driver
    went into the vGPU guest)."""
    if shutil.which("lspci") is None:
        pytest.skip("lspci (pciutils) is not installed here")
    lspci = (FIXTURES / "lspci-vmm.vgpu-v100d-8c.txt").read_text()
    stand_in(bindir, "lspci", f"sys.stdout.write({lspci!r})")
    r = run_playbook(tmp_path, DRIVER_PLAY, local_inventory(), "--check")
    assert r.returncode != 0
    assert "horovod-master: cannot tell before a driver whether its GPU (GV100GL [Tesla V100 PCIe 32GB] [1db6])" in r.stdout, r.stdout
    assert "Set openstack.gpu_virtualization: passthrough" in r.stdout
    assert "Install the driver packages" not in r.stdout and "Keep nouveau" not in r.stdout


PENDING_PLAY = """\
---
- name: Pending reboot
  hosts: gpu
  gather_facts: true
  tasks:
    - name: Tell
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: reboot_pending.yml
"""


@pytest.mark.parametrize(("installed", "loaded", "other_kernel", "reboots"), [
    ("535.216.01", None, False, True),  # installed by a run interrupted before its reboot: nothing to install now, still a reboot
    ("535.216.01", "470.256.02", False, True),  # a new branch over a running old one
    ("535.216.01", "535.216.01", False, False),  # runs what is installed
    (None, None, True, True),  # built only for an upgraded kernel (the running one's headers were gone)
    (None, None, False, False),  # no module anywhere: nothing a reboot would load
], ids=["interrupted-run", "other-version-loaded", "running", "newer-kernel-only", "none-installed"])
def test_a_pending_reboot_is_read_from_the_modules_not_from_apt(tmp_path, bindir, installed, loaded, other_kernel, reboots):
    """The reboot is ordered when the installed module is not the loaded one, whatever apt
    did in this run (the handlers are notified; nvidia_driver_reboot: false keeps them from
    rebooting this machine)."""
    stand_in(bindir, "modinfo", f"v = {installed!r}\nif v is None: sys.exit(1)\nprint(v)")
    version_file = tmp_path / "nvidia-version"
    if loaded:
        version_file.write_text(loaded + "\n")
    modules = tmp_path / "modules"
    (modules / "6.1.0-99-cloud-amd64" / "kernel").mkdir(parents=True)
    if other_kernel:
        (modules / "6.1.0-99-cloud-amd64" / "updates" / "dkms").mkdir(parents=True)
        (modules / "6.1.0-99-cloud-amd64" / "updates" / "dkms" / "nvidia.ko.xz").write_bytes(b"")
    inv = local_inventory(nvidia_driver_reboot=False, nvidia_driver_loaded_version_file=str(version_file),
                          nvidia_driver_modules_root=str(modules))
    r = run_playbook(tmp_path, PENDING_PLAY, inv)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("RUNNING HANDLER [nvidia_driver : Reboot the master for the NVIDIA driver]" in r.stdout) is reboots, r.stdout
    if reboots and installed:
        assert f"NVIDIA module {installed} is installed, {loaded or 'none'} is loaded: a reboot loads it" in r.stdout
    elif reboots:
        assert "the NVIDIA module is built for kernel 6.1.0-99-cloud-amd64, not the running" in r.stdout, r.stdout


def test_a_hung_driver_is_named_not_waited_for(tmp_path, bindir):
    """nvidia-smi that never answers (a wedged driver): the node is named within the limit,
    and nothing is installed over the driver."""
    lspci_prints(bindir, "lspci-vmm.passthrough-v100.txt")
    stand_in(bindir, "nvidia-smi", "import time; time.sleep(120)")
    r = run_playbook(tmp_path, DRIVER_PLAY, local_inventory(nvidia_driver_smi_timeout_s=2), "--check")
    assert r.returncode != 0
    assert "nvidia-smi did not answer in 2 s on horovod-master: a driver is loaded but hangs" in r.stdout, r.stdout
    assert "Install the driver packages" not in r.stdout


def test_an_nvswitch_node_on_debian_stops_before_any_install(tmp_path, bindir):
    """This machine is Debian 12, whose archive has no Fabric Manager: an HGX board (the real
    A100 recording) stops the role with the fix named, before the driver is installed."""
    stand_in(bindir, "nvidia-smi", "print('NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'); sys.exit(9)")
    lspci_prints(bindir, "lspci-nn.hgx-a100.txt")
    r = run_playbook(tmp_path, DRIVER_PLAY, local_inventory(), "--check")
    assert r.returncode != 0
    assert "horovod-master (6 NVSwitches): this node has NVSwitches and needs NVIDIA Fabric Manager" in r.stdout, r.stdout
    assert "Install the driver packages" not in r.stdout and "Keep nouveau" not in r.stdout


def test_a_working_driver_on_an_nvswitch_board_without_fabric_manager_is_named(tmp_path, bindir):
    """An image that brings its own driver to an HGX flavor: nvidia-smi works, CUDA would
    not (no Fabric Manager); the role says so instead of leaving the node as fine."""
    lspci_prints(bindir, "lspci-nn.hgx-a100.txt")
    nvidia_smi(bindir, "NVIDIA A100-SXM4-80GB, 535.183.01\n", "nvidia-smi-q.passthrough-gh200.txt")
    inv = local_inventory(nvidia_driver_fabricmanager_binary=str(tmp_path / "no-nv-fabricmanager"))
    r = run_playbook(tmp_path, DRIVER_PLAY, inv, "--check")
    assert r.returncode != 0
    assert "horovod-master has 6 NVSwitches and no Fabric Manager" in r.stdout, r.stdout


FABRIC_PLAY = """\
---
- name: NVSwitch fabric
  hosts: gpu
  gather_facts: false
  tasks:
    - name: Wait for it
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: fabric.yml
"""


@pytest.mark.parametrize(("fixture", "ok"), [("nvidia-smi-q-fabric.completed.txt", True),
                                             ("nvidia-smi-q-fabric.in-progress.txt", False)], ids=["trained", "in-progress"])
def test_an_nvswitch_node_waits_for_its_fabric_and_names_the_cause(tmp_path, bindir, fixture, ok):
    """nvidia-smi -q as recorded on H100 nodes before and after Fabric Manager trained the
    fabric: the role goes on only once it is trained, and otherwise stops naming the node."""
    nvidia_smi(bindir, "", fixture)
    inv = local_inventory(nvidia_driver_fabricmanager_service=False, nvidia_driver_fabric_retries=1,
                          nvidia_driver_fabric_delay=0, nvidia_driver_nvswitches=6,
                          nvidia_driver_fabricmanager_binary=sys.executable)  # "installed"
    r = run_playbook(tmp_path, FABRIC_PLAY, inv)
    assert (r.returncode == 0) is ok, r.stdout + r.stderr
    if ok:
        assert "6 NVSwitches: the NVLink fabric is trained" in r.stdout
    else:
        assert "horovod-master: the NVLink fabric of its 6 NVSwitch(es) is not trained" in r.stdout, r.stdout
        assert "journalctl -u nvidia-fabricmanager" in r.stdout


CHOOSE_PLAY = """\
---
- name: Choose torch
  hosts: all
  gather_facts: true
  tasks:
    - name: Choose
      ansible.builtin.include_role:
        name: training_runtime
        tasks_from: choose_torch.yml
"""


def test_training_runtime_chooses_from_a_470_driver(tmp_path, bindir):
    nvidia_smi(bindir, "Tesla V100-SXM2-16GB, 470.82.01\n", old_driver=True)
    r = run_playbook(tmp_path, CHOOSE_PLAY, local_inventory())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torch==2.7.1+cu118: driver 470.82.01, Tesla V100-SXM2-16GB (7.0)" in r.stdout


def test_training_runtime_stops_before_installing_when_nothing_fits(tmp_path, bindir):
    nvidia_smi(bindir, "Tesla V100-SXM2-16GB, 418.67, 7.0\n")
    r = run_playbook(tmp_path, CHOOSE_PLAY, local_inventory())
    assert r.returncode != 0
    assert "no published torch build fits" in r.stdout and "install driver branch 470 or newer" in r.stdout, r.stdout


def test_training_runtime_keeps_the_spec_choice(tmp_path, bindir):
    nvidia_smi(bindir, "NVIDIA A100-SXM4-80GB, 535.104.05, 8.0\n")
    r = run_playbook(tmp_path, CHOOSE_PLAY, local_inventory(deployer_torch_release="2.7.1", deployer_torch_variant="cu118"))
    assert r.returncode == 0 and "torch==2.7.1+cu118" in r.stdout, r.stdout + r.stderr
