"""The master's teardown credential around a run that fails or is interrupted (issue 44,
item 2): the timer's play runs right after the base system, the old credential is revoked
only once the play has put the new one on the master, and a credential made but never
recorded (an interrupt in between) is found and revoked by the next `up` or `down`.

openstacksdk runs for real against tests/fixtures/openstack/fake_cloud.py, which records
every credential made and revoked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployer import records
from deployer.cluster import Cluster
from deployer.providers.openstack import provider as osp
from deployer.providers.openstack.provider import OpenStackProvider
from deployer.records import Lifetime, Origin
from deployer.spec import ClusterSpec
from deployer.state import ClusterState
from tests.unit.test_expiry import cloud  # noqa: F401 (the fake cloud with the cluster in it)

REPO = Path(__file__).resolve().parents[2]
CID = "0123456789ab"
ENV = {"OS_CLOUD": "testcloud"}


def test_the_timer_play_runs_right_after_the_base_system():
    # Before the driver, torch and Slurm: a play that fails there still leaves the timer.
    plays = yaml.safe_load((REPO / "ansible" / "site.yml").read_text())
    roles = [r if isinstance(r, str) else r["role"] for p in plays for r in p.get("roles", [])]
    assert roles[:2] == ["common", "teardown_timer"]


def _spec() -> ClusterSpec:
    return ClusterSpec.model_validate({"name": "demo", "provider": "openstack", "nodes": 3, "ttl": "8h", "openstack": {
        "cloud": "testcloud", "flavor": "m1.large", "image": "Ubuntu 22.04", "external_network": "public",
        "admin_cidr": "203.0.113.0/24", "auto_teardown": True}})


def _cluster(ids: list[str]) -> Cluster:
    names = ["demo-master", "demo-worker-1", "demo-worker-2"]
    return Cluster.parse({"name": "demo", "provider": "openstack", "ssh_user": "ubuntu", "shared_dir": "/shared",
                          "nodes": [{"name": n, "role": "master" if i == 0 else "worker", "private_ip": f"10.0.0.{i + 10}",
                                     "public_ip": None, "id": sid} for i, (n, sid) in enumerate(zip(names, ids, strict=False))]})


@pytest.fixture
def state(tmp_path) -> ClusterState:
    st = ClusterState(tmp_path / "root", "demo")
    st.create()
    st.write_origin(Origin(provider="openstack", terraform_env=ENV, cluster_id=CID))
    st.write_lifetime(Lifetime(ttl="8h", set_at="2026-11-27T00:00:00Z", expires_at="2026-11-27T08:00:00Z"))
    return st


def test_the_old_credential_is_revoked_only_once_the_master_has_the_new_one(cloud, state):  # noqa: F811
    p = OpenStackProvider()
    p.place(_spec(), state, _cluster(["srv-m", "srv-w1"]))
    first = osp.read_teardown_credential(state)
    # A third node: a new credential, for the three servers. The master still holds the
    # first one until the play has run: it must still work.
    line = p.place(_spec(), state, _cluster(["srv-m", "srv-w1", "srv-w2"]))
    second = osp.read_teardown_credential(state)
    assert second["id"] != first["id"] and second["server_ids"] == ["srv-m", "srv-w1", "srv-w2"]
    assert cloud.revoked == [] and [r["id"] for r in second["superseded"]] == [first["id"]]
    assert "secret" not in second["superseded"][0] and "revoked once the master has it" in line
    # The play put the new one on the master: now the old one goes.
    assert first["name"] in p.settle(_spec(), state)
    assert cloud.revoked == [first["id"]] and osp.read_teardown_credential(state)["superseded"] == []
    assert p.settle(_spec(), state) is None  # nothing left to revoke


def _interrupted_between_made_and_recorded(monkeypatch, state) -> None:
    write = records.write

    def interrupted(path, data, **kw):
        if Path(path) == osp.teardown_credential_file(state):
            raise KeyboardInterrupt
        write(path, data, **kw)

    monkeypatch.setattr(records, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        OpenStackProvider().place(_spec(), state, _cluster(["srv-m", "srv-w1", "srv-w2"]))
    monkeypatch.setattr(records, "write", write)


def test_a_credential_made_but_never_recorded_is_revoked_by_the_next_up(cloud, state, monkeypatch):  # noqa: F811
    _interrupted_between_made_and_recorded(monkeypatch, state)
    (orphan,) = cloud.made_credentials
    assert osp.read_teardown_credential(state) is None and cloud.revoked == []
    line = OpenStackProvider().place(_spec(), state, _cluster(["srv-m", "srv-w1", "srv-w2"]))
    assert cloud.revoked == [orphan["id"]]
    assert osp.read_teardown_credential(state)["id"] != orphan["id"] and line


def test_a_credential_made_but_never_recorded_is_revoked_by_down(cloud, state, monkeypatch):  # noqa: F811
    _interrupted_between_made_and_recorded(monkeypatch, state)
    (orphan,) = cloud.made_credentials
    OpenStackProvider().forget(state, ENV)
    assert cloud.revoked == [orphan["id"]] and not osp.pending_credential_file(state).exists()


def test_switched_off_the_credential_goes_once_the_timer_is_removed(cloud, state):  # noqa: F811
    p = OpenStackProvider()
    p.place(_spec(), state, _cluster(["srv-m", "srv-w1", "srv-w2"]))
    first = osp.read_teardown_credential(state)
    off = _spec().model_copy(update={"openstack": _spec().openstack.model_copy(update={"auto_teardown": False})})
    assert "revoked once the master's timer is removed" in p.place(off, state, _cluster(["srv-m", "srv-w1", "srv-w2"]))
    assert cloud.revoked == []  # the master's timer still runs with it until the play removes it
    assert p.inventory_vars(off, state, _cluster(["srv-m", "srv-w1", "srv-w2"]))["deployer_teardown_credential_id"] is None
    assert "timer is gone" in p.settle(off, state)
    assert cloud.revoked == [first["id"]] and osp.read_teardown_credential(state) is None
