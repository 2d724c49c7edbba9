"""The cloud's first boot, run for real: cloud-init NoCloud, pinned host keys, workers
reached only through the master (the shared cluster uses local.access: via_master)."""

from __future__ import annotations

import json
import subprocess

import pytest

from .conftest import NAME

pytestmark = pytest.mark.integration
NODES = [f"{NAME}-master", f"{NAME}-worker-1", f"{NAME}-worker-2"]


def test_up_waited_for_every_node_to_boot(local_cluster):
    for node in NODES:
        assert f"{node} booted: SSH with its pinned key, cloud-init done" in local_cluster.up_log


@pytest.mark.parametrize("node", ["master", "worker-1", "worker-2"])
def test_every_node_booted_through_cloud_init_nocloud(local_cluster, node):
    p = local_cluster.deployer("ssh", node, "--", "cloud-init status --long")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "status: done" in p.stdout
    assert "DataSourceNoCloud" in p.stdout
    assert "errors" not in p.stdout.replace("errors: []", "")


def test_the_user_data_made_the_user_and_the_first_contact_replaced_its_host_key(local_cluster):
    # The bootstrap key in user-data (readable on a VM from the metadata service, and kept by
    # cloud-init on disk) opened the first connection only: the node serves a key made on it
    # since, which the state dir pins and the cluster's host CA certifies (every node's
    # known_hosts trusts the CA), and nothing accepts the old.
    p = local_cluster.deployer(
        "ssh",
        "worker-1",
        "--",
        "sudo -n awk '{print $1, $2}' /etc/ssh/ssh_host_ed25519_key.pub; ls /etc/ssh/ | grep -c '^ssh_host_'; sudo -n id -un; "
        "sudo -n cat /var/lib/cloud/instance/user-data.txt "
        "| python3 -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)[\"ssh_keys\"][\"ed25519_public\"])'",
    )
    served, count, root, from_user_data = p.stdout.split("\n")[:4]
    pinned = json.loads((local_cluster.state / "ssh" / "host_keys" / f"{NAME}-worker-1_ed25519.pinned").read_text())
    assert pinned["keys"] == [served]
    assert from_user_data.startswith("ssh-ed25519 ") and from_user_data != served
    assert count == "3"  # the node's own ed25519 pair and its certificate: the image's keys were deleted
    assert root == "root"
    assert "a fresh host key made on all 3 node(s) and pinned" in local_cluster.up_log
    known_here = (local_cluster.state / "ssh" / "known_hosts").read_text()
    assert served in known_here and from_user_data not in known_here
    # The nodes trust the cluster's host CA, which certified the node's own key (and no other).
    mesh = local_cluster.deployer("ssh", "master", "--", "cat /etc/ssh/ssh_known_hosts").stdout
    ca = " ".join((local_cluster.state / "ssh" / "host_ca_ed25519.pub").read_text().split()[:2])
    assert f"@cert-authority {NAME}-master," in mesh and ca in mesh and from_user_data not in mesh
    cert = local_cluster.deployer("ssh", "worker-1", "--", "ssh-keygen -L -f /etc/ssh/ssh_host_ed25519_key-cert.pub").stdout
    assert "host certificate" in cert and f"{NAME}-worker-1" in cert


def test_host_reaches_only_the_master(local_cluster):
    out = local_cluster.cluster_output()
    worker_ip = out.workers[0].private_ip
    key = local_cluster.state / "ssh" / "id_ed25519"
    direct = subprocess.run(
        ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", f"deployer@{worker_ip}", "true"],
        capture_output=True, text=True, timeout=30,
    )
    assert direct.returncode == 255 and "Connection refused" in direct.stderr, direct.stderr
    through = local_cluster.deployer("ssh", "worker-1", "--", "hostname")
    assert through.returncode == 0 and through.stdout.strip() == f"{NAME}-worker-1", through.stderr


def test_ssh_config_reaches_a_worker_with_plain_ssh(local_cluster, tmp_path):
    p = local_cluster.deployer("ssh-config")
    assert p.returncode == 0, p.stderr
    cfg = tmp_path / "config"
    cfg.write_text(p.stdout)
    r = subprocess.run(["ssh", "-F", str(cfg), f"{NAME}-worker-2", "hostname"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"{NAME}-worker-2", r.stderr


def test_a_node_with_another_host_key_is_refused_then_replaced(local_cluster):
    # What a VM rebuilt outside the deployer looks like: same address, another host key.
    regen = "rm -f /etc/ssh/ssh_host_ed25519_key*; ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key; systemctl restart ssh"
    subprocess.run(["lxc-attach", "-n", f"{NAME}-worker-2", "--", "sh", "-c", regen], check=True, timeout=60)
    p = local_cluster.deployer("up", "--reconfigure", timeout=900)
    assert p.returncode == 1, p.stderr[-3000:]
    last = [line for line in p.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"error: {NAME}-worker-2 serves an SSH host key that is not the one deployer pinned")
    assert f"deployer up --replace {NAME}-worker-2" in last

    fixed = local_cluster.deployer("up", "--replace", "worker-2", timeout=900)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "terraform: 1 added, 0 changed, 1 destroyed" in fixed.stderr
    assert f"smoke check: mpirun reached {', '.join(NODES)}" in fixed.stderr


@pytest.mark.parametrize("node", ["master", "worker-1"])
def test_ansible_refuses_a_node_whose_host_key_is_not_the_pinned_one(local_cluster, node, tmp_path):
    """Ansible's own connections (Mitogen's) check the pinned known_hosts as every other
    SSH does: with another key pinned for the node, the play cannot reach it."""
    from deployer.errors import OperationFailed
    from deployer.tools.ansible import run_playbook

    known_hosts = local_cluster.state / "ssh" / "known_hosts"
    pinned = known_hosts.read_text()
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    name = f"{NAME}-{node}"
    lines = [f"{ln.split()[0]} {wrong}" if ln.startswith(f"{name},") else ln for ln in pinned.splitlines()]
    assert lines != pinned.splitlines()
    play = tmp_path / "play.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - name: Reach the node\n      ansible.builtin.ping:\n")
    run_dir = tmp_path / "state" / "runs" / "1-check"
    run_dir.mkdir(parents=True)
    try:
        known_hosts.write_text("\n".join(lines) + "\n")
        with pytest.raises(OperationFailed, match=rf"{name}: Reach the node: .*(mismatching host key|Host key verification failed)"):
            run_playbook(local_cluster.state / "inventory" / "hosts.yml", run_dir, playbook=str(play), limit=[name])
    finally:
        known_hosts.write_text(pinned)
