"""Pure parts of the LXC node driver, checked by the tools that consume them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from deployer.providers.local import host, lxc, network, node, pinning


def test_stable_mac_is_derived_from_the_address():
    # A node recreated at the same address gets the same MAC: no stale neighbour entry.
    assert node.stable_mac("10.77.0.11/24") == "02:d5:0a:4d:00:0b"
    assert node.stable_mac("10.77.0.11/24") == node.stable_mac("10.77.0.11/26")
    assert node.stable_mac("10.77.0.12/24") != node.stable_mac("10.77.0.11/24")


def test_via_master_adds_only_the_host_to_worker_rule():
    direct = network.ruleset("demo", "dpl-demo", "10.77.0.0/24")
    isolated = network.ruleset("demo", "dpl-demo", "10.77.0.0/24", only_master="10.77.0.10")
    assert "hook output" not in direct
    assert 'oifname "dpl-demo" ip daddr != 10.77.0.10 ct state new reject' in isolated
    assert isolated.replace(network._isolation("dpl-demo", "10.77.0.10"), "") == direct


@pytest.mark.skipif(shutil.which("nft") is None or os.geteuid() != 0, reason="needs nft and root (nft -c parses against the kernel)")
@pytest.mark.parametrize("only_master", [None, "10.77.0.10"])
def test_nft_accepts_the_ruleset(only_master):
    # -c: check only; nothing is loaded.
    p = subprocess.run(["nft", "-c", "-f", "-"], input=network.ruleset("demo", "dpl-demo", "10.77.0.0/24", only_master),
                       text=True, capture_output=True)
    assert p.returncode == 0, p.stderr


def test_parse_containers_keeps_the_clusters_nodes_only():
    every = "demo-master\ndemo-worker-1\ndemo-worker-12\ndemo-workers\ndemo2-master\nother-master\n"
    running = "demo-master\ndemo-workers\nother-master\n"
    assert node.parse_containers(every, running, "demo") == {
        "demo-master": "running",
        "demo-worker-1": "stopped",
        "demo-worker-12": "stopped",
    }
    assert node.parse_containers("", "", "demo") == {}


def test_driver_errors_stay_in_the_error_family(tmp_path, capsys):
    from deployer.errors import DeployerError

    with pytest.raises(DeployerError, match="no user-data"):
        node.node_up(node.NodeUp("zz-unit-master", "10.99.0.10/24", "10.99.0.1", "dpl-none", f"{tmp_path}:/shared", 512,
                                 str(tmp_path / "absent")))
    # Only the command-line entry point turns it into an exit status.
    args = {"name": "zz-unit-master", "ip": "10.99.0.10/24", "gateway": "10.99.0.1", "bridge": "x", "shared": f"{tmp_path}:/shared",
            "memory_mb": 512, "user_data": str(tmp_path / "absent")}
    assert lxc.main(["node-up"], {lxc.ARGS_ENV: json.dumps(args)}) == 1
    assert "no user-data" in capsys.readouterr().err
    assert lxc.main(["node-up"], {lxc.ARGS_ENV: json.dumps(args | {"memory": 1})}) == 1  # a field NodeUp lacks: refused
    assert "must hold the NodeUp fields" in capsys.readouterr().err


def test_terraform_hands_the_driver_exactly_its_arguments():
    """terraform/local/main.tf keeps each resource's driver arguments in `input.network` and
    `input.node`, passed whole as JSON: their keys are NetworkUp's and NodeUp's fields (the
    node's instance_id comes from Terraform's own id)."""
    import dataclasses

    hcl2 = pytest.importorskip("hcl2")
    doc = hcl2.loads((Path(__file__).resolve().parents[2] / "terraform" / "local" / "main.tf").read_text())
    inputs = {name.strip('"'): body["input"] for item in doc["resource"] for named in item.values() for name, body in named.items()}
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (network.NetworkUp, node.NodeUp)}
    assert set(inputs["network"]["network"]) == fields[network.NetworkUp]
    assert set(inputs["node"]["node"]) | {"instance_id"} == fields[node.NodeUp]
    assert "merge(self.input.node, { instance_id = self.id })" in (
        Path(__file__).resolve().parents[2] / "terraform" / "local" / "main.tf"
    ).read_text()


def test_cpu_plan_gives_each_node_its_own_cores_when_there_are_enough():
    assert pinning.cpu_plan([0, 1], 2) == ["0", "1"]
    assert pinning.cpu_plan([0, 1, 2, 3, 4, 5, 6, 7], 3) == ["0,1", "2,3", "4,5"]  # 6 and 7 stay free
    assert pinning.cpu_plan([2, 3, 5], 1) == ["2,3,5"]  # the host's allowed cores, whatever their numbers
    assert pinning.cpu_plan([0, 1], 3) is None  # fewer cores than nodes: they share


def _tool(bindir, name, rc, stdout="", stderr=""):
    script = bindir / name
    script.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\nprintf '%s' '{stderr}' >&2\nexit {rc}\n")
    script.chmod(0o755)


@pytest.mark.parametrize(("lxc_ls", "nft", "fragment"), [
    ((1, "", "lxc-ls: Failed to load config"), (1, "", "Error: No such file or directory"), "lxc-ls -1 failed"),
    ((0, "", ""), (1, "", "Error: Operation not permitted"), "cannot tell whether nftables table"),
])
def test_a_provider_that_cannot_see_says_so_rather_than_nothing(tmp_path, monkeypatch, lxc_ls, nft, fragment):
    """`down` proves a cluster gone by observe(): a failing `lxc-ls` or `nft` used to read as
    "no containers, no table", and `down` deleted the state while containers ran."""
    from deployer.errors import OperationFailed
    from deployer.providers.local.provider import LocalProvider
    from deployer.state import ClusterState

    bindir = tmp_path / "bin"
    bindir.mkdir()
    _tool(bindir, "lxc-ls", *lxc_ls)
    _tool(bindir, "nft", *nft)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    with pytest.raises(OperationFailed, match=fragment):
        LocalProvider().observe(ClusterState(tmp_path, "blind"), {}, ["blind-master"])


def test_a_table_that_is_not_there_is_absent(tmp_path, monkeypatch):
    from deployer.providers.local.provider import LocalProvider
    from deployer.state import ClusterState

    bindir = tmp_path / "bin"
    bindir.mkdir()
    _tool(bindir, "lxc-ls", 0, "other-master\n")
    _tool(bindir, "nft", 1, "", "Error: No such file or directory")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    seen = LocalProvider().observe(ClusterState(tmp_path, "gone"), {}, ["gone-master"])
    assert seen.remaining() == []


def test_ip_forward_is_turned_off_again_by_the_last_down_only_when_the_deployer_turned_it_on(tmp_path, monkeypatch):
    # The switch and the mark in files of the test's own; nft answers as the host would.
    switch, mark = tmp_path / "ip_forward", tmp_path / "mark"
    monkeypatch.setattr(network, "IP_FORWARD", switch)
    monkeypatch.setattr(network, "FORWARD_MARK", mark)
    tables = {"text": ""}
    monkeypatch.setattr(network, "sh", lambda *a, **k: subprocess.CompletedProcess(a, 0, tables["text"], ""))
    switch.write_text("0\n")
    network.forwarding_on()
    assert switch.read_text() == "1\n" and mark.exists()
    tables["text"] = "table ip deployer_other\n"  # another cluster still up: stays on
    network.forwarding_restored()
    assert switch.read_text() == "1\n"
    tables["text"] = "table inet filter\n"
    network.forwarding_restored()
    assert switch.read_text() == "0\n" and not mark.exists()
    # On before the deployer came: left on.
    switch.write_text("1\n")
    network.forwarding_on()
    network.forwarding_restored()
    assert switch.read_text() == "1\n" and not mark.exists()


@pytest.mark.skipif(shutil.which("lxc-info") is None, reason="needs lxc-info (apt-get install lxc)")
def test_the_driver_never_destroys_a_container_another_cluster_made(monkeypatch, tmp_path):
    """node-down of cluster A's Terraform, on a container of the same name that cluster B
    made (its id recorded beside the config): refused, and the container stays."""
    monkeypatch.setattr(node, "LXC_PATH", tmp_path)
    name = "idtest-master"  # no such container: lxc-info says ABSENT, only the directory is at stake
    (tmp_path / name).mkdir()
    (tmp_path / name / node.CLUSTER_ID_FILE).write_text("bbbbbbbbbbbb\n")
    assert node.cluster_id_of(name) == "bbbbbbbbbbbb"
    with pytest.raises(host.DriverError, match="belongs to another cluster \\(id bbbbbbbbbbbb, not aaaaaaaaaaaa\\)"):
        node.node_down(name, "aaaaaaaaaaaa")
    assert (tmp_path / name).is_dir()
    as_terraform = {"name": name, "ip": "10.99.0.10/24", "gateway": "10.99.0.1", "bridge": "x", "shared": f"{tmp_path}:/shared",
                    "memory_mb": 512, "user_data": "u", "cluster_id": "aaaaaaaaaaaa"}  # main.tf's input.node
    assert lxc.main(["node-down"], {lxc.ARGS_ENV: json.dumps(as_terraform)}) == 1
    assert (tmp_path / name).is_dir()
    node.node_down(name, "bbbbbbbbbbbb")  # its own cluster's destroy
    assert not (tmp_path / name).exists()


def test_the_boot_log_hint_names_the_node():
    from deployer.providers.local.provider import LocalProvider

    hint = LocalProvider().boot_log_hint("zz-worker-1")
    assert "lxc-attach -n zz-worker-1 -- journalctl -b" in hint and "/var/lib/lxc/zz-worker-1/lxc.log" in hint
