"""observe, repair, `gc --cloud` and delete-by-metadata against the test cloud, on
resources made the way terraform/openstack makes them (module_resources.py): real
servers in every Nova state, real Neutron tags, a real Cinder volume attached."""

from __future__ import annotations

import pytest

from deployer import gc
from deployer.errors import OperationFailed
from deployer.providers.base import Machine, Observation
from deployer.providers.openstack.delete import delete_cluster
from deployer.providers.openstack.observe import observe
from deployer.providers.openstack.provider import OpenStackProvider
from deployer.providers.openstack.teardown import EXPIRY_KEY

from . import module_resources
from .test_preflight import make_spec

ENV = {"OS_CLOUD": "testcloud"}


@pytest.fixture
def member(own_project):
    return own_project


def test_observe_sees_each_node_and_what_carries_the_tag(os_env, member, cluster_name):
    c = cluster_name
    made = module_resources.make_cluster(member, c, 4)
    member.compute.stop_server(made.servers[f"{c}-worker-1"])
    member.compute.wait_for_server(made.servers[f"{c}-worker-1"], status="SHUTOFF", wait=60)
    member.compute.delete_server(made.servers[f"{c}-worker-2"])
    member.compute.wait_for_delete(made.servers[f"{c}-worker-2"], wait=60)
    seen = observe(c, made.id, ENV, [f"{c}-master", f"{c}-worker-1", f"{c}-worker-2"])
    assert {n: m.state for n, m in seen.nodes.items()} == {
        f"{c}-master": "running", f"{c}-worker-1": "stopped", f"{c}-worker-2": "missing"}
    assert seen.nodes[f"{c}-master"].id == made.servers[f"{c}-master"].id
    assert seen.extra == [f"{c}-worker-3"]
    other = set(seen.other)
    for thing in (f"network {c}-net", f"router {c}-router", f"security group {c}-cluster", f"security group {c}-master",
                  f"volume {c}-shared", f"key pair {c}-key-{made.id}", f"floating IP {made.floating_ip.floating_ip_address}",
                  f"port {c}-master-port"):
        assert thing in other, (thing, sorted(other))


def test_a_look_alike_is_not_ours(os_env, member, cluster_name):
    """Named like our nodes, without our metadata: not observed, not deleted."""
    c = cluster_name
    made = module_resources.make_cluster(member, f"{c}", 1, volume=False, floating_ip=False)
    server = next(iter(member.compute.servers(name=f"^{c}-master$")))
    member.compute.set_server_metadata(server, deployer_cluster="someone-else")
    seen = observe(c, made.id, ENV, [f"{c}-master"])
    assert seen.nodes[f"{c}-master"].state == "missing"


