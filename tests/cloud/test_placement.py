"""openstack.placement on real Nova: the test cloud runs three nova-compute hosts (the fake
virt driver, services.COMPUTE_HOSTS), and what the deployer asked is read back in Nova's
own answers (each server's hostId as the project's member sees it) and in the deployer's
records (cluster.json, `status --json`).

`up --no-setup` only: the fake driver's servers never boot, and placement is decided
before a server boots. The figures (seconds per verb) are printed with `pytest -s` and
kept in docs/openstack.md ("Placement").
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from . import module_resources
from .services import COMPUTE_HOSTS
from .test_module_apply import Verb, cluster_id, servers, state_dir, write_spec
from .test_module_apply import deployer as deployer  # noqa: F401 - the fixture, used by name

pytestmark = pytest.mark.cloud


def hosts_of(conn: Any, name: str) -> dict[str, str]:
    """Server name -> its hostId, as Nova tells the project's member."""
    return {n: s.host_id for n, s in servers(conn, name).items()}


def group_of(conn: Any, name: str, cid: str) -> Any:
    (group,) = [g for g in conn.compute.server_groups() if g.name == f"{name}-{cid}"]
    return group


def test_spread_puts_3_nodes_on_3_hosts_and_5_on_3_as_2_2_1(own_project, deployer, tmp_path, cluster_name):
    """soft-anti-affinity, the default. Terraform creates the servers at once and Nova
    weighs each before the others have a host (here: 3 on 1 host, or 2 + 1), so `up`
    makes the crowded ones it made anew, one at a time (lifecycle.spread_out): 3 nodes end
    on the 3 hosts, and grown to 5, 2 + 2 + 1, the first three where they were."""
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c)  # placement: spread, the default
    up_run = deployer("up", "--nodes", "3", "--no-setup", "--json", label="up 3 spread")
    up = json.loads(up_run.stdout)
    placed = hosts_of(conn, c)
    assert sorted(Counter(placed.values()).values()) == [1, 1, 1], placed
    moved3 = up["replaced_for_placement"]
    assert len(moved3) <= 2 and f"{c}-master" not in {m["node"] for m in moved3}, moved3  # a worker goes first
    assert all(placed[m["node"]] == m["to"] for m in moved3[-1:]), (moved3, placed)
    for m in moved3:
        assert f"placement: {m['node']} shared " in up_run.stderr, m
    assert "placement: 3 node(s) on 3 host(s) in zone nova (1+1+1)" in up_run.stderr
    assert "spread was asked" not in up_run.stderr
    cid = cluster_id(tmp_path, c)
    group = group_of(conn, c, cid)
    assert (group.policy or group.policies[0]) == "soft-anti-affinity"
    assert sorted(group.member_ids) == sorted(s.id for s in servers(conn, c).values()), "each one made anew joined it"

    # The member sees no hypervisor's name: host is the hostId, in the record and in status.
    status = deployer.json("status")
    assert {n["name"]: (n["host"], n["host_id"], n["zone"]) for n in status["nodes"]} == {
        n: (h, h, "nova") for n, h in placed.items()}
    recorded = json.loads((state_dir(tmp_path, c) / "cluster.json").read_text())
    assert {n["name"]: n["host_id"] for n in recorded["nodes"]} == placed
    said = deployer("status").stderr
    assert "3 node(s) on 3 host(s), zone nova" in said

    grown = deployer.json("up", "--nodes", "5", "--no-setup", label="up 5 spread")
    five = hosts_of(conn, c)
    assert sorted(Counter(five.values()).values(), reverse=True) == [2, 2, 1], five
    assert {k: five[k] for k in placed} == placed, "the three that ran before stay where they were"
    moved5 = grown["replaced_for_placement"]
    assert {m["node"] for m in moved5} <= set(five) - set(placed), "only the nodes this run made are made anew"
    assert len(moved5) <= 4
    assert sorted(group_of(conn, c, cid).member_ids) == sorted(s.id for s in servers(conn, c).values())
    # The hostfile puts each host's nodes together, the master's host first.
    nodes = json.loads((state_dir(tmp_path, c) / "cluster.json").read_text())["nodes"]
    by_ip = {n["private_ip"]: five[n["name"]] for n in nodes}
    runs = [by_ip[line.split()[0]] for line in (state_dir(tmp_path, c) / "inventory" / "hostfile").read_text().splitlines()]
    assert runs[0] == five[f"{c}-master"] and runs == sorted(runs, key=runs.index), runs

    deployer("down", "--yes", label="down 5")
    assert module_resources.leftovers(conn, c) == []
    print(f"\nplacement: 3 -> 1+1+1 after {len(moved3)} node(s) made anew, 5 -> 2+2+1 after {len(moved5)}; "
          f"seconds {json.dumps({k: round(v, 1) for k, v in deployer.seconds.items()})}")


