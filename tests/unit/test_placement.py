"""Placement: where each node landed, read back and used, from a recorded placement (no
cloud): the record, the hostfile's order, Slurm's topology.conf, the check's network
matrix, bench's hosts, the warnings and the preflight's refusals.

The test cloud runs three fake compute hosts for the same on real Nova
(tests/cloud/test_placement.py).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from deployer.bench import report as bench_report
from deployer.check import cluster_checks
from deployer.check.model import NodeReport
from deployer.cluster import Cluster
from deployer.pipeline import inventory, placement
from deployer.providers.base import Machine, Observation
from deployer.providers.openstack import placement as os_placement
from deployer.providers.openstack.quota import needs
from deployer.slurm import topology_conf
from deployer.spec import ClusterSpec
from deployer.status import by_host

H1, H2, H3 = "a1" * 28, "b2" * 28, "c3" * 28  # hostIds: 56 hex digits, as Nova gives them

# Five nodes on three hosts, as soft-anti-affinity leaves them (2 + 2 + 1), recorded in an
# order that interleaves the hosts: the master on H1, worker-1 on H2, worker-2 on H3...
PLACED = {n: h for n, h in [("lab-master", H1), ("lab-worker-1", H2), ("lab-worker-2", H3),
                            ("lab-worker-3", H1), ("lab-worker-4", H2)]}


def _cluster(hosts: dict[str, str | None] | None = None, provider: str = "openstack") -> Cluster:
    hosts = PLACED if hosts is None else hosts
    return Cluster.parse({
        "name": "lab", "provider": provider, "ssh_user": "ubuntu", "shared_dir": "/shared",
        "nodes": [{"name": n, "role": "master" if i == 0 else "worker", "private_ip": f"10.0.0.{10 + i}", "gpus": 1,
                   "host": h, "host_id": h, "zone": "nova" if h else None}
                  for i, (n, h) in enumerate(hosts.items())],
    })


def test_the_record_keeps_host_and_zone_and_reads_old_records_without_them():
    c = _cluster()
    again = Cluster.parse(json.loads(json.dumps(c.to_output())))
    assert again == c and again.workers[0].host == H2 and again.master.zone == "nova"
    old = _cluster({n: None for n in PLACED})
    assert old.master.host is None and old.by_host == old.nodes, "no placement known: the nodes' own order"
    assert old.hosts_of(3) is None and topology_conf(old) is None


def test_observation_fills_the_record_and_keeps_what_it_does_not_say():
    c = _cluster({n: None for n in PLACED})
    seen = Observation(nodes={"lab-master": Machine("running", "id0", host="h", host_id="x", zone="z"),
                              "lab-worker-1": Machine("missing")})
    placed = placement.located(c, seen)
    assert (placed.master.host, placed.master.host_id, placed.master.zone) == ("h", "x", "z")
    assert placed.workers[0].host is None


def test_hostfile_puts_each_hosts_nodes_together_master_first():
    c = _cluster()
    assert [n.name for n in c.by_host] == ["lab-master", "lab-worker-3", "lab-worker-1", "lab-worker-4", "lab-worker-2"]
    assert inventory.hostfile(c).splitlines() == [
        "10.0.0.10 slots=1", "10.0.0.13 slots=1", "10.0.0.11 slots=1", "10.0.0.14 slots=1", "10.0.0.12 slots=1"]
    # bench's run on N nodes is `head -n N` of it: ranks follow the same order
    assert [n.name for n in c.rank_nodes(2)] == ["lab-master", "lab-worker-3"]
    assert [c.hosts_of(n) for n in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]


def test_topology_conf_is_a_switch_per_host_under_one():
    text = topology_conf(_cluster())
    assert text is not None
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == ["SwitchName=host1 Nodes=lab-master,lab-worker-3",
                     "SwitchName=host2 Nodes=lab-worker-1,lab-worker-4",
                     "SwitchName=host3 Nodes=lab-worker-2",
                     "SwitchName=cloud Switches=host[1-3]"]
    assert f"# host1: {H1}" in text
    one = topology_conf(_cluster({n: "here" for n in PLACED}, provider="local"))
    assert one is not None and "SwitchName=cloud Switches=host1\n" in one


def test_inventory_carries_the_topology_and_each_nodes_host(tmp_path):
    from deployer.pipeline import boot
    from deployer.state import ClusterState

    st = ClusterState(tmp_path, "lab")
    boot.ensure_host_keys(st, list(PLACED))
    inv = inventory.render(_cluster(), ClusterSpec(name="lab", nodes=5), st)["all"]
    assert inv["hosts"]["lab-worker-2"]["node_host"] == H3
    assert inv["vars"]["deployer_slurm_topology"] == topology_conf(_cluster())


def test_a_same_host_pair_among_cross_host_ones_names_no_false_slow_node():
    # Three nodes on one host (their pairs go through its bridge: 40 Gbit/s), one node on
    # each of two other hosts: every cross-host pair is the link's 10 Gbit/s. Held against
    # the median of all other pairs (25), lab-worker-3 and -4 would be "the slow node".
    hosts = {"lab-master": H1, "lab-worker-1": H1, "lab-worker-2": H1, "lab-worker-3": H2, "lab-worker-4": H3}
    c = _cluster(hosts)
    names = list(hosts)
    measured = [{"src": a, "dst": b, "gbit_s": 40.0 if hosts[a] == hosts[b] else 10.0}
                for i, a in enumerate(names) for b in names[i + 1:]]
    blind = [NodeReport(n) for n in names]
    cluster_checks.network_findings([dict(p) for p in measured], blind)
    assert [n.verdict for n in blind][-2:] == ["fail", "fail"], "the premise: without placement, a false slow node"

    nodes = [NodeReport(n) for n in names]
    [matrix] = cluster_checks.network_findings(measured, nodes, c.same_host)
    assert [n.verdict for n in nodes] == ["pass"] * 5
    assert matrix.status == "pass"
    assert "7 pair(s) across hosts" in matrix.detail and "3 pair(s) on one host" in matrix.detail
    assert matrix.value["same_host_median_gbit_s"] == 40.0 and matrix.value["median_gbit_s"] == 10.0
    assert sum(p["same_host"] for p in matrix.value["pairs"]) == 3


def test_a_slow_node_across_hosts_is_still_named():
    hosts = {"lab-master": H1, "lab-worker-1": H1, "lab-worker-2": H2, "lab-worker-3": H3}
    c = _cluster(hosts)
    names = list(hosts)
    measured = [{"src": a, "dst": b, "gbit_s": 40.0 if hosts[a] == hosts[b] else 1.0 if "lab-worker-3" in (a, b) else 10.0}
                for i, a in enumerate(names) for b in names[i + 1:]]
    nodes = [NodeReport(n) for n in names]
    cluster_checks.network_findings(measured, nodes, c.same_host)
    assert [n.verdict for n in nodes] == ["pass", "pass", "pass", "fail"]


def test_one_host_compares_its_pairs_among_themselves():
    c = _cluster({n: "here" for n in list(PLACED)[:3]}, provider="local")
    nodes = [NodeReport(n) for n in c.names]
    measured = [{"src": "lab-master", "dst": "lab-worker-1", "gbit_s": 16.0},
                {"src": "lab-master", "dst": "lab-worker-2", "gbit_s": 0.2},
                {"src": "lab-worker-1", "dst": "lab-worker-2", "gbit_s": 0.19}]
    cluster_checks.network_findings(measured, nodes, c.same_host)
    assert [n.verdict for n in nodes] == ["pass", "pass", "fail"]


def test_bench_report_says_how_many_hosts_each_run_spanned():
    run = {"img_per_sec": 10.0, "img_per_sec_per_rank": 10.0, "world_size": 1, "mode": "dp"}
    rep = bench_report.aggregate("r", [(1, run), (2, {**run, "world_size": 2})], hosts={1: 1, 2: 2})
    assert [r["hosts"] for r in rep["results"]] == [1, 2]
    from deployer.bench.schema import validate

    validate(rep)
    assert bench_report.hosts_line(rep) is not None and "2 node(s) on 2" in (bench_report.hosts_line(rep) or "")
    assert bench_report.hosts_line(bench_report.aggregate("r", [(1, run)])) is None


def test_spread_on_one_host_is_a_warning_with_its_cause():
    spec = ClusterSpec(name="lab", provider="openstack", nodes=3, openstack={"admin_cidr": "198.51.100.1/32"})
    packed = _cluster({n: H1 for n in list(PLACED)[:3]})
    said = placement.spread_warning(spec, packed)
    assert said is not None and "all 3 nodes run on one host" in said and "no other host had room" in said
    assert "made at once" in said and "\n" not in said
    assert placement.spread_warning(spec, _cluster({n: h for n, h in list(PLACED.items())[:3]})) is None
    pack = spec.model_copy(update={"openstack": spec.openstack.model_copy(update={"placement": "pack"})})
    assert placement.spread_warning(pack, packed) is None
    local = ClusterSpec(name="lab", nodes=3)
    assert placement.spread_warning(local, _cluster({n: "here" for n in list(PLACED)[:3]}, provider="local")) is None
    assert placement.describe(_cluster()) == "placement: 5 node(s) on 3 host(s) in zone nova (2+2+1)"


def test_status_groups_nodes_by_host():
    nodes = [{"name": n, "host": h} for n, h in PLACED.items()]
    assert {h: [n["name"] for n in ns] for h, ns in by_host(nodes).items()} == {
        H1: ["lab-master", "lab-worker-3"], H2: ["lab-worker-1", "lab-worker-4"], H3: ["lab-worker-2"]}


@pytest.mark.parametrize(("placement_", "hard", "policy"), [
    ("spread", False, "soft-anti-affinity"), ("pack", False, "soft-affinity"),
    ("spread", True, "anti-affinity"), ("pack", True, "affinity"), ("any", False, None)])
def test_the_spec_names_the_server_group_policy(placement_, hard, policy):
    spec = ClusterSpec(provider="openstack", openstack={"placement": placement_, "placement_hard": hard})
    assert spec.openstack.server_group_policy == policy
    want = needs(spec, 2, 2048, fresh=True)
    assert want.per_node.get("server_group_members") == (1 if policy else None)
    assert want.fixed.get("server_groups") == (1 if policy else None)


def test_hard_spread_on_too_few_hosts_is_refused_in_one_line():
    said = os_placement.hosts_problem(3, 4, "anti-affinity")
    assert said is not None and "\n" not in said and "--nodes 3" in said
    assert os_placement.hosts_problem(3, 3, "anti-affinity") is None
    assert os_placement.hosts_problem(None, 9, "anti-affinity") is None, "cannot count: Nova says it"
    assert os_placement.hosts_problem(1, 9, "soft-anti-affinity") is None


def test_a_changed_policy_on_a_cluster_with_a_group_is_refused(tmp_path):
    assert os_placement.policy_change_problem(tmp_path, "soft-affinity") is None, "a first run"
    (tmp_path / "terraform.tfstate").write_text(json.dumps({"resources": [
        {"mode": "managed", "type": "openstack_compute_instance_v2", "name": "node", "instances": [{}]}]}))
    assert os_placement.policy_change_problem(tmp_path, "soft-anti-affinity") is None, "made before server groups"
    (tmp_path / "terraform.tfstate").write_text(json.dumps({"resources": [
        {"mode": "managed", "type": "openstack_compute_servergroup_v2", "name": "cluster",
         "instances": [{"attributes": {"policies": ["soft-anti-affinity"]}}]}]}))
    assert os_placement.policy_change_problem(tmp_path, "soft-anti-affinity") is None
    said = os_placement.policy_change_problem(tmp_path, "soft-affinity")
    assert said is not None and "fixed at creation" in said
    assert os_placement.policy_change_problem(tmp_path, None) is not None


def test_a_cluster_larger_than_a_server_group_may_be_is_told_how_to_do_without_one():
    from deployer.providers.openstack.quota import Quota, _quota_message, fit

    spec = ClusterSpec(provider="openstack", nodes=16)
    want = needs(spec, 1, 512, fresh=False)
    result = fit({"server_group_members": Quota("server group members", 10, 0)}, want, 16)
    said = _quota_message(spec, "m1.small", [], 16, result)
    assert not result.ok and "server group members: need 16, 10 free of 10" in said
    assert "--nodes 10" in said and "placement: any" in said


# -- a soft spread evened out (lifecycle.spread_out): which node is made anew, and when to stop


def _where(*hosts: str | None) -> dict[str, str | None]:
    """lab-master, lab-worker-1, ... on `hosts`, in the nodes' order."""
    return {("lab-master" if i == 0 else f"lab-worker-{i}"): h for i, h in enumerate(hosts)}


