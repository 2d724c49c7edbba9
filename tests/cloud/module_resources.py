"""A cluster's resources made the way terraform/openstack makes them, with openstacksdk.

The module itself is applied by the real provider in test_module_apply.py (built by
`make provider`). This stays for what the other tests need and Terraform would not make:
resources without the cluster's id or with someone else's (look-alikes, a same-named
cluster of another user), clusters made half-way or with servers in every Nova state,
and 72 servers in seconds for the request counts of test_scale.py, all without a state
dir. The same names, id, metadata and tags as the module (main.tf's local.tags, set after
creation as the provider does: Neutron takes no tags in a POST), the same order; what the
module declares is checked against the provider's schema in
tests/unit/test_terraform_modules.py, and applied in test_module_apply.py: keep them in step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deployer.providers.openstack.observe import NO_ID, id_tag, key_pair_name, name_tag
from deployer.state import new_cluster_id

from .services import IMAGE

NODE_WAIT_S = 180


@dataclass
class Made:
    name: str
    id: str  # the cluster id (state.py), in the metadata and the tags
    servers: dict[str, Any] = field(default_factory=dict)  # node name -> server
    network: Any = None
    volume: Any = None
    floating_ip: Any = None


def node_names(cluster: str, nodes: int) -> list[str]:
    """modules/design: the master, then worker-1..N-1."""
    return [f"{cluster}-master"] + [f"{cluster}-worker-{i}" for i in range(1, nodes)]


def make_cluster(conn: Any, cluster: str, nodes: int, *, flavor: str = "m1.small", expires_at: str | None = None,
                 cidr: str = "192.168.77.0/24", volume: bool = True, floating_ip: bool = True, wait: bool = True,
                 cluster_id: str | None = None) -> Made:
    made = Made(cluster, cluster_id or new_cluster_id())
    no_id = made.id == NO_ID  # deployer's metadata without an id (by hand, or a tool copying it): the name only
    tags = ["deployer", name_tag(cluster)] + ([] if no_id else [id_tag(made.id)])
    net_api = conn.network
    ext = net_api.find_network("public")

    def tagged(resource: Any) -> Any:
        net_api.set_tags(resource, tags)
        return resource

    made.network = net = tagged(net_api.create_network(name=f"{cluster}-net", description=f"deployer cluster {cluster}"))
    subnet = tagged(net_api.create_subnet(name=f"{cluster}-subnet", network_id=net.id, cidr=cidr, ip_version=4))
    router = tagged(net_api.create_router(name=f"{cluster}-router", external_gateway_info={"network_id": ext.id}))
    net_api.add_interface_to_router(router, subnet_id=subnet.id)
    groups = [tagged(net_api.create_security_group(name=f"{cluster}-{role}")) for role in ("cluster", "master")]
    key_name = f"{cluster}-key" if no_id else key_pair_name(cluster, made.id)
    conn.compute.create_keypair(name=key_name, public_key=PUBLIC_KEY)
    flavor_id = conn.compute.find_flavor(flavor, ignore_missing=False).id
    image_id = conn.image.find_image(IMAGE, ignore_missing=False).id
    meta_expiry = {"deployer_expires_at": expires_at} if expires_at else {}
    meta_cluster = {"deployer_cluster": cluster, **({} if no_id else {"deployer_cluster_id": made.id})}
    for index, node in enumerate(node_names(cluster, nodes)):
        port = tagged(net_api.create_port(name=f"{node}-port", network_id=net.id,
                                          security_group_ids=[g.id for g in (groups if index == 0 else groups[:1])]))
        made.servers[node] = conn.compute.create_server(
            name=node, flavor_id=flavor_id, image_id=image_id, key_name=key_name, networks=[{"port": port.id}],
            metadata={**meta_cluster, "deployer_role": "master" if index == 0 else "worker",
                      "deployer_index": str(index), **meta_expiry})
    if wait:
        for node, server in made.servers.items():
            made.servers[node] = conn.compute.wait_for_server(server, wait=NODE_WAIT_S)
    master = made.servers[f"{cluster}-master"]
    if volume:
        made.volume = conn.block_storage.create_volume(name=f"{cluster}-shared", size=1,
                                                       metadata={**meta_cluster, **meta_expiry})
        conn.block_storage.wait_for_status(made.volume, "available", wait=60)
        if wait:
            conn.compute.create_volume_attachment(master, volume_id=made.volume.id)
            conn.block_storage.wait_for_status(made.volume, "in-use", wait=60)
    if floating_ip:
        made.floating_ip = tagged(net_api.create_ip(floating_network_id=ext.id, description=f"deployer {cluster} master"))
        master_port = next(net_api.ports(device_id=master.id))
        net_api.update_ip(made.floating_ip, port_id=master_port.id)
    return made


def leftovers(conn: Any, cluster: str) -> list[str]:
    """What of the cluster the project still holds, by name as well as by tag (the proof
    of a clean delete must not trust the same tags the delete used)."""
    prefix = f"{cluster}-"
    found = [f"server {s.name}" for s in conn.compute.servers(name=f"^{cluster}-") if s.name.startswith(prefix)]
    for kind, items in (("network", conn.network.networks()), ("router", conn.network.routers()),
                        ("port", conn.network.ports()), ("security group", conn.network.security_groups()),
                        ("volume", conn.block_storage.volumes())):
        found += [f"{kind} {i.name}" for i in items if (i.name or "").startswith(prefix)]
    found += [f"floating IP {i.floating_ip_address}" for i in conn.network.ips() if i.description == f"deployer {cluster} master"]
    found += [f"key pair {k.name}" for k in conn.compute.keypairs() if k.name.startswith(f"{cluster}-key")]
    found += [f"server group {g.name}" for g in conn.compute.server_groups() if g.name.startswith(prefix)]
    return found


def delete_all(conn: Any, cluster: str) -> None:
    """Best-effort clean-up after a test, whatever it left."""
    import contextlib

    for s in list(conn.compute.servers(name=f"^{cluster}-")):
        with contextlib.suppress(Exception):
            conn.compute.delete_server(s)
            conn.compute.wait_for_delete(s, wait=120)
    for ip in conn.network.ips():
        if ip.description == f"deployer {cluster} master":
            with contextlib.suppress(Exception):
                conn.network.delete_ip(ip)
    for r in conn.network.routers():
        if r.name == f"{cluster}-router":
            for p in conn.network.ports(device_id=r.id, device_owner="network:router_interface"):
                with contextlib.suppress(Exception):
                    conn.network.remove_interface_from_router(r, port_id=p.id)
            with contextlib.suppress(Exception):
                conn.network.delete_router(r)
    for p in conn.network.ports():
        if (p.name or "").startswith(f"{cluster}-"):
            with contextlib.suppress(Exception):
                conn.network.delete_port(p)
    for n in conn.network.networks():
        if n.name == f"{cluster}-net":
            with contextlib.suppress(Exception):
                conn.network.delete_network(n)
    for g in conn.network.security_groups():
        if (g.name or "").startswith(f"{cluster}-"):
            with contextlib.suppress(Exception):
                conn.network.delete_security_group(g)
    for v in conn.block_storage.volumes():
        if v.name == f"{cluster}-shared":
            with contextlib.suppress(Exception):
                conn.block_storage.wait_for_status(v, "available", wait=60)
                conn.block_storage.delete_volume(v)
    for k in conn.compute.keypairs():
        if k.name.startswith(f"{cluster}-key"):
            with contextlib.suppress(Exception):
                conn.compute.delete_keypair(k)
    for g in conn.compute.server_groups():
        if (g.name or "").startswith(f"{cluster}-"):
            with contextlib.suppress(Exception):
                conn.compute.delete_server_group(g)


# A real public key (Nova computes its fingerprint and refuses a malformed one); its private half was thrown away.
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILFX490mzw0P4C1OZVLGwpOHGqGy1/tExuhbYZd0PovC deployer@test"


def wipe_project(conn: Any) -> None:
    """Delete everything a member made in its project (a test's own project)."""
    import contextlib

    servers = list(conn.compute.servers())
    for s in servers:
        with contextlib.suppress(Exception):
            conn.compute.delete_server(s)
    for s in servers:
        with contextlib.suppress(Exception):
            conn.compute.wait_for_delete(s, wait=120)
    project = conn.current_project_id
    for g in conn.compute.server_groups():
        with contextlib.suppress(Exception):
            conn.compute.delete_server_group(g)
    for ip in conn.network.ips(project_id=project):
        with contextlib.suppress(Exception):
            conn.network.delete_ip(ip)
    for r in conn.network.routers(project_id=project):
        for p in conn.network.ports(device_id=r.id, device_owner="network:router_interface"):
            with contextlib.suppress(Exception):
                conn.network.remove_interface_from_router(r, port_id=p.id)
        with contextlib.suppress(Exception):
            conn.network.delete_router(r)
    for p in conn.network.ports(project_id=project):
        with contextlib.suppress(Exception):
            conn.network.delete_port(p)
    for n in conn.network.networks(project_id=project):
        with contextlib.suppress(Exception):
            conn.network.delete_network(n)
    for g in conn.network.security_groups(project_id=project):
        if g.name != "default":
            with contextlib.suppress(Exception):
                conn.network.delete_security_group(g)
    for v in conn.block_storage.volumes():
        with contextlib.suppress(Exception):
            conn.block_storage.wait_for_status(v, "available", wait=60)
            conn.block_storage.delete_volume(v)
    for k in conn.compute.keypairs():
        with contextlib.suppress(Exception):
            conn.compute.delete_keypair(k)
