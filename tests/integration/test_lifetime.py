"""A cluster's lifetime on a real local cluster of its own (1 node, no monitoring or
notebook, so it comes up quickly): `up --ttl`, `status` showing the time left, `gc`
listing it only once expired, `gc --yes` removing every container, bridge and nft table
of it, and the ledger's node-hours. Run from a directory with a space in its name: every
local `up` failed there (an unquoted path in the module's local-exec, and LXC's mount
entry split at the space)."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.conftest import cluster_up, leftovers

NAME = "ittl"
SUBNET = "10.80.0.0/24"


@pytest.fixture(scope="module")
def ttl_cluster(tmp_path_factory):
    spec = f"name: {NAME}\nnodes: 1\nmonitoring: false\njupyter: false\nlocal:\n  subnet: {SUBNET}\n"
    with cluster_up(tmp_path_factory, NAME, spec, "--ttl", "1m", workdir="ttl cluster") as c:
        assert " " in str(c.workdir)
        assert "lifetime: expires in" in c.up_log
        yield c


def test_ttl_shows_in_status_then_gc_removes_the_expired_cluster_and_the_ledger_counts_it(ttl_cluster):
    # `up --ttl` again: the expiry is set anew from now, and nothing else changes.
    p = ttl_cluster.deployer("up", "--ttl", "1m")
    assert p.returncode == 0 and "no changes" in p.stderr, p.stderr[-2000:]
    st = json.loads(ttl_cluster.deployer("status", "--json").stdout)
    assert st["lifetime"]["ttl"] == "1m" and 0 < st["lifetime"]["seconds_left"] <= 60
    assert "expires in" in ttl_cluster.deployer("status").stderr

    p = ttl_cluster.deployer("gc", "--json")
    assert p.returncode == 0 and json.loads(p.stdout) == {"expired": []}, "not expired yet: nothing listed"

    time.sleep(st["lifetime"]["seconds_left"] + 2)
    assert "expired" in ttl_cluster.deployer("status").stderr
    listed = ttl_cluster.deployer("gc", "--json")
    assert listed.returncode == 0 and [(e["name"], e["action"]) for e in json.loads(listed.stdout)["expired"]] == [(NAME, "listed")]
    dry = ttl_cluster.deployer("gc", "--dry-run", "--yes")
    assert dry.returncode == 0 and f"would destroy {NAME}-master" in dry.stderr
    assert leftovers(NAME), "listing and --dry-run destroy nothing"

    gone = ttl_cluster.deployer("gc", "--yes", "--json", timeout=600)
    assert gone.returncode == 0, gone.stderr[-2000:]
    assert [e["action"] for e in json.loads(gone.stdout)["expired"]] == ["destroyed"]
    assert leftovers(NAME) == []
    assert not (ttl_cluster.state / "lifetime.json").exists()

    use = json.loads(ttl_cluster.deployer("ledger", "--json").stdout)
    (mine,) = [c for c in use["clusters"] if c["cluster"] == NAME]
    assert mine["live"] is False and mine["destroyed"] and mine["node_hours"] > 0 and mine["gpu_hours"] == 0
    assert sum(m["node_hours"] for m in use["months"]) == pytest.approx(mine["node_hours"], abs=0.002)