def test_a_fresh_spread_on_one_host_moves_a_worker_the_last_made_first():
    where = _where(H1, H1, H1)
    assert not placement.spread_is_even(where, None)
    assert placement.crowded_node(where, set(where), "lab-master", None) == "lab-worker-2"
    # Then 2 + 1 (a host each): the worker left with the master goes.
    where = _where(H1, H1, H2)
    assert placement.crowded_node(where, set(where), "lab-master", None) == "lab-worker-1"
    assert placement.crowded_node(_where(H1, H2, H3), set(where), "lab-master", None) is None


def test_only_nodes_of_the_burst_that_share_a_host_move_and_the_master_last():
    where = _where(H1, H1, H2)
    assert placement.crowded_node(where, {"lab-master", "lab-worker-1"}, "lab-master", None) == "lab-worker-1"
    # The master shares its host with a node made before, or made anew alone: no race, no move.
    assert placement.crowded_node(where, {"lab-master"}, "lab-master", None) is None
    # A scale-out by one: the new node was weighed against all the others, wherever it went.
    assert placement.crowded_node(_where(H1, H2, H1), {"lab-worker-2"}, "lab-master", None) is None


def test_a_node_that_ran_before_this_run_is_never_moved():
    # Three made by an earlier run on one host, two added on two others: nothing of the
    # earlier run is touched, and the new ones have a host each.
    where = _where(H1, H1, H1, H2, H3)
    assert placement.crowded_node(where, {"lab-worker-3", "lab-worker-4"}, "lab-master", None) is None
    # The two added at once on one host: one of them moves, from the most loaded host it is on.
    where = _where(H1, H2, H3, H2, H2)
    assert placement.crowded_node(where, {"lab-worker-3", "lab-worker-4"}, "lab-master", None) == "lab-worker-4"
    # The two on two hosts (2 + 2 + 1): neither raced the other onto a host, nothing to try.
    assert placement.crowded_node(_where(H1, H2, H3, H1, H2), {"lab-worker-3", "lab-worker-4"}, "lab-master", None) is None


