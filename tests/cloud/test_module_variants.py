"""terraform/openstack applied for real, its variants and its end (issue 43): an existing
network and floating IP, nodes booted from volumes, Grafana exposed, in one apply; and a
cluster with a lifetime, deleted by the master's teardown credential (the shared volume
attached to the master) and then by `deployer gc --yes` from its state dir.

As in test_module_apply.py: the deployer's own verbs, the real provider from `make
provider`'s mirror, what was made read back from the cloud's own answers.
"""

from __future__ import annotations

import json
from typing import Any

import openstack
import pytest
import yaml

from deployer.providers.openstack.provider import read_teardown_credential
from deployer.providers.openstack.teardown import main as teardown_main
from deployer.records import Lifetime
from deployer.state import ClusterState

from .test_module_apply import _needs_the_built_provider, cluster_id, deployer, nothing_left, servers, state_dir, write_spec
from .test_teardown_credential import _clouds_with_credential

pytestmark = pytest.mark.cloud
__all__ = ["_needs_the_built_provider", "deployer"]  # fixtures, shared with test_module_apply

LAB_CIDR = "10.30.0.0/24"
VIEWERS = "198.51.100.0/24"


def _lab_network(conn: Any) -> tuple[Any, Any, Any]:
    """What a project already has: its own network, subnet and router to the external one."""
    ext = conn.network.find_network("public", ignore_missing=False)
    net = conn.network.create_network(name="lab-net")
    subnet = conn.network.create_subnet(network_id=net.id, name="lab-subnet", cidr=LAB_CIDR, ip_version=4)
    router = conn.network.create_router(name="lab-router", external_gateway_info={"network_id": ext.id})
    conn.network.add_interface_to_router(router, subnet_id=subnet.id)
    return net, subnet, router


def test_an_existing_network_and_floating_ip_volume_boot_and_grafana_exposed(own_project, deployer, tmp_path, cluster_name):
    """Nothing of the network is made (no network, subnet or router of the cluster's), the
    ports are on the project's network, the master has the project's floating IP, every node
    boots from a volume made from the image, Grafana's port is open to the named viewers
    only; `down` deletes what it made and leaves the network and the floating IP."""
    conn, c = own_project, cluster_name
    net, subnet, router = _lab_network(conn)
    ext = conn.network.find_network("public", ignore_missing=False)
    fip = conn.network.create_ip(floating_network_id=ext.id)
    write_spec(tmp_path / "cluster.yaml", c, nodes=2, network="lab-net", floating_ip=fip.floating_ip_address,
               root_volume_size=1)
    spec = yaml.safe_load((tmp_path / "cluster.yaml").read_text())
    spec["monitoring"] = {"enabled": True, "expose": True, "allowed_cidrs": [VIEWERS]}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))

    deployer("up", "--no-setup", label="up variants")
    cid = cluster_id(tmp_path, c)
    tag = f"deployer-id-{cid}"
    assert [x.name for kind in (conn.network.networks, conn.network.subnets, conn.network.routers)
            for x in kind(tags=tag)] == [], "an existing network: nothing of it is made"
    found = servers(conn, c)
    assert sorted(found) == [f"{c}-master", f"{c}-worker-1"]
    for s in found.values():
        (port,) = list(conn.network.ports(device_id=s.id))
        assert port.network_id == net.id and port.fixed_ips[0]["subnet_id"] == subnet.id
        # Booted from a volume made from the image (no image on the server itself).
        assert not s.image or not s.image.get("id"), (s.name, s.image)
        attached = [conn.block_storage.get_volume(a["id"]) for a in s.attached_volumes]
        roots = [v for v in attached
                 if v.is_bootable in (True, "true") and v.size == 1 and (v.metadata or {}).get("deployer_cluster_id") is None]
        assert roots, (s.name, [(v.name, v.is_bootable, v.size) for v in attached])
    master = found[f"{c}-master"]
    (master_port,) = list(conn.network.ports(device_id=master.id))
    assert conn.network.get_ip(fip.id).port_id == master_port.id
    assert [x for x in conn.network.ips(tags=tag)] == [], "the project's floating IP is used, none allocated"
    groups = {g.name: g for g in conn.network.security_groups(tags=tag)}
    rules = [(r.protocol, r.port_range_min, r.remote_ip_prefix) for r in
             conn.network.security_group_rules(security_group_id=groups[f"{c}-master"].id) if r.direction == "ingress"]
    assert ("tcp", 3000, VIEWERS) in rules and all(r[0] != "tcp" or r[1] in (22, 3000) for r in rules), rules
    out = json.loads((state_dir(tmp_path, c) / "cluster.json").read_text())
    assert out["cluster_cidr"] == LAB_CIDR and out["nodes"][0]["public_ip"] == fip.floating_ip_address

    roots = [a["id"] for s in found.values() for a in s.attached_volumes]
    deployer("down", "--yes", label="down variants")
    nothing_left(conn, tmp_path, c, cid)
    for volume_id in roots:  # shared volume and root volumes alike
        with pytest.raises(openstack.exceptions.NotFoundException):
            conn.block_storage.get_volume(volume_id)
    # What was the project's stays, the floating IP free again.
    assert conn.network.get_network(net.id) and conn.network.get_router(router.id)
    assert conn.network.get_ip(fip.id).port_id is None


def test_the_masters_credential_deletes_the_servers_then_gc_the_rest(own_project, deployer, tmp_path, cluster_name, os_env,
                                                                    test_cloud):
    """A cluster with a lifetime (`--ttl`) made by the module: once every server and the
    volume say it expired, the teardown script run with the credential `up` left for the
    master deletes the workers, then the master with the shared volume attached (Nova
    detaches it; the volume stays); `deployer gc --yes` from the state dir then destroys
    the rest through Terraform, and nothing of the cluster is left."""
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, nodes=2, auto_teardown=True)
    deployer("up", "--no-setup", "--ttl", "2h")
    cid = cluster_id(tmp_path, c)
    st = ClusterState(tmp_path / ".deployer", c)
    record = read_teardown_credential(st)
    assert record is not None, "up leaves the master its teardown credential"
    found = servers(conn, c)
    (volume,) = [v for v in conn.block_storage.volumes() if (v.metadata or {}).get("deployer_cluster_id") == cid]
    assert volume.status == "in-use"

    # Two hours on, as both records then say: every server and the volume, and the state dir's.
    past = "2000-01-01T00:00:00Z"
    for s in found.values():
        conn.compute.set_server_metadata(s, deployer_expires_at=past)
    conn.block_storage.set_volume_metadata(volume, deployer_expires_at=past)
    life = st.lifetime()
    assert life is not None
    st.write_lifetime(Lifetime(ttl=life.ttl, set_at=life.set_at, expires_at=past))

    entry = _clouds_with_credential(os_env, test_cloud, record)
    master = found[f"{c}-master"]
    workers = ",".join(s.id for n, s in found.items() if n != f"{c}-master")
    assert teardown_main(["--cloud", entry, "--cluster", c, "--cluster-id", cid, "--server-id", master.id,
                          "--workers", workers]) == 0
    for s in found.values():
        conn.compute.wait_for_delete(s, wait=120)
    volume = conn.block_storage.wait_for_status(conn.block_storage.get_volume(volume.id), "available", wait=120)
    assert volume.attachments == []

    listed = deployer.json("gc")
    assert [(r["name"], r["action"]) for r in listed["expired"] if r["name"] == c] == [(c, "listed")], listed
    deployer("gc", "--yes")
    nothing_left(conn, tmp_path, c, cid)
