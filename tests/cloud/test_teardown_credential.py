"""The master's teardown credential against Keystone and Nova: made after the servers,
kept, renewed after `--ttl` and on scale, revoked; its access rules accepted by Nova for
this cluster's servers (behind a /compute prefix, as keystonemiddleware matches the
whole path) and refused for any other; the teardown script run with it; and clouds
whose clouds.yaml logs in with an application credential."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
import yaml

from deployer.cluster import Cluster
from deployer.errors import PreflightError
from deployer.lifetime import iso, now, parse_iso
from deployer.providers.openstack import preflight as pf
from deployer.providers.openstack.provider import OpenStackProvider, read_teardown_credential
from deployer.providers.openstack.teardown import main as teardown_main
from deployer.records import Lifetime
from deployer.spec import ClusterSpec
from deployer.state import ClusterState

from ..clusters import typed
from . import module_resources
from .test_preflight import make_spec


def at(hours: float) -> str:
    """An expiry `hours` from now (Keystone refuses a credential that expired already)."""
    return iso(now() + timedelta(hours=hours))


def _spec(cluster: str, auto: bool = True) -> ClusterSpec:
    return make_spec(cluster, nodes=2, ttl="8h", auto_teardown=auto)


def _state(tmp_path, cluster: str, expires: str) -> ClusterState:
    st = ClusterState(tmp_path / "state", cluster)
    st.create()
    st.write_lifetime(Lifetime(**{"ttl": "8h", "set_at": at(0), "expires_at": expires}))
    return st


def _cluster(made) -> Cluster:
    """The `cluster` output's nodes, as the provider reads them after apply."""
    return typed({"nodes": [{"name": n, "id": s.id} for n, s in made.servers.items()]})


def _creds(conn) -> dict[str, object]:
    return {c.id: c for c in conn.identity.application_credentials(user=conn.current_user_id)}


def _clouds_with_credential(os_env, test_cloud, record: dict) -> str:
    clouds = yaml.safe_load(os_env.read_text())
    clouds["clouds"]["teardown"] = {
        "auth_type": "v3applicationcredential", "region_name": "RegionOne", "identity_api_version": 3,
        "auth": {"auth_url": test_cloud.auth_url, "application_credential_id": record["id"],
                 "application_credential_secret": record["secret"]}}
    os_env.write_text(yaml.safe_dump(clouds))
    return "teardown"


def test_made_kept_renewed_and_revoked(os_env, own_project, tmp_path, cluster_name):
    provider = OpenStackProvider()
    made = module_resources.make_cluster(own_project, cluster_name, 2, volume=False, floating_ip=False)
    cluster = _cluster(made)
    expires = at(8)
    st = _state(tmp_path, cluster_name, expires)
    provider.prepare(_spec(cluster_name), st)
    assert read_teardown_credential(st) is None, "made after the servers, not before"
    provider.place(_spec(cluster_name), st, cluster)
    first = read_teardown_credential(st)
    cred = _creds(own_project)[first["id"]]
    assert cred.unrestricted is False and first["expires_at"] == iso(parse_iso(expires) + timedelta(days=1))
    rules = {(r["method"], r["path"]) for r in cred.access_rules}
    for node in cluster.nodes:  # each server by its id, behind the cloud's /compute prefix
        assert {("GET", f"/compute/v2.1/servers/{node.id}"), ("DELETE", f"/compute/v2.1/servers/{node.id}")} <= rules
    assert not any(p.endswith(("/servers/detail", "/servers/*", "/servers")) for _, p in rules), "no listing, no wildcard"

    assert provider.place(_spec(cluster_name), st, cluster) is None  # nothing changed: the same credential
    assert read_teardown_credential(st)["id"] == first["id"] and len(_creds(own_project)) == 1

    # `up --ttl` past the credential's life: a new one, and the old one revoked once the
    # play has put the new one on the master (settle). The new one used to take the old
    # one's name, and Keystone answered 409.
    st.write_lifetime(Lifetime(**{"ttl": "3d", "set_at": at(0), "expires_at": at(72)}))
    provider.place(_spec(cluster_name), st, cluster)
    second = read_teardown_credential(st)
    assert second["id"] != first["id"] and set(_creds(own_project)) == {first["id"], second["id"]}
    provider.settle(_spec(cluster_name), st)
    assert set(_creds(own_project)) == {second["id"]}

    # Scale: another set of servers, another credential.
    cluster = dataclasses.replace(cluster, nodes=cluster.nodes[:1])
    provider.place(_spec(cluster_name), st, cluster)
    provider.settle(_spec(cluster_name), st)
    third = read_teardown_credential(st)
    assert third["server_ids"] == [cluster.master.id] and set(_creds(own_project)) == {third["id"]}

    provider.place(_spec(cluster_name, auto=False), st, cluster)  # switched off: revoked once the timer is gone, forgotten
    provider.settle(_spec(cluster_name, auto=False), st)
    assert _creds(own_project) == {} and read_teardown_credential(st) is None
    # ...and no access rule left behind in Keystone (it keeps a user's rules otherwise).
    assert list(own_project.identity.access_rules(own_project.current_user_id)) == []