def test_five_on_three_hosts_is_even_at_2_2_1_when_the_hosts_are_counted():
    five = _where(H1, H2, H3, H1, H2)
    assert placement.spread_is_even(five, 3)
    assert placement.crowded_node(five, set(five), "lab-master", 3) is None
    # 3 + 1 + 1: one from the host of 3.
    assert placement.crowded_node(_where(H1, H2, H3, H1, H1), set(five), "lab-master", 3) == "lab-worker-4"
    # 3 + 2 on two of three hosts: one more host to use.
    assert placement.crowded_node(_where(H1, H2, H1, H2, H1), set(five), "lab-master", 3) == "lab-worker-4"
    # A user who may not count them: 2 + 2 + 1 might leave a fourth host empty, so one more
    # node is made anew (where it lands says whether there is one).
    assert not placement.spread_is_even(five, None)
    assert placement.crowded_node(five, set(five), "lab-master", None) == "lab-worker-4"


def test_a_host_not_known_moves_nothing():
    assert placement.crowded_node(_where(H1, H1, None), {"lab-worker-1", "lab-worker-2"}, "lab-master", None) is None


def test_a_move_counts_when_it_lands_where_fewer_are():
    where = _where(H1, H1, H1, H2, H3)  # 3 + 1 + 1
    assert placement.moved_closer(where, "lab-worker-2", "d4" * 28), "a host none of them was on"
    assert placement.moved_closer(where, "lab-worker-2", H2), "3 + 1 + 1 -> 2 + 2 + 1"
    assert not placement.moved_closer(where, "lab-worker-2", H1), "back where it was"
    two_two_one = _where(H1, H2, H3, H1, H2)
    assert not placement.moved_closer(two_two_one, "lab-worker-4", H3), "2 + 2 + 1 -> 2 + 1 + 2: no closer"
    assert not placement.moved_closer(where, "lab-worker-2", None)
    line = placement.move_line(where, "lab-worker-2", H2)
    assert line.startswith("placement: lab-worker-2 shared hostId a1a1a1a1a1a1… with 2 other node(s)")
    assert "now on a host with 1 of the others (hostId b2b2b2b2b2b2…)" in line and "\n" not in line
    stop = placement.move_line(two_two_one, "lab-worker-4", H3)
    assert "with 1 of the others: no host with fewer took it (" in stop and stop.endswith(
        "placement_hard: true insists), so the moves stop (hostId c3c3c3c3c3c3…)"), stop


