"""What of a cluster exists in the OpenStack project: observe, start, and the proof for `down`.

Servers are this cluster's by the metadata terraform/openstack sets (deployer_cluster),
never by name alone; the other resources by the names the module gives them. Works from
the environment recorded when the cluster was made (OS_CLOUD, the clouds.yaml path), so
`down` needs no spec.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from ..terraform import environment
from .base import Machine, Observation
from .openstack_preflight import cloud_errors, connect, own_servers, quiet_sdk_logs

# Nova statuses of a server that exists but does not run; ERROR and the rest count as
# running-but-broken and are left to the boot wait, which names the node.
STOPPED = {"SHUTOFF", "SUSPENDED", "PAUSED", "SHELVED", "SHELVED_OFFLOADED", "STOPPED"}


@contextlib.contextmanager
def session(env: dict[str, str]) -> Iterator[Any]:
    """An authenticated connection made from the recorded environment."""
    with environment(env), quiet_sdk_logs():
        conn, _ = connect(env.get("OS_CLOUD"))
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                conn.close()


def observe(cluster: str, env: dict[str, str], nodes: list[str]) -> Observation:
    with session(env) as conn, cloud_errors(conn, f"listing what exists of cluster {cluster}"):
        servers = {s.name: s for s in own_servers(conn, cluster)}
        seen = {
            n: Machine("stopped" if servers[n].status in STOPPED else "running", servers[n].id) if n in servers else Machine("missing")
            for n in nodes
        }
        return Observation(nodes=seen, extra=sorted(set(servers) - set(nodes)), other=_other(conn, cluster))


def start(cluster: str, env: dict[str, str], server_ids: list[str]) -> None:
    with session(env) as conn, cloud_errors(conn, f"starting stopped nodes of cluster {cluster}"):
        for sid in server_ids:
            conn.compute.start_server(sid)


def _other(conn: Any, name: str) -> list[str]:
    """The cluster's non-server resources, by the names terraform/openstack gives them."""
    ports = re.compile(f"^{re.escape(name)}-(master|worker-[0-9]+)-port$")
    found = [f"volume {v.name}" for v in conn.block_storage.volumes(name=f"{name}-shared")]
    found += [f"port {p.name}" for p in conn.network.ports() if p.name and ports.match(p.name)]
    found += [f"security group {g.name}" for g in conn.network.security_groups() if g.name in (f"{name}-cluster", f"{name}-master")]
    found += [f"router {r.name}" for r in conn.network.routers() if r.name == f"{name}-router"]
    found += [f"network {n.name}" for n in conn.network.networks() if n.name == f"{name}-net"]
    found += [f"floating IP {f.floating_ip_address}" for f in conn.network.ips() if (f.description or "") == f"deployer {name} master"]
    if conn.compute.find_keypair(f"{name}-key", ignore_missing=True):  # made by the module when no key_pair is named
        found.append(f"key pair {name}-key")
    return found


def deployer_servers(env: dict[str, str]) -> list[Any]:
    """Every server in the project that a deployer cluster made (deployer_cluster
    metadata), whatever the cluster: what `deployer gc` reads expiries from."""
    with session(env) as conn, cloud_errors(conn, "listing the project's deployer servers"):
        return [s for s in conn.compute.servers(details=True) if (s.metadata or {}).get("deployer_cluster")]