def test_a_same_named_cluster_of_someone_else_is_not_ours(os_env, member, tmp_path, cluster_name):
    """Two deployer clusters of one name in one project (two users, two state dirs): each
    observes, expires and deletes only what carries its id; the preflight of a third
    refuses the name; `gc` lists them apart."""
    from deployer.errors import PreflightError
    from deployer.providers.openstack.preflight import check

    c = cluster_name
    ours = module_resources.make_cluster(member, c, 2, expires_at="2026-11-20T08:00:00Z")
    theirs = module_resources.make_cluster(member, c, 2, cidr="192.168.78.0/24", expires_at="2099-01-01T00:00:00Z")
    names = [f"{c}-master", f"{c}-worker-1"]
    seen = observe(c, ours.id, ENV, names)
    assert {n: m.id for n, m in seen.nodes.items()} == {n: ours.servers[n].id for n in names}
    assert f"key pair {c}-key-{ours.id}" in seen.other and f"key pair {c}-key-{theirs.id}" not in seen.other
    assert len([o for o in seen.other if o.startswith("network ")]) == 1

    with pytest.raises(PreflightError) as refused:  # a new state dir (no id yet) asking for the name
        check(make_spec(c, nodes=2))
    msg = str(refused.value)
    assert f"cluster name {c!r} is in use in this OpenStack project by another deployer cluster" in msg, msg
    assert "pick another --name" in msg and "\n" not in msg
    with pytest.raises(PreflightError, match=f"id {theirs.id}"):  # our own state dir: only the other is foreign
        check(make_spec(c, nodes=2), cluster_exists=True, cluster_id=ours.id)

    found = gc.find(tmp_path / "no-state", "testcloud", gc.now())
    assert [(e.name, e.cluster_id) for e in found if e.name == c] == [(c, ours.id)], "only the expired one"
    results = gc.collect_and_act(tmp_path / "no-state", cloud="testcloud", destroy=True, dry_run=False)
    assert [(r["name"], r["cluster_id"], r["action"]) for r in results if r["name"] == c] == [(c, ours.id, "destroyed")]
    assert observe(c, ours.id, ENV, names).remaining() == []
    left = observe(c, theirs.id, ENV, names)
    assert {n: m.id for n, m in left.nodes.items()} == {n: theirs.servers[n].id for n in names}, "theirs untouched"
    for thing in (f"volume {c}-shared", f"key pair {c}-key-{theirs.id}", f"network {c}-net", f"router {c}-router"):
        assert thing in left.other, (thing, left.other)


# Nova's action for each not-running status, and the action that put it there.
STATES = {"SHUTOFF": "stop_server", "SUSPENDED": "suspend_server", "PAUSED": "pause_server", "SHELVED_OFFLOADED": "shelve_server"}


def test_repair_brings_back_a_server_from_every_stopped_state(os_env, member, state, cluster_name):
    """Nova starts only a SHUTOFF server (409 otherwise): a suspended one is resumed, a
    paused one unpaused, a shelved one unshelved."""
    c = cluster_name
    made = module_resources.make_cluster(member, c, 1 + len(STATES), volume=False, floating_ip=False)
    workers = {status: made.servers[f"{c}-worker-{i}"] for i, status in enumerate(STATES, 1)}
    for status, server in workers.items():
        getattr(member.compute, STATES[status])(server)
    for status, server in workers.items():
        member.compute.wait_for_server(server, status=status, wait=120)
    names = list(made.servers)
    seen = observe(c, made.id, ENV, names)
    assert sorted(n for n, m in seen.nodes.items() if m.state == "stopped") == sorted(s.name for s in workers.values())
    fix = OpenStackProvider().repair(make_spec(c, nodes=len(names)), state, {}, seen)
    assert sorted(fix.started) == sorted(s.name for s in workers.values())
    for server in workers.values():
        assert member.compute.wait_for_server(server, status="ACTIVE", wait=180).status == "ACTIVE"


def test_repair_of_nothing_stopped_calls_nothing(os_env, state, cluster_name):
    seen = Observation(nodes={f"{cluster_name}-master": Machine("running", "x")})
    assert OpenStackProvider().repair(make_spec(cluster_name, nodes=1), state, {}, seen).started == []


def test_gc_deletes_an_expired_cloud_only_cluster_and_nothing_else(os_env, member, tmp_path, cluster_name):
    old, keep, fresh = f"{cluster_name}o", f"{cluster_name}k", f"{cluster_name}f"
    module_resources.make_cluster(member, old, 2, expires_at="2026-11-20T08:00:00Z", cidr="192.168.77.0/24")
    module_resources.make_cluster(member, keep, 1, volume=False, floating_ip=False, cidr="192.168.78.0/24")  # no expiry
    module_resources.make_cluster(member, fresh, 1, volume=False, floating_ip=False, expires_at="2099-01-01T00:00:00Z",
                                  cidr="192.168.79.0/24")
    lookalike = member.network.create_network(name=f"{old}-net")  # someone's, untagged
    found = gc.find(tmp_path / "no-state", "testcloud", gc.parse_iso("2026-11-23T12:00:00Z"))
    assert [(e.name, sorted(e.servers)) for e in found] == [(old, [f"{old}-master", f"{old}-worker-1"])]
    for dry in (False, True):  # listing and --dry-run change nothing
        results = gc.collect_and_act(tmp_path / "no-state", cloud="testcloud", destroy=False, dry_run=dry)
        assert [r["action"] for r in results] == ["would destroy" if dry else "listed"]
    assert len(module_resources.leftovers(member, old)) > 5
    results = gc.collect_and_act(tmp_path / "no-state", cloud="testcloud", destroy=True, dry_run=False)
    assert [(r["name"], r["action"]) for r in results] == [(old, "destroyed")]
    assert module_resources.leftovers(member, old) == [f"network {old}-net"]  # the look-alike only
    assert member.network.get_network(lookalike.id)
    assert module_resources.leftovers(member, keep) and module_resources.leftovers(member, fresh)