class _Nova:
    """Where Nova puts a server made alone, weighed against the others: the host of fewest
    of them among those with room (ties: the first); `room`: servers a host still takes."""

    def __init__(self, hosts: list[str], room: int = 99):
        self.hosts, self.room = hosts, {h: room for h in hosts}

    def place(self, where: dict[str, str | None], node: str) -> str:
        others = [h for n, h in where.items() if n != node]
        fits = [h for h in self.hosts if self.room[h] > 0 or h == where[node]]
        return min(fits, key=lambda h: (others.count(h), self.hosts.index(h)))


def _spread_out(tmp_path, where, nova, *, before=(), hosts=None, placement_="spread", hard=False):
    from types import SimpleNamespace

    from deployer import lifecycle
    from deployer.providers.base import Machine, Observation
    from deployer.state import ClusterState

    spec = ClusterSpec(name="lab", provider="openstack", nodes=len(where),
                       openstack={"admin_cidr": "198.51.100.1/32", "placement": placement_, "placement_hard": hard})
    state = ClusterState(tmp_path, "lab")
    state.dir.mkdir(parents=True)
    current = dict(where)
    applied: list[list[str]] = []

    class Engine:
        def apply(self, on_event, replace=None):
            applied.append(replace)
            (address,) = replace
            node = address.split('"')[1]
            current[node] = nova.place(current, node)

        def output(self):
            return {"cluster": _cluster(dict.fromkeys(current)).to_output()}

    class Provider:
        def node_resource(self, node):
            return f'openstack_compute_instance_v2.node["{node}"]'

        def observe(self, state, env, names):
            return Observation(nodes={n: Machine("running", n, host=h, host_id=h, zone="nova") for n, h in current.items()})

    run = lifecycle.UpRun(spec, state, Provider(), SimpleNamespace(hosts=hosts, existing_nodes=list(before)), {}, [], None)
    out = lifecycle.spread_out(run, Engine(), _cluster(where), set(before))
    assert {n.name: n.host for n in out.nodes} == current
    if run.moved:  # the record follows each move
        assert {n["name"]: n["host"] for n in json.loads(state.cluster_file.read_text())["nodes"]} == current
    return current, run.moved, applied


