"""Delete a cluster from its OpenStack project without Terraform or its state.

For `deployer gc`, when the cloud's metadata says a cluster has expired and no state of
it is here (made on another machine, or the laptop is gone). What is deleted, in the
order the APIs need: the servers that carry the cluster's id (`deployer_cluster_id`
metadata; and only when there is at least one: the metadata is the proof it is a deployer
cluster), then what carries the id's tag (terraform/openstack's local.tags): its ports,
the master's floating IP, the router (interfaces first), the subnet and network, the
security groups; the key pair and the server group by their names; the shared volume by its
metadata. A cluster
of the same name with another id is another cluster, and stays. Afterwards the same look
that `down` uses must find nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...errors import NoLongerExpired, OperationFailed
from .observe import observe, session, tagged
from .session import cloud_errors
from .teardown import CLUSTER_ID_KEY, cluster_servers, not_expired

SERVER_DELETE_TIMEOUT_S = 600


def delete_cluster(env: dict[str, str], cluster: str, cluster_id: str, *, say: Callable[[str], None] = print,
                   expired_at: datetime | None = None) -> list[str]:
    """Delete everything of the cluster `cluster_id` (named `cluster`); returns what was
    deleted. OperationFailed when no server carries the id, or when something is left.

    `expired_at` (gc): every server's and the volume's expiry is read again right before
    deleting, and a cluster one of them keeps (a later expiry: an `up --ttl` extended it
    after gc listed it, or reached only some of them; or none any more) is kept:
    NoLongerExpired."""
    deleted: list[str] = []
    with session(env) as conn, cloud_errors(conn, f"deleting cluster {cluster} by its metadata"):
        servers = cluster_servers(conn, cluster_id)
        if not servers:
            raise OperationFailed(f"no server carries deployer_cluster_id={cluster_id}: nothing proves {cluster!r} "
                                  f"({cluster_id}) is a deployer cluster; delete by hand if it is")
        if expired_at is not None:
            volumes = [v for v in conn.block_storage.volumes() if (v.metadata or {}).get(CLUSTER_ID_KEY) == cluster_id]
            why = not_expired([*servers, *volumes], expired_at)
            if why:
                raise NoLongerExpired(f"cluster {cluster} has not expired by every server's and the volume's word ({why}); kept")
        for s in servers:
            say(f"  deleting server {s.name}")
            conn.compute.delete_server(s)
            deleted.append(f"server {s.name}")
        for s in servers:
            conn.compute.wait_for_delete(s, wait=SERVER_DELETE_TIMEOUT_S)
        found = tagged(conn, cluster, cluster_id)

        def volume_gone(v: Any) -> None:
            if v.status != "available":  # still detaching from the deleted master
                conn.block_storage.wait_for_status(v, "available", failures=["error"], wait=SERVER_DELETE_TIMEOUT_S)
            conn.block_storage.delete_volume(v)

        def router_gone(r: Any) -> None:
            for sn in found["subnet"]:  # interfaces first: a router in use cannot go
                conn.network.remove_interface_from_router(r, subnet_id=sn.id)
            conn.network.delete_router(r)

        # In the order the APIs need: what uses the network before the network.
        for kind, delete in (("floating IP", conn.network.delete_ip), ("port", conn.network.delete_port),
                             ("router", router_gone), ("subnet", conn.network.delete_subnet),
                             ("network", conn.network.delete_network), ("security group", conn.network.delete_security_group),
                             ("key pair", conn.compute.delete_keypair), ("server group", conn.compute.delete_server_group),
                             ("volume", volume_gone)):
            for item in found[kind]:
                delete(item)
                if kind != "subnet":  # goes with its network, as `down`'s proof counts it
                    deleted.append(f"{kind} {getattr(item, 'floating_ip_address', None) or item.name}")
    left = observe(cluster, cluster_id, env, []).remaining()
    if left:
        raise OperationFailed(f"deleting {cluster} by its metadata left {', '.join(left)}; remove them by hand "
                              f"(`openstack network list --tags deployer-id-{cluster_id}`; servers and the volume whose "
                              f"deployer_cluster_id is {cluster_id})")
    return deleted
