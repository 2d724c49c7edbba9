"""One cluster name, one cluster per machine: a second working directory that asks for the
shared cluster's name is refused before anything is made, and its `down` touches nothing.
(Before, its `up` failed half-way and its `down` destroyed the first directory's cluster.)"""

from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import NAME, Cluster

pytestmark = pytest.mark.integration


def _containers() -> list[str]:
    return sorted(n for n in subprocess.run(["lxc-ls", "-1"], capture_output=True, text=True, check=True).stdout.split()
                  if n.startswith(f"{NAME}-"))


def test_a_second_directory_cannot_take_a_name_in_use(local_cluster, tmp_path):
    before = _containers()
    other = Cluster(tmp_path)
    (other.workdir / "cluster.yaml").write_text((local_cluster.workdir / "cluster.yaml").read_text())
    p = other.deployer("up", timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"in use on this machine by the state dir {local_cluster.state.resolve()}" in lines[0], p.stderr
    assert not (other.workdir / ".deployer").exists()  # nothing made
    d = other.deployer("down", "--yes", timeout=300)
    assert d.returncode in (0, 1) and "Traceback" not in d.stderr, d.stderr
    assert _containers() == before
    s = local_cluster.deployer("status", "--json")
    assert s.returncode == 0 and '"state": "ok"' in s.stdout


def test_each_container_carries_its_clusters_id_and_the_driver_guards_it(local_cluster):
    """The driver records the id of the cluster that made each container; asked by another
    cluster's Terraform (another id) to destroy one, it refuses and the node keeps running."""
    import json
    import sys

    from deployer.providers.local import node

    own = json.loads((local_cluster.state / "origin.json").read_text())["cluster_id"]
    assert {node.cluster_id_of(n) for n in _containers()} == {own}
    master = f"{NAME}-master"
    # As Terraform calls it: the node's arguments as JSON (terraform/local/main.tf's input.node).
    args = json.dumps({"name": master, "cluster_id": "000000000000"})
    p = subprocess.run([sys.executable, "-m", "deployer.providers.local.lxc", "node-down"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "DEPLOYER_LXC_ARGS": args})
    assert p.returncode == 1 and "belongs to another cluster" in p.stderr, p.stderr
    assert node.node_state(master) == "RUNNING"
    s = local_cluster.deployer("status", "--json")
    assert s.returncode == 0 and json.loads(s.stdout)["id"] == own
