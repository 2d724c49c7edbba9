"""A node whose creation failed is still the cluster's (issue 44, item 8), on a real local
cluster of its own: the containers made, then `lxc-start` aborted (a failing `lxc-start`
first on PATH, which Terraform's local-exec hands to the driver). Terraform keeps such a
node as a tainted resource and runs no destroy provisioner for it, so `down` used to
destroy Terraform's state and then refuse ("down left node ... behind; remove by hand").
Now `down` removes the containers carrying this cluster's id, and the next `up` makes
such a node anew before it starts it."""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.conftest import Cluster, _why_not, leftovers

NAME = "ifail"
SUBNET = "10.82.0.0/24"
SPEC = f"name: {NAME}\nnodes: 2\nmonitoring: false\njupyter: false\nlocal:\n  subnet: {SUBNET}\n"


def _seeded_id(node: str) -> str | None:
    from deployer.providers.local.node import instance_id

    return instance_id(node)


@pytest.fixture
def failing_start(tmp_path):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "lxc-start").write_text("#!/bin/sh\necho 'lxc-start: aborted (the test says so)' >&2\nexit 1\n")
    (bindir / "lxc-start").chmod(0o755)
    c = Cluster(tmp_path / "work", name=NAME)
    c.workdir.mkdir()
    (c.workdir / "cluster.yaml").write_text(SPEC)
    try:
        yield c, {"PATH": f"{bindir}:{os.environ['PATH']}"}
    finally:
        c.deployer("down", "--yes", timeout=600)


def test_down_removes_the_nodes_of_a_failed_up(failing_start):
    c, broken = failing_start
    p = c.deployer("up", "--no-check", env=broken, timeout=1800)
    assert p.returncode == 1, p.stderr
    assert "aborted (the test says so)" in p.stderr
    cluster_id = json.loads((c.state / "origin.json").read_text())["cluster_id"]
    made = [n for n in leftovers(NAME) if n.startswith(f"{NAME}-")]
    assert made, "the containers were made before lxc-start failed"
    from deployer.providers.local.node import cluster_id_of

    assert {cluster_id_of(n) for n in made} == {cluster_id}
    d = c.deployer("down", "--yes", timeout=600)
    assert d.returncode == 0, d.stderr
    assert "left by a creation that failed" in d.stderr
    assert leftovers(NAME) == []
    assert not (c.state / "origin.json").exists()


def test_the_next_up_makes_the_failed_nodes_anew_and_comes_up(failing_start):
    c, broken = failing_start
    assert c.deployer("up", "--no-check", env=broken, timeout=1800).returncode == 1
    failed_ids = {n: _seeded_id(n) for n in (f"{NAME}-master", f"{NAME}-worker-1")}
    p = c.deployer("up", "--no-check", timeout=2400)
    assert p.returncode == 0, p.stderr[-4000:]
    nodes = {n["name"]: n["id"] for n in json.loads((c.state / "cluster.json").read_text())["nodes"]}
    for name, old in failed_ids.items():
        assert _seeded_id(name) == nodes[name] != old  # made anew with Terraform's id, not started as it was
    d = c.deployer("down", "--yes", timeout=600)
    assert d.returncode == 0, d.stderr
    assert leftovers(NAME) == []
