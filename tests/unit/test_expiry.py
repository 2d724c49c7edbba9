"""Expiry on OpenStack (issue 44, item 1): a cluster is deleted only when every one of its
servers and its volume says it has expired, and an extension reaches all of them before
the state dir's record.

openstacksdk runs for real against tests/fixtures/openstack/fake_cloud.py, which records
every request: "nothing deleted" is "no DELETE was sent". The cluster: a master, two
workers and the shared volume, all carrying its id."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from deployer import gc, lifecycle, lifetime
from deployer.errors import NoLongerExpired, OperationFailed
from deployer.providers.openstack.observe import session
from deployer.providers.openstack.provider import OpenStackProvider
from deployer.providers.openstack.teardown import teardown
from deployer.records import Lifetime, Origin
from deployer.spec import ClusterSpec
from deployer.state import ClusterState
from tests import openstack_env
from tests.unit.test_openstack_preflight import PASSWORD, fake_cloud, write_clouds_yaml

CID = "0123456789ab"
ENV = {"OS_CLOUD": "testcloud"}
SERVERS = {"srv-m": "demo-master", "srv-w1": "demo-worker-1", "srv-w2": "demo-worker-2"}
VOLUME = "vol-1"
GROUP = "sg-1"
LONG_AGO = "2000-01-01T00:00:00Z"


def _in(days: float) -> str:
    return lifetime.iso(lifetime.now() + timedelta(days=days))


@pytest.fixture
def cloud(tmp_path, monkeypatch):
    """The fake cloud with the cluster in it; every resource expires in a week unless a
    test says otherwise (`expire(cloud, id, when)`)."""
    openstack_env.isolate(monkeypatch, tmp_path)
    with fake_cloud.FakeCloud(password=PASSWORD) as c:
        write_clouds_yaml(tmp_path / "clouds.yaml", c.auth_url)
        week = _in(7)
        meta = {"deployer_cluster": "demo", "deployer_cluster_id": CID, "deployer_expires_at": week}
        c.data["compute_servers_detail"]["servers"] = [
            {"id": sid, "name": name, "status": "ACTIVE", "metadata": dict(meta)} for sid, name in SERVERS.items()
        ]
        c.data["volume_volumes_detail"]["volumes"] = [
            {"id": VOLUME, "name": "demo-shared", "status": "available", "size": 10, "metadata": dict(meta)}
        ]
        # The cluster's server group (placement: spread), named with the id: no metadata to carry.
        c.data["compute_server_groups"]["server_groups"] = [
            {"id": GROUP, "name": f"demo-{CID}", "policy": "soft-anti-affinity", "members": list(SERVERS)}]
        c.allow_delete = True  # what the code under test may do, not what it should
        yield c


def expire(cloud, ident: str, when: str | None) -> None:
    for item in cloud.data["compute_servers_detail"]["servers"] + cloud.data["volume_volumes_detail"]["volumes"]:
        if item["id"] == ident:
            if when is None:
                item["metadata"].pop("deployer_expires_at", None)
            else:
                item["metadata"]["deployer_expires_at"] = when


def expiries(cloud) -> dict[str, str | None]:
    items = cloud.data["compute_servers_detail"]["servers"] + cloud.data["volume_volumes_detail"]["volumes"]
    return {i["id"]: i["metadata"].get("deployer_expires_at") for i in items}


def deletes(cloud) -> list[str]:
    return [path for method, path in cloud.requests if method == "DELETE"]


# ---- deletion: every server and the volume must say so ---------------------------------------


def test_one_server_saying_expired_deletes_nothing(cloud, tmp_path):
    # What was tried on the test cloud: one worker's expiry set to 2000-01-01, the other
    # servers and the volume a week ahead, then `deployer gc --cloud testcloud --yes` from
    # an empty directory. It deleted all three servers, the network and the volume.
    expire(cloud, "srv-w2", LONG_AGO)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert gc.collect_and_act(empty, cloud="testcloud", destroy=True, dry_run=False) == []
    assert deletes(cloud) == []


def test_the_volume_alone_saying_later_keeps_the_cluster(cloud, tmp_path):
    for sid in SERVERS:
        expire(cloud, sid, LONG_AGO)
    assert gc.find(tmp_path / "empty", "testcloud", lifetime.now()) == []
    assert deletes(cloud) == []


def test_a_server_with_no_expiry_keeps_the_cluster(cloud, tmp_path):
    for ident in [*SERVERS, VOLUME]:
        expire(cloud, ident, LONG_AGO)
    expire(cloud, "srv-w1", None)  # says nothing: not "expired"
    assert gc.find(tmp_path / "empty", "testcloud", lifetime.now()) == []


def test_when_every_server_and_the_volume_say_so_it_is_deleted_by_the_latest_expiry(cloud, tmp_path):
    latest = _in(-1)
    for ident, when in (("srv-m", LONG_AGO), ("srv-w1", LONG_AGO), ("srv-w2", latest), (VOLUME, LONG_AGO)):
        expire(cloud, ident, when)
    (found,) = gc.find(tmp_path / "empty", "testcloud", lifetime.now())
    assert found.cluster_id == CID and found.expires_at == latest
    results = gc.collect_and_act(tmp_path / "empty", cloud="testcloud", destroy=True, dry_run=False)
    assert [r["action"] for r in results] == ["destroyed"]
    assert {p.split("?")[0].rsplit("/", 1)[1] for p in deletes(cloud)} >= {*SERVERS, VOLUME, GROUP}


def test_delete_reads_every_expiry_again_and_keeps_a_cluster_extended_since(cloud):
    # Listed as expired, then one server (or the volume) was extended: nothing deleted.
    from deployer.providers.openstack.delete import delete_cluster

    for ident in [*SERVERS, VOLUME]:
        expire(cloud, ident, LONG_AGO)
    expire(cloud, VOLUME, _in(7))
    with pytest.raises(NoLongerExpired, match="demo-shared"):
        delete_cluster(ENV, "demo", CID, say=lambda _: None, expired_at=lifetime.now())
    assert deletes(cloud) == []


def test_the_masters_timer_deletes_only_when_every_server_says_so(cloud):
    expire(cloud, "srv-m", LONG_AGO)  # the master's own expiry is past; a worker's is not
    expire(cloud, "srv-w1", LONG_AGO)
    said: list[str] = []
    with session(ENV) as conn:
        assert teardown(conn, "demo", CID, "srv-m", ["srv-w1", "srv-w2"], lifetime.now(), say=said.append) == []
    assert deletes(cloud) == [] and "demo-worker-2" in said[-1]
    expire(cloud, "srv-w2", LONG_AGO)
    with session(ENV) as conn:
        gone = teardown(conn, "demo", CID, "srv-m", ["srv-w1", "srv-w2"], lifetime.now(), say=said.append)
    assert gone == ["demo-worker-1", "demo-worker-2", "demo-master"]


# ---- gc of a state dir: the cloud's word too ---------------------------------------------------


def _state(root: Path, expires_at: str) -> ClusterState:
    st = ClusterState(root, "demo")
    st.create()
    st.write_origin(Origin(provider="openstack", terraform_env=ENV, cluster_id=CID))
    st.write_lifetime(Lifetime(ttl="1h", set_at="2000-01-01T00:00:00Z", expires_at=expires_at))
    tf = st.terraform_dir / "openstack"
    tf.mkdir(parents=True)
    (tf / "terraform.tfstate").write_text('{"resources": [{"type": "openstack_compute_instance_v2"}]}')
    return st


def test_gc_of_a_state_dir_keeps_a_cluster_the_cloud_says_was_extended(cloud, tmp_path, monkeypatch):
    # This state dir's record says expired (an extension whose local write never came, or
    # one from another copy of the state dir); the servers and the volume say a week on.
    from deployer.tools import terraform

    st = _state(tmp_path / "root", LONG_AGO)
    destroyed = []

    class Engine:
        def destroy(self, on_event):
            destroyed.append(st.name)

    monkeypatch.setattr(terraform, "engine", lambda *a, **k: Engine())
    results = gc.collect_and_act(tmp_path / "root", cloud=None, destroy=True, dry_run=False)
    assert [r["action"] for r in results] == ["kept: extended"] and destroyed == []
    assert st.origin_file.exists() and deletes(cloud) == []


# ---- an extension: the cloud first, then the record here -----------------------------------------


class Applied(Exception):
    """Terraform reached: the test stops `up` here."""


def _up_until_apply(monkeypatch, st: ClusterState, ttl: str) -> dict:
    """`up --ttl <ttl>` of the recorded cluster until Terraform's apply; returns what the
    cloud and the state dir said at that moment."""
    seen: dict = {}

    class Engine:
        def write_vars(self, tfvars):
            seen["tfvars"] = tfvars

        def init(self):
            pass

        def apply(self, on_event, replace=None):
            seen["local"] = st.lifetime().expires_at
            raise Applied

    monkeypatch.setattr(OpenStackProvider, "preflight", lambda self, spec, state, replacing=(): None)
    monkeypatch.setattr(lifecycle, "_terraform", lambda *a: Engine())
    spec = ClusterSpec.model_validate({"name": "demo", "provider": "openstack", "nodes": 3, "ttl": ttl, "openstack": {
        "cloud": "testcloud", "flavor": "m1.large", "image": "Ubuntu 22.04", "external_network": "public",
        "admin_cidr": "203.0.113.0/24"}})
    with pytest.raises(Applied):
        lifecycle.up(spec, st, ttl_given=True, check_level=None)
    return seen


def test_an_extension_is_on_every_server_and_the_volume_before_the_record_here(cloud, tmp_path, monkeypatch):
    soon = _in(0.01)
    for ident in [*SERVERS, VOLUME]:
        expire(cloud, ident, soon)
    st = _state(tmp_path / "root", soon)
    written: list[tuple[str | None, dict]] = []
    write = ClusterState.write_lifetime

    def record(self, life):  # what the cloud said when the state dir's record was written
        written.append((life.expires_at if life else None, expiries(cloud)))
        write(self, life)

    monkeypatch.setattr(ClusterState, "write_lifetime", record)
    seen = _up_until_apply(monkeypatch, st, "2d")
    new = seen["local"]
    assert new != soon and lifetime.parse_iso(new) > lifetime.now() + timedelta(days=1)
    assert written and all(set(cloud_then.values()) == {new} for _, cloud_then in written)
    assert set(expiries(cloud).values()) == {new} and seen["tfvars"]["expires_at"] == new


def test_a_failed_write_to_the_cloud_says_so_and_leaves_the_record_here(cloud, tmp_path, monkeypatch):
    soon = _in(0.01)
    for ident in [*SERVERS, VOLUME]:
        expire(cloud, ident, soon)
    st = _state(tmp_path / "root", soon)
    cloud.fail = {"/compute/v2.1/servers/srv-w2/metadata": 500}
    with pytest.raises(OperationFailed) as e:
        _up_until_apply(monkeypatch, st, "2d")
    text = str(e.value)
    assert "demo-worker-2" in text and "not written" in text and soon in text
    assert st.lifetime().expires_at == soon  # the record here is unchanged: the cloud did not take it all
    # Whatever did take the new expiry keeps the cluster: no gc deletes it at the old one.
    assert lifetime.parse_iso(max(v for v in expiries(cloud).values() if v)) > lifetime.now() + timedelta(days=1)
