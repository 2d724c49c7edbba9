"""Inventory and hostfile rendering from the `cluster` output contract."""

import shlex

import pytest
import yaml

from deployer.cluster import Cluster
from deployer.errors import UsageError
from deployer.pipeline import boot, inventory
from deployer.spec import ClusterSpec
from deployer.state import ClusterState

LOCAL = {
    "name": "demo",
    "provider": "local",
    "ssh_user": "deployer",
    "shared_dir": "/shared",
    "access": "direct",
    "cluster_cidr": "10.77.0.0/24",
    "shared_storage": "host_bind",
    "grafana_installable": False,
    "host_package_sources": True,
    "nodes": [
        {"name": "demo-master", "role": "master", "private_ip": "10.77.0.10", "public_ip": "10.77.0.10", "gpus": 0},
        {"name": "demo-worker-1", "role": "worker", "private_ip": "10.77.0.11", "public_ip": None, "gpus": 0},
        {"name": "demo-worker-2", "role": "worker", "private_ip": "10.77.0.12", "public_ip": None, "gpus": 0},
    ],
}

CLOUD = {
    "name": "gpu",
    "provider": "openstack",
    "ssh_user": "ubuntu",
    "shared_dir": "/shared",
    "access": "via_master",
    "cluster_cidr": "192.168.77.0/24",
    "shared_storage": "nfs",
    "grafana_installable": True,
    "host_package_sources": False,
    "nodes": [
        {"name": "gpu-master", "role": "master", "private_ip": "192.168.77.10", "public_ip": "203.0.113.5", "gpus": 2},
        {"name": "gpu-worker-1", "role": "worker", "private_ip": "192.168.77.11", "public_ip": None, "gpus": 2},
    ],
}


def test_hostfile_one_line_per_node_slots_are_gpus_or_one():
    assert inventory.hostfile(Cluster.parse(LOCAL)) == "10.77.0.10 slots=1\n10.77.0.11 slots=1\n10.77.0.12 slots=1\n"
    assert inventory.hostfile(Cluster.parse(CLOUD)) == "192.168.77.10 slots=2\n192.168.77.11 slots=2\n"


def _state(tmp_path, cluster):
    st = ClusterState(tmp_path, cluster["name"])
    boot.ensure_host_keys(st, [n["name"] for n in cluster["nodes"]])
    return st


def test_groups_and_host_vars(tmp_path):
    st = _state(tmp_path, LOCAL)
    inv = inventory.render(Cluster.parse(LOCAL), ClusterSpec(nodes=3), st)["all"]
    assert list(inv["hosts"]) == ["demo-master", "demo-worker-1", "demo-worker-2"]
    assert list(inv["children"]["master"]["hosts"]) == ["demo-master"]
    assert list(inv["children"]["workers"]["hosts"]) == ["demo-worker-1", "demo-worker-2"]
    assert inv["children"]["gpu"]["hosts"] == {}
    w = inv["hosts"]["demo-worker-2"]
    assert (w["ansible_host"], w["private_ip"], w["node_role"], w["node_index"], w["gpus"]) == (
        "demo-worker-2",
        "10.77.0.12",
        "worker",
        2,
        0,
    )
    assert "deployer_host_keys" not in w  # the nodes trust the cluster's host CA, not each key
    assert inv["vars"]["deployer_host_ca"] == boot.ensure_host_ca(st)
    assert inv["vars"]["deployer_host_ca"] == " ".join(boot.host_ca_path(st).with_suffix(".pub").read_text().split()[:2])
    assert inv["vars"]["deployer_cluster_cidr"] == "10.77.0.0/24"
    assert inv["vars"]["deployer_provider"] == "local"


def test_ansible_reaches_nodes_through_the_clusters_ssh_config(tmp_path):
    # Host key checking, the key and the hop through the master all live in one file
    # (tested in test_boot.py); Ansible reads it like every other SSH of the deployer.
    st = _state(tmp_path, CLOUD)
    spec = ClusterSpec(name="gpu", provider="openstack", nodes=2)
    hosts = inventory.render(Cluster.parse(CLOUD), spec, st)["all"]["hosts"]
    for name, host in hosts.items():
        assert shlex.split(host["ansible_ssh_common_args"]) == ["-F", str(st.ssh_config)]
        assert host["ansible_host"] == name and host["ansible_user"] == "ubuntu"
    inv = inventory.render(Cluster.parse(CLOUD), spec, st)["all"]
    assert list(inv["children"]["gpu"]["hosts"]) == ["gpu-master", "gpu-worker-1"]


def test_a_replaced_node_leaves_the_inventory_as_it_was(tmp_path):
    # The inventory is part of the configuration fingerprint (drift.py): a node's new id
    # must not make every node "changed", only the replaced one is configured.
    st = _state(tmp_path, LOCAL)
    before = {**LOCAL, "nodes": [{**n, "id": f"old-{i}"} for i, n in enumerate(LOCAL["nodes"])]}
    after = {**LOCAL, "nodes": [{**n, "id": "new-1" if i == 1 else f"old-{i}"} for i, n in enumerate(LOCAL["nodes"])]}
    assert inventory.render(Cluster.parse(before), ClusterSpec(nodes=3), st) == inventory.render(
        Cluster.parse(after), ClusterSpec(nodes=3), st
    )


def test_write_produces_yaml_and_hostfile(tmp_path):
    st = _state(tmp_path, LOCAL)
    path = inventory.write(Cluster.parse(LOCAL), ClusterSpec(nodes=3), st)
    assert yaml.safe_load(path.read_text())["all"]["hosts"]["demo-master"]["ansible_user"] == "deployer"
    assert (st.inventory_dir / "hostfile").read_text().count("\n") == 3


@pytest.mark.parametrize(
    "query, expected",
    [
        (None, "demo-master"),
        ("master", "demo-master"),
        ("worker-2", "demo-worker-2"),
        ("demo-worker-1", "demo-worker-1"),
        ("10.77.0.11", "demo-worker-1"),
    ],
)
def test_find_node(query, expected):
    assert Cluster.parse(LOCAL).find(query).name == expected


def test_find_node_unknown_lists_the_choices():
    with pytest.raises(UsageError, match="demo-master, demo-worker-1"):
        Cluster.parse(LOCAL).find("worker-9")
