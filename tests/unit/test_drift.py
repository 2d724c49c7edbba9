"""What `up` configures and what `status` says, from the records and the observation."""

from deployer.pipeline import drift
from deployer.providers.base import Machine, Observation
from deployer.records import Configured

from ..clusters import typed

CLUSTER = typed({
    "name": "demo",
    "nodes": [
        {"name": "demo-master", "id": "m1"},
        {"name": "demo-worker-1", "id": "w1"},
        {"name": "demo-worker-2", "id": "w2"},
    ],
})
NAMES = ["demo-master", "demo-worker-1", "demo-worker-2"]


def record(**ids):
    nodes = {"demo-master": "m1", "demo-worker-1": "w1", "demo-worker-2": "w2"}
    nodes.update({k.replace("_", "-"): v for k, v in ids.items()})
    return Configured(fingerprint="F", nodes={k: v for k, v in nodes.items() if v is not None})


def test_nothing_changed_configures_nothing():
    plan = drift.configure_plan(CLUSTER, record(), "F")
    assert plan.why == {} and plan.limit() == []
    assert plan.describe() == "nothing changed since the last configuration"


def test_a_replaced_worker_alone():
    plan = drift.configure_plan(CLUSTER, record(demo_worker_2="old"), "F")
    assert plan.why == {"demo-worker-2": "replaced since the last configuration"}
    assert not plan.every_node and plan.limit() == ["demo-worker-2"]
    assert plan.describe() == "demo-worker-2 (replaced since the last configuration)"


def test_a_node_missing_from_the_record_is_new():
    plan = drift.configure_plan(CLUSTER, record(demo_worker_1=None), "F")
    assert plan.why == {"demo-worker-1": "new since the last configuration"}


def test_a_replaced_master_configures_every_node():
    plan = drift.configure_plan(CLUSTER, record(demo_master="old"), "F")
    assert plan.every_node and set(plan.why) == set(NAMES) and plan.limit() is None
    assert "master was replaced" in plan.describe()


def test_every_node_when_the_fingerprint_changed_or_on_request_or_first_time():
    assert drift.configure_plan(CLUSTER, record(), "G").every_node
    assert drift.configure_plan(CLUSTER, record(), "F", reconfigure=True).describe() == "all 3 node(s) (--reconfigure)"
    assert drift.configure_plan(CLUSTER, None, "F").describe() == "all 3 node(s) (first configuration)"


def test_record_round_trip():
    full = drift.configured_record("F", CLUSTER, run="r1")
    assert full == Configured(fingerprint="F", nodes={"demo-master": "m1", "demo-worker-1": "w1", "demo-worker-2": "w2"}, run="r1")
    assert drift.configure_plan(CLUSTER, full, "F").why == {}
    # Written before a run that configures worker-2: a failed run leaves it to configure.
    partial = drift.configured_record("F", CLUSTER, ["demo-master", "demo-worker-1"])
    assert drift.configure_plan(CLUSTER, partial, "F").limit() == ["demo-worker-2"]


def test_node_states():
    seen = Observation(nodes={
        "demo-master": Machine("running", "m1"),
        "demo-worker-1": Machine("stopped", "w1"),
        "demo-worker-2": Machine("running", "w2"),
    })
    states = drift.node_states(CLUSTER, seen, record(), {"demo-master": True, "demo-worker-2": False})
    assert states == {"demo-master": "ok", "demo-worker-1": "stopped", "demo-worker-2": "unreachable"}
    gone = Observation(
        nodes={"demo-master": Machine("running", "m1"), "demo-worker-1": Machine("missing"), "demo-worker-2": Machine("running", "w9")}
    )
    states = drift.node_states(CLUSTER, gone, record(demo_worker_2="old"), {"demo-master": True, "demo-worker-2": True})
    assert states == {"demo-master": "ok", "demo-worker-1": "missing", "demo-worker-2": "replaced (needs configure)"}


def test_node_states_before_any_configuration_say_so():
    """No record of a configuration (`up --no-setup`, or a first `up` whose Ansible
    failed): a running node is new, whether or not it answers; not `ok`."""
    seen = Observation(nodes={"demo-master": Machine("running", "m1"), "demo-worker-1": Machine("stopped", "w1"),
                              "demo-worker-2": Machine("running", "w2")})
    states = drift.node_states(CLUSTER, seen, None, {"demo-master": True, "demo-worker-2": False})
    assert states == {"demo-master": "new (needs configure)", "demo-worker-1": "stopped",
                      "demo-worker-2": "new (needs configure)"}


def test_remaining_lists_every_existing_thing():
    seen = Observation(nodes={"a": Machine("running"), "b": Machine("missing"), "c": Machine("stopped")}, extra=["d"], other=["bridge x"])
    assert seen.remaining() == ["node a", "node c", "node d", "bridge x"]


def test_a_replaced_worker_with_its_own_new_host_key_is_configured_alone():
    # rekey.py gave the new server a host key of its own, certified by the cluster's host CA,
    # which the other nodes trust already: nothing on them changes.
    plan = drift.configure_plan(CLUSTER, record(demo_worker_2="old"), "F")
    assert not plan.every_node and plan.limit() == ["demo-worker-2"]
    assert not hasattr(drift, "with_new_host_keys")


def test_the_fingerprint_follows_the_whole_inventory(tmp_path):
    # The inventory holds no node's own host key (the CA's, which stays): a changed address,
    # or anything else in it, configures every node.
    import yaml

    from deployer import lifecycle
    from deployer.spec import ClusterSpec
    from deployer.state import ClusterState

    st = ClusterState(tmp_path / "state", "demo")
    inv = {"all": {"hosts": {"demo-master": {"private_ip": "10.0.0.10"}}, "vars": {"deployer_host_ca": "ssh-ed25519 A"}}}
    path = tmp_path / "hosts.yml"

    def fingerprint(data):
        path.write_text(yaml.safe_dump(data))
        return lifecycle._fingerprint(path, ClusterSpec(), st)

    first = fingerprint(inv)
    assert fingerprint(inv) == first
    inv["all"]["vars"]["deployer_host_ca"] = "ssh-ed25519 B"
    assert fingerprint(inv) != first
    inv["all"]["vars"]["deployer_host_ca"] = "ssh-ed25519 A"
    inv["all"]["hosts"]["demo-master"]["private_ip"] = "10.0.0.11"
    assert fingerprint(inv) != first