def test_spread_out_makes_3_on_1_host_into_1_1_1_a_node_at_a_time(tmp_path):
    placed, moved, applied = _spread_out(tmp_path, _where(H1, H1, H1), _Nova([H1, H2, H3]))
    assert sorted(placed.values()) == [H1, H2, H3]
    assert moved == [{"node": "lab-worker-2", "from": H1, "to": H2}, {"node": "lab-worker-1", "from": H1, "to": H3}]
    assert applied == [['openstack_compute_instance_v2.node["lab-worker-2"]'],
                       ['openstack_compute_instance_v2.node["lab-worker-1"]']]


def test_spread_out_of_five_stops_at_2_2_1_after_one_move_that_found_no_other_host(tmp_path):
    # A member, who cannot count the hosts: 2 + 2 + 1 is tried once more, and the node lands
    # where it finds one of the others: no fourth host, so the moves stop.
    placed, moved, _ = _spread_out(tmp_path, _where(H1, H1, H1, H1, H2), _Nova([H1, H2, H3]))
    assert sorted(Counter(placed.values()).values()) == [1, 2, 2]
    assert [m["node"] for m in moved] == ["lab-worker-3", "lab-worker-2", "lab-worker-1"], moved
    assert moved[-1]["to"] in (H1, H2, H3), "the last found only a host with one of the others"
    # With the hosts counted (an admin), no move beyond 2 + 2 + 1.
    placed, moved, _ = _spread_out(tmp_path / "admin", _where(H1, H1, H1, H1, H2), _Nova([H1, H2, H3]), hosts=3)
    assert len(moved) == 2 and sorted(Counter(placed.values()).values()) == [1, 2, 2]