def test_nova_accepts_the_credential_and_the_timer_deletes_only_its_cluster(os_env, own_project, tmp_path, cluster_name,
                                                                             test_cloud, capsys):
    # Another user's cluster of the same name in the project, expired too: its id differs.
    ours = theirs = cluster_name
    made = module_resources.make_cluster(own_project, ours, 3, volume=False, floating_ip=False, expires_at=at(-1))
    other = module_resources.make_cluster(own_project, theirs, 1, volume=False, floating_ip=False, cidr="192.168.78.0/24",
                                          expires_at=at(-1))
    st = _state(tmp_path, ours, at(-1))
    OpenStackProvider().place(_spec(ours), st, _cluster(made))
    entry = _clouds_with_credential(os_env, test_cloud, read_teardown_credential(st))
    master = made.servers[f"{ours}-master"].id
    workers = ",".join(s.id for n, s in made.servers.items() if n != f"{ours}-master")
    args = ["--cloud", entry, "--cluster", ours, "--cluster-id", made.id, "--server-id", master, "--workers", workers]

    # --check: authenticates and reads every server through Nova's access-rule check.
    assert teardown_main([*args, "--check"]) == 0
    assert f"credential works: 3 server(s) of {ours}" in capsys.readouterr().out

    assert teardown_main(args) == 0
    for server in made.servers.values():
        own_project.compute.wait_for_delete(server, wait=120)
    assert {s.name for s in own_project.compute.servers()} == {f"{theirs}-master"}, "another cluster's servers stay"
    assert other.servers[f"{theirs}-master"].id in {s.id for s in own_project.compute.servers()}


def test_the_credential_reaches_only_its_own_servers(os_env, own_project, tmp_path, cluster_name, test_cloud):
    import openstack

    made = module_resources.make_cluster(own_project, cluster_name, 1, volume=False, floating_ip=False)
    other = module_resources.make_cluster(own_project, f"{cluster_name}b", 1, volume=False, floating_ip=False,
                                          cidr="192.168.78.0/24")
    st = _state(tmp_path, cluster_name, at(8))
    OpenStackProvider().place(_spec(cluster_name), st, _cluster(made))
    conn = openstack.connect(cloud=_clouds_with_credential(os_env, test_cloud, read_teardown_credential(st)))
    assert conn.compute.get_server(made.servers[f"{cluster_name}-master"].id).name == f"{cluster_name}-master"
    refused = [
        lambda: conn.compute.get_server(other.servers[f"{cluster_name}b-master"].id),  # another cluster's server
        lambda: conn.compute.delete_server(other.servers[f"{cluster_name}b-master"].id),
        lambda: list(conn.compute.servers()),  # listing: not named
        lambda: list(conn.compute.keypairs()),
        lambda: list(conn.network.networks()),  # another service
    ]
    for call in refused:
        with pytest.raises(openstack.exceptions.HttpException) as e:
            call()
        assert e.value.status_code == 401
    assert own_project.compute.get_server(other.servers[f"{cluster_name}b-master"].id).status == "ACTIVE"


