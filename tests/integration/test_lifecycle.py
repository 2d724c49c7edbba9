"""up -> status -> ssh -> smoke check -> re-run converges -> down leaves nothing."""

from __future__ import annotations

import json
import re
import socket
import subprocess

import pytest

from deployer.pipeline import timings

from .conftest import NODES, SUBNET

pytestmark = pytest.mark.integration


def test_up_reported_the_smoke_check(local_cluster):
    assert "smoke check: mpirun reached itest-master, itest-worker-1, itest-worker-2" in local_cluster.up_log


def test_up_says_where_its_time_went(local_cluster):
    line = next(ln for ln in local_cluster.up_log.splitlines() if f"up {NODES} nodes in " in ln)
    # check: the quick `deployer check` that ends every up (it holds the smoke check)
    for stage in ("preflight", "prepare", "apply", "boot", "ansible", "check"):
        assert f" {stage} " in line, line
    assert re.search(r"ansible \d+ s \((training_runtime|jupyterlab|mpi) \d+ s\)", line), line
    first = sorted((local_cluster.state / "runs").glob("*-up"))[0]  # the up whose output up_log holds
    record = timings.read(first)
    assert {"training_runtime", "mpi", "common"} <= set(record["ansible_roles_s"])
    assert record["total_s"] >= sum(record["stages_s"].values()) - 1


def test_status_json_lists_every_node_reachable_master_first(local_cluster):
    p = local_cluster.deployer("status", "--json")
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["name"] == "itest" and info["provider"] == "local"
    assert [n["name"] for n in info["nodes"]] == ["itest-master", "itest-worker-1", "itest-worker-2"]
    assert [n["role"] for n in info["nodes"]] == ["master", "worker", "worker"]
    assert all(n["reachable"] and n["state"] == "ok" for n in info["nodes"])
    assert all(set(n) == {"name", "role", "id", "private_ip", "public_ip", "gpus", "host", "host_id", "zone", "state",
                          "reachable"} for n in info["nodes"])
    # A local cluster is one host, this machine (placement: the same fields as on OpenStack).
    assert {(n["host"], n["zone"]) for n in info["nodes"]} == {(socket.gethostname(), "local")}
    assert len({n["id"] for n in info["nodes"]}) == NODES and info["extra"] == []
    assert all(n["private_ip"].startswith(SUBNET.rsplit(".", 2)[0]) for n in info["nodes"])


def test_mpirun_across_every_node_typed_as_a_user_would(local_cluster):
    p = local_cluster.deployer("ssh", "--", f"mpirun -np {NODES} --hostfile /shared/hostfile hostname")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()) == ["itest-master", "itest-worker-1", "itest-worker-2"]


def test_ssh_passes_stdin_stdout_and_exit_code(local_cluster):
    p = local_cluster.deployer("ssh", "worker-2", "--", "cat; exit 3", input="ping\n")
    assert p.returncode == 3 and p.stdout == "ping\n"


def test_cluster_user_is_not_root_and_has_sudo(local_cluster):
    p = local_cluster.deployer("ssh", "--", "id -un; sudo -n id -un")
    assert p.stdout.split() == ["deployer", "root"]


def test_passwordless_ssh_between_workers_with_pinned_host_keys(local_cluster):
    cmd = "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes itest-worker-2 hostname"
    p = local_cluster.deployer("ssh", "worker-1", "--", cmd)
    assert p.returncode == 0 and p.stdout.strip() == "itest-worker-2", p.stderr


def test_shared_dir_is_shared(local_cluster):
    local_cluster.deployer("ssh", "worker-1", "--", "echo from-worker-1 > /shared/probe")
    p = local_cluster.deployer("ssh", "worker-2", "--", "cat /shared/probe")
    assert p.stdout.strip() == "from-worker-1"


def test_training_runtime_on_every_node(local_cluster):
    p = local_cluster.deployer(
        "ssh",
        "--",
        f"mpirun -np {NODES} --hostfile /shared/hostfile "
        "python -c 'import torch, mpi4py.MPI as M; print(M.COMM_WORLD.Get_size(), torch.__version__)'",
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    assert sum(1 for line in lines if line.startswith(f"{NODES} 2.13")) == NODES


def test_up_brings_back_a_stopped_node(local_cluster):
    # What a host reboot does to a node; Terraform's record still says it exists.
    subprocess.run(["lxc-stop", "-n", "itest-worker-2", "-k"], check=True)
    p = local_cluster.deployer("up", timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "itest-worker-2 was stopped" in p.stderr
    status = json.loads(local_cluster.deployer("status", "--json").stdout)
    assert all(n["state"] == "ok" for n in status["nodes"])


def test_rerun_with_ansible_changes_nothing(local_cluster):
    # --reconfigure runs every role again: each must report no change.
    p = local_cluster.deployer("up", "--reconfigure", timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "terraform: 0 added, 0 changed, 0 destroyed" in p.stderr
    assert ", 0 changed on all 3 node(s)" in p.stderr, p.stderr[-3000:]
    assert "no changes" in p.stderr


def test_plain_rerun_skips_unchanged_configuration(local_cluster):
    p = local_cluster.deployer("up", timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "configuration unchanged since the last successful run" in p.stderr
    assert "smoke check: mpirun reached" in p.stderr and "no changes" in p.stderr


def test_scale_in_without_yes_is_refused_and_changes_nothing(local_cluster):
    p = local_cluster.deployer("up", "--nodes", "2")
    assert p.returncode == 2 and "would destroy itest-worker-2" in p.stderr
    assert len(local_cluster.cluster_output().nodes) == 3


def test_second_verb_is_locked_out(local_cluster):
    import fcntl
    import os

    fd = os.open(local_cluster.state / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        p = local_cluster.deployer("up")
        assert p.returncode == 1 and "busy" in p.stderr
    finally:
        os.close(fd)