def test_spread_out_stops_at_once_when_no_other_host_has_room(tmp_path):
    placed, moved, applied = _spread_out(tmp_path, _where(H1, H1, H1), _Nova([H1, H2], room=0))
    assert placed == _where(H1, H1, H1) and len(applied) == 1
    assert moved == [{"node": "lab-worker-2", "from": H1, "to": H1}]


def test_spread_out_touches_nothing_that_ran_before_nor_other_policies(tmp_path):
    _, moved, applied = _spread_out(tmp_path / "a", _where(H1, H1, H1), _Nova([H1, H2, H3]),
                                    before=["lab-master", "lab-worker-1", "lab-worker-2"])
    assert moved == [] and applied == []
    for i, (policy, hard) in enumerate([("pack", False), ("any", False), ("spread", True)]):
        _, moved, applied = _spread_out(tmp_path / str(i), _where(H1, H1, H1), _Nova([H1, H2, H3]),
                                        placement_=policy, hard=hard)
        assert moved == [] and applied == []


def test_spread_out_of_a_scale_out_moves_one_of_the_two_that_raced_and_stops(tmp_path):
    # 1 + 1 + 1 grown by two made at once, both onto the master's host (3 + 1 + 1): the
    # last made goes to a host with one, and 2 + 2 + 1 tries nothing more (no two of the
    # burst share a host now).
    placed, moved, applied = _spread_out(tmp_path, _where(H1, H2, H3, H1, H1), _Nova([H1, H2, H3]),
                                         before=["lab-master", "lab-worker-1", "lab-worker-2"])
    assert sorted(Counter(placed.values()).values()) == [1, 2, 2] and len(applied) == 1
    assert moved == [{"node": "lab-worker-4", "from": H1, "to": H2}]


def test_bench_counts_the_hosts_of_the_nodes_a_run_ran_on_slurms_choice_included():
    from deployer.bench.sweep import spanned

    c = _cluster()  # master H1, worker-1 H2, worker-2 H3, worker-3 H1, worker-4 H2; the hostfile: H1's, H2's, H3
    assert [n.name for n in c.by_host[:2]] == ["lab-master", "lab-worker-3"] and c.hosts_of(2) == 1
    # Slurm gave the 2-node job worker-1 and worker-2: two hosts, not the hostfile's first two (one).
    assert spanned(c, 2, {"versions": {"hosts": ["lab-worker-1", "lab-worker-2"]}}) == 2
    assert spanned(c, 2, {"versions": {"hosts": ["lab-master", "lab-worker-3"]}}) == 1
    # A run that names no node of the record (or none at all): the hostfile's first n.
    assert spanned(c, 2, {"versions": {"hosts": ["elsewhere"]}}) == 1 and spanned(c, 3, {}) == 2
    assert spanned(_cluster({n: None for n in PLACED}), 2, {"versions": {"hosts": ["lab-worker-1"]}}) is None
