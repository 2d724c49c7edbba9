"""Drift repaired by a plain `up`: a node deleted outside the deployer, a host reboot;
`status` says what is wrong first; a damaged record is one line naming it."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from .conftest import NAME, NODES

pytestmark = pytest.mark.integration

ALL = [f"{NAME}-master", *(f"{NAME}-worker-{i}" for i in range(1, NODES))]


def states(cluster) -> dict[str, str]:
    p = cluster.deployer("status", "--json")
    assert p.returncode == 0, p.stderr
    return {n["name"]: n["state"] for n in json.loads(p.stdout)["nodes"]}


def test_a_worker_deleted_outside_is_recreated_and_configured_alone(local_cluster):
    victim = f"{NAME}-worker-1"
    subprocess.run(["lxc-destroy", "-f", "-n", victim], check=True, capture_output=True)
    assert states(local_cluster)[victim] == "missing"
    t0 = time.monotonic()
    p = local_cluster.deployer("up", timeout=900)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    print(f"repair of a deleted worker: {took:.1f}s")  # for the closing note
    assert f"{victim} is missing (deleted outside the deployer)" in p.stderr
    assert "terraform: 1 added, 0 changed, 1 destroyed" in p.stderr
    # The new server's own host key (rekey.py) is certified by the cluster's host CA, which the
    # other nodes trust already: the new node is configured alone.
    assert f"ssh: a fresh host key made on {victim} and pinned" in p.stderr
    assert f"ansible: configuring {victim} (new since the last configuration)" in p.stderr or \
        f"ansible: configuring {victim} (replaced since the last configuration)" in p.stderr, p.stderr[-3000:]
    assert f"smoke check: mpirun reached {', '.join(ALL)}" in p.stderr
    assert set(states(local_cluster).values()) == {"ok"}
    again = local_cluster.deployer("up", timeout=900)
    assert "configuration unchanged since the last successful run" in again.stderr, again.stderr[-2000:]


def test_after_a_host_reboot_status_says_so_and_up_converges(local_cluster):
    # A reboot stops every container and takes the bridge and the firewall table with it.
    for node in ALL:
        subprocess.run(["lxc-stop", "-k", "-n", node], check=True, capture_output=True)
    subprocess.run(["ip", "link", "del", f"dpl-{NAME}"], check=True)
    subprocess.run(["nft", "delete", "table", "ip", f"deployer_{NAME}"], check=True)
    assert set(states(local_cluster).values()) == {"stopped"}
    p = local_cluster.deployer("up", timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    for node in ALL:
        assert f"{node} was stopped" in p.stderr
    assert "configuration unchanged since the last successful run" in p.stderr  # same machines
    assert f"smoke check: mpirun reached {', '.join(ALL)}" in p.stderr
    assert set(states(local_cluster).values()) == {"ok"}
    # The host reaches the master only again: the firewall table is back.
    assert subprocess.run(["nft", "list", "table", "ip", f"deployer_{NAME}"], capture_output=True).returncode == 0


def test_a_truncated_cluster_record_is_one_line_naming_it(local_cluster):
    record = local_cluster.state / "cluster.json"
    good = record.read_text()
    record.write_text(good[: len(good) // 2])
    try:
        p = local_cluster.deployer("status")
        assert p.returncode == 1
        lines = [line for line in p.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and str(record) in lines[0] and "damaged" in lines[0], p.stderr
        assert "Traceback" not in p.stderr
    finally:
        record.write_text(good)