# ---- clouds.yaml that logs in with an application credential -------------------------------------


def _login_credential(os_env, own_project, unrestricted: bool) -> None:
    cred = own_project.identity.create_application_credential(user=own_project.current_user_id, name="login",
                                                              unrestricted=unrestricted)
    clouds = yaml.safe_load(os_env.read_text())
    auth = clouds["clouds"]["testcloud"]["auth"]
    clouds["clouds"]["testcloud"] = {
        "auth_type": "v3applicationcredential", "region_name": "RegionOne", "identity_api_version": 3,
        "auth": {"auth_url": auth["auth_url"], "application_credential_id": cred.id, "application_credential_secret": cred.secret}}
    os_env.write_text(yaml.safe_dump(clouds))


def test_an_application_credential_login_works_for_everything_but_auto_teardown(os_env, own_project, state):
    _login_credential(os_env, own_project, unrestricted=False)
    pf.check(make_spec())  # preflight as such: fine
    with pytest.raises(PreflightError) as e:  # Keystone would answer 403 when `up` makes the teardown credential
        pf.check(make_spec(ttl="8h", auto_teardown=True))
    msg = str(e.value)
    assert "logs in with application credential 'login'" in msg and "auto_teardown: false" in msg and "\n" not in msg


def test_an_unrestricted_application_credential_may_make_the_teardown_credential(os_env, own_project, tmp_path, cluster_name):
    _login_credential(os_env, own_project, unrestricted=True)
    pf.check(make_spec(cluster_name, ttl="8h", auto_teardown=True))
    st = _state(tmp_path, cluster_name, at(8))
    OpenStackProvider().place(_spec(cluster_name), st, typed({"nodes": [{"name": f"{cluster_name}-master", "id": "0" * 32}]}))
    assert read_teardown_credential(st)["name"].startswith(f"deployer-{cluster_name}-teardown-")


def test_before_the_expiry_or_for_another_server_the_timer_deletes_nothing(os_env, own_project, cluster_name):
    from deployer.providers.openstack.observe import session
    from deployer.providers.openstack.teardown import teardown

    made = module_resources.make_cluster(own_project, cluster_name, 2, volume=False, floating_ip=False, expires_at=at(2))
    master, worker = (made.servers[f"{cluster_name}-{n}"].id for n in ("master", "worker-1"))
    later = now() + timedelta(hours=3)
    with session({"OS_CLOUD": "testcloud"}) as conn:
        assert teardown(conn, cluster_name, made.id, master, [worker], now(), say=lambda _: None) == []
        assert teardown(conn, cluster_name, "0badc0ffee00", master, [worker], later, say=lambda _: None) == [], \
            "a same-named cluster's id"
        # Past the expiry: the workers first, then the master (the master's own call goes last).
        assert teardown(conn, cluster_name, made.id, master, [worker], later, say=lambda _: None) == [
            f"{cluster_name}-worker-1", f"{cluster_name}-master"]


def test_down_revokes_the_credential(os_env, own_project, tmp_path, cluster_name):
    st = _state(tmp_path, cluster_name, at(8))
    OpenStackProvider().place(_spec(cluster_name), st, typed({"nodes": [{"name": f"{cluster_name}-master", "id": "0" * 32}]}))
    assert len(_creds(own_project)) == 1
    OpenStackProvider().forget(st, {"OS_CLOUD": "testcloud"})
    assert _creds(own_project) == {}