def test_hard_spread_puts_3_nodes_on_3_hosts(own_project, deployer, tmp_path, cluster_name):
    """anti-affinity: a rule nova-compute checks again when the server lands (and sends it
    back to the scheduler when two raced onto one host), so 3 made at once are on 3 hosts."""
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, placement_hard=True)
    up = deployer("up", "--nodes", "3", "--no-setup", label="up 3 hard spread")
    assert len(set(hosts_of(conn, c).values())) == 3 == len(COMPUTE_HOSTS)
    assert "placement: 3 node(s) on 3 host(s) in zone nova (1+1+1)" in up.stderr
    assert "this user may not list the cloud's hypervisors" in up.stderr  # a member: Nova is the judge
    group = group_of(conn, c, cluster_id(tmp_path, c))
    assert (group.policy or group.policies[0]) == "anti-affinity"
    deployer("down", "--yes", label="down 3 hard spread")
    assert module_resources.leftovers(conn, c) == []


def test_pack_puts_the_nodes_on_one_host(own_project, deployer, tmp_path, cluster_name):
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, placement="pack")
    up = deployer("up", "--nodes", "3", "--no-setup", label="up 3 pack")
    placed = hosts_of(conn, c)
    assert len(set(placed.values())) == 1, placed
    assert "placement: 3 node(s) on 1 host(s)" in up.stderr and "spread was asked" not in up.stderr
    group = group_of(conn, c, cluster_id(tmp_path, c))
    assert (group.policy or group.policies[0]) == "soft-affinity"
    # The policy is fixed with the group: asking another is refused, and nothing changes.
    write_spec(tmp_path / "cluster.yaml", c, placement="spread")
    refused = deployer("up", "--nodes", "3", "--no-setup", ok=False)
    assert refused.returncode == 2 and "fixed at creation" in refused.stderr
    assert hosts_of(conn, c) == placed
    write_spec(tmp_path / "cluster.yaml", c, placement="pack")
    deployer("down", "--yes", label="down 3 pack")
    assert module_resources.leftovers(conn, c) == []


def test_hard_spread_over_more_nodes_than_hosts_is_refused_before_anything_is_made(admin, os_env, tmp_path, cluster_name,
                                                                                  test_cloud):
    # Only a user who may list the hypervisors (an admin, by Nova's default policy) can be
    # told before: a member gets a warning, and Nova's "no valid host" for the fourth node.
    c = cluster_name
    write_spec(tmp_path / "cluster.yaml", c, cloud="testcloud-admin", placement_hard=True)
    verb = Verb(tmp_path, test_cloud.ports)
    refused = verb("up", "--nodes", str(len(COMPUTE_HOSTS) + 1), "--no-setup", ok=False, label="refused")
    said = [line for line in refused.stderr.splitlines() if line.startswith("error")]
    assert refused.returncode == 2 and len(said) == 1, refused.stderr
    assert f"the cloud has {len(COMPUTE_HOSTS)} up and enabled for {len(COMPUTE_HOSTS) + 1} nodes" in said[0]
    assert module_resources.leftovers(admin, c) == []
    assert not (state_dir(tmp_path, c) / "cluster.json").exists() and not Path(state_dir(tmp_path, c), "terraform").exists()
