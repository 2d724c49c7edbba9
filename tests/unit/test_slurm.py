"""Slurm's node lines, gres.conf lines and plugin choice (deployer/slurm.py) from recorded
node facts, and the spec's `scheduler` switch. No Ansible, no cluster.

tests/fixtures/slurm/lxc-node-facts.json is the slurm role's node-facts helper output
recorded on a real local node (islurm-worker-1): an LXC container on the 2-core CI machine
with a 1536 MiB limit and core 1 of its own (cpuset), where slurmd -C reports the whole
machine (2 CPUs, the host's 24 GB).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer import slurm
from deployer.errors import UsageError
from deployer.spec import build_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
LXC = json.loads((FIXTURES / "lxc-node-facts.json").read_text())
# A cloud VM's facts: cgroup v2 (no memory.max at the root cgroup), Slurm 22.05, a
# driver with NVML, two GPUs; its slurmd -C is the recorded one.
MACHINE_CPUS = int(slurm.parse_slurmd_c(LXC["slurmd_c"])["CPUs"])
VM = {**LXC, "memory_limits": [], "cpus_allowed": f"0-{MACHINE_CPUS - 1}", "container": "none", "cgroup_fs": "cgroup2fs",
      "cgroup_controllers": "cpuset cpu io memory hugetlb pids rdma misc",
      "cgroup_v1_writable": False, "slurm_version": "slurm-wlm 22.05.8", "nvml": False,
      "gpu_devices": ["/dev/nvidia0", "/dev/nvidia1"]}


def test_recorded_slurmd_c_parses():
    seen = slurm.parse_slurmd_c(LXC["slurmd_c"])
    assert int(seen["CPUs"]) >= 1 and seen["ThreadsPerCore"].isdigit()


def test_memory_is_the_nodes_own_limit_not_the_hosts_ram():
    # In the container slurmd -C reports the host's RAM; the node has its cgroup limit.
    host_ram = int(slurm.parse_slurmd_c(LXC["slurmd_c"])["RealMemory"])
    limit = min(int(v) for v in LXC["memory_limits"]) // 2**20
    assert limit < host_ram
    assert slurm.memory_mb(LXC) == limit


@pytest.mark.parametrize("unlimited", ["max", "9223372036854771712"])
def test_no_memory_limit_means_what_slurmd_saw(unlimited):
    facts = {**LXC, "memory_limits": [unlimited]}
    assert slurm.memory_mb(facts) == int(slurm.parse_slurmd_c(LXC["slurmd_c"])["RealMemory"])


def test_two_gpu_node_line_and_gres_from_recorded_facts():
    seen = slurm.parse_slurmd_c(VM["slurmd_c"])
    line = slurm.node_line("horovod-worker-1", "192.168.77.11", VM, gpus=2)
    assert line == (f"NodeName=horovod-worker-1 NodeAddr=192.168.77.11 CPUs={seen['CPUs']} Boards={seen['Boards']} "
                    f"SocketsPerBoard={seen['SocketsPerBoard']} CoresPerSocket={seen['CoresPerSocket']} "
                    f"ThreadsPerCore={seen['ThreadsPerCore']} RealMemory={seen['RealMemory']} Gres=gpu:2")
    assert slurm.gres_line("horovod-worker-1", VM, 2) == "NodeName=horovod-worker-1 Name=gpu File=/dev/nvidia[0-1]"
    assert slurm.gres_line("horovod-worker-1", {**VM, "nvml": True}, 2) == "NodeName=horovod-worker-1 AutoDetect=nvml Name=gpu Count=2"
    assert slurm.gres_line("horovod-master", LXC, 0) is None
    assert "Gres" not in slurm.node_line("horovod-master", "192.168.77.10", LXC)


def test_gres_device_files_follow_the_node_and_fall_back_to_the_first_n():
    assert slurm.gres_line("n", {"gpu_devices": ["/dev/nvidia3", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia2"]}, 3) \
        == "NodeName=n Name=gpu File=/dev/nvidia[0,2-3]"
    assert slurm.gres_line("n", {"gpu_devices": []}, 1) == "NodeName=n Name=gpu File=/dev/nvidia0"  # no driver loaded yet


def test_plugins_cgroup_on_a_cloud_vm_and_one_choice_for_the_whole_cluster():
    assert slurm.plugins({"a": VM, "b": VM})["proctrack"] == "proctrack/cgroup"
    old = {**VM, "slurm_version": "slurm-wlm 21.08.5"}  # Ubuntu 22.04: no cgroup/v2 plugin
    mixed = slurm.plugins({"a": VM, "b": old})
    assert mixed["proctrack"] == "proctrack/linuxproc" and mixed["task"] == "task/affinity"
    assert "b:" in mixed["why"] and "21.08" in mixed["why"]


def test_the_recorded_local_node_gets_cgroups_without_core_binding():
    # Its cgroup v1 hierarchies take Slurm's cgroups (proctrack/cgroup, device
    # confinement), but Slurm binds by the machine's CPU ids and the node may not be
    # given core 0 (EACCES writing cpuset.cpus): no task/affinity, no ConstrainCores.
    assert slurm.cgroup_usable(LXC)[0]
    assert slurm.own_cpus(LXC) == 1 < MACHINE_CPUS and slurm.cores_partitioned(LXC)
    chosen = slurm.plugins({"master": LXC, "worker-1": LXC})
    assert (chosen["proctrack"], chosen["task"], chosen["constrain_cores"]) == ("proctrack/cgroup", "task/cgroup", False)
    assert "has 1 of the machine's 2 CPUs" in chosen["why"]


def test_the_node_line_keeps_the_machines_layout_so_a_core_replacement_aborts_no_job():
    # The local provider gives nodes their own cores or the shared ones as the cluster
    # grows; slurmctld requeues running jobs on a node whose cores change in slurm.conf.
    own, shared = LXC, {**LXC, "cpus_allowed": f"0-{MACHINE_CPUS - 1}"}
    assert slurm.node_line("n", "10.81.0.11", own) == slurm.node_line("n", "10.81.0.11", shared)
    assert slurm.node_line("islurm-worker-1", "10.81.0.11", LXC) == (
        "NodeName=islurm-worker-1 NodeAddr=10.81.0.11 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 "
        "ThreadsPerCore=1 RealMemory=1536")


def test_containers_never_bind_cores_vms_do_and_without_cgroups_fall_back_to_linuxproc():
    shared = {**LXC, "cpus_allowed": f"0-{MACHINE_CPUS - 1}"}  # 3 local nodes on 2 cores: all share both
    assert slurm.plugins({"a": shared})["task"] == "task/cgroup"
    assert "is in a container (lxc)" in slurm.plugins({"a": shared})["why"]
    vm_v1 = {**shared, "container": "none"}
    assert slurm.plugins({"a": vm_v1})["task"] == "task/cgroup,task/affinity"
    no_cgroup = {**vm_v1, "cgroup_v1_writable": False}
    assert slurm.plugins({"a": no_cgroup})["proctrack"] == "proctrack/linuxproc"
    assert slurm.plugins({"a": no_cgroup})["task"] == "task/affinity"
    assert slurm.plugins({"a": {**LXC, "cgroup_v1_writable": False}})["task"] == "task/none"


def test_bad_slurmd_c_is_named():
    with pytest.raises(ValueError, match="slurmd -C printed no"):
        slurm.parse_slurmd_c("slurmd: fatal: something")


def test_not_ready_lists_nodes_that_take_no_work():
    sinfo = "a idle\nb down*\nc mixed\nd idle*\n"
    assert slurm.not_ready(sinfo, ["a", "b", "c", "d", "e"]) == ["b: down*", "d: idle*", "e: not in sinfo"]
    assert slurm.not_ready(sinfo, ["a", "c"]) == []


def test_scheduler_defaults_to_none_and_takes_slurm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert build_spec().scheduler == "none"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scheduler: slurm\n")
    assert build_spec(cfg).scheduler == "slurm"


def test_unknown_scheduler_names_the_allowed_values(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("scheduler: pbs\n")
    with pytest.raises(UsageError) as e:
        build_spec(cfg)
    assert str(e.value) == f"{cfg}: scheduler: unknown scheduler 'pbs'; use one of: none, slurm"
    assert e.value.exit_code == 2