def test_gc_keeps_a_cloud_only_cluster_extended_after_it_was_listed(os_env, member, tmp_path, cluster_name, monkeypatch):
    # gc lists, then deletes; an `up --ttl 8h` elsewhere rewrote the servers' expiry in
    # between. The expiry is read again right before deleting: the cluster stays.
    module_resources.make_cluster(member, cluster_name, 1, volume=False, floating_ip=False,
                                  expires_at="2026-11-20T08:00:00Z", cidr="192.168.80.0/24")
    listed = gc.find(tmp_path / "no-state", "testcloud", gc.now())
    assert [e.name for e in listed] == [cluster_name]
    for server in member.compute.servers(name=f"^{cluster_name}-"):
        member.compute.set_server_metadata(server, **{EXPIRY_KEY: "2099-01-01T00:00:00Z"})
    monkeypatch.setattr(gc, "find", lambda root, cloud, at: listed)  # the listing it acts on, made before
    try:
        results = gc.collect_and_act(tmp_path / "no-state", cloud="testcloud", destroy=True, dry_run=False)
        assert [(r["name"], r["action"]) for r in results] == [(cluster_name, "kept: extended")]
        assert f"server {cluster_name}-master" in module_resources.leftovers(member, cluster_name)
    finally:
        module_resources.delete_all(member, cluster_name)


def test_delete_by_metadata_refuses_a_name_no_server_vouches_for(os_env, member, cluster_name):
    member.network.create_network(name=f"{cluster_name}-net")
    with pytest.raises(OperationFailed, match=f"nothing proves '{cluster_name}' \\(0badc0ffee00\\) is a deployer cluster"):
        delete_cluster(ENV, cluster_name, "0badc0ffee00", say=lambda _: None)
    assert module_resources.leftovers(member, cluster_name) == [f"network {cluster_name}-net"]


def test_servers_that_carry_no_cluster_id_are_no_state_dirs(os_env, member, tmp_path, cluster_name):
    """Servers named as a cluster's nodes with deployer's metadata but no cluster id (made
    by hand, or by a tool that copied the metadata) belong to no state dir: a new state dir
    asking for the name is refused, naming them; a same-named cluster with an id is named too."""
    from deployer.errors import PreflightError
    from deployer.providers.openstack.observe import NO_ID
    from deployer.providers.openstack.preflight import check

    c = cluster_name
    module_resources.make_cluster(member, c, 2, cluster_id=NO_ID)
    newer = module_resources.make_cluster(member, c, 1, volume=False, floating_ip=False, cidr="192.168.78.0/24")
    with pytest.raises(PreflightError, match="is in use in this OpenStack project by another deployer cluster") as refused:
        check(make_spec(c, nodes=2))
    said = str(refused.value)  # the two clusters in the order the servers are listed
    assert "id unknown: " in said and f"server {c}-worker-1" in said and f"id {newer.id}: " in said


def test_observe_of_a_cluster_with_nothing_left(os_env, cluster_name):
    assert observe(cluster_name, "0badc0ffee00", ENV, [f"{cluster_name}-master"]).remaining() == []
