"""What of a cluster exists in the OpenStack project: observe, start, and the proof for `down`.

Servers are this cluster's by the metadata terraform/openstack sets (deployer_cluster),
never by name alone; the network resources by the module's tag, the volume by its
metadata, the key pair (which can carry neither) by its name. Works from
the environment recorded when the cluster was made (OS_CLOUD, the clouds.yaml path), so
`down` needs no spec.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from ..nodes import node_name_pattern
from ..terraform import environment
from .base import Machine, Observation
from .openstack_session import cloud_errors, connect, quiet_sdk_logs

# Nova statuses of a server that exists but does not run; ERROR and the rest count as
# running-but-broken and are left to the boot wait, which names the node.
STOPPED = {"SHUTOFF", "SUSPENDED", "PAUSED", "SHELVED", "SHELVED_OFFLOADED", "STOPPED"}


def own_servers(conn: Any, cluster: str) -> list[Any]:
    """This cluster's servers: the name filter narrows the list, the metadata that
    terraform/openstack sets (deployer_cluster) decides; a look-alike name is not ours.

    Nova hands the name filter to the database as a regular expression, and on MySQL or
    MariaDB (most clouds) it escapes every `|` first (nova.db.utils._safe_regex_mysql):
    an alternation such as `-(master|worker-N)` matches nothing there. So the filter is
    the plain prefix and the full pattern is applied here."""
    pattern = re.compile(node_name_pattern(cluster))
    return [
        s for s in conn.compute.servers(details=True, name=f"^{cluster}-")
        if pattern.match(s.name or "") and (s.metadata or {}).get("deployer_cluster") == cluster
    ]


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


# The action that brings a server of each not-running status back (Nova allows `start`
# on SHUTOFF only and answers 409 otherwise).
RESUME = {"SHUTOFF": "start_server", "STOPPED": "start_server", "SUSPENDED": "resume_server", "PAUSED": "unpause_server",
          "SHELVED": "unshelve_server", "SHELVED_OFFLOADED": "unshelve_server"}


def start(cluster: str, env: dict[str, str], server_ids: list[str]) -> list[str]:
    """Bring each server back by the action its status needs; returns what was done."""
    done = []
    with session(env) as conn, cloud_errors(conn, f"starting stopped nodes of cluster {cluster}"):
        for sid in server_ids:
            server = conn.compute.get_server(sid)
            action = RESUME.get(server.status)
            if action:
                getattr(conn.compute, action)(server)
                done.append(f"{server.name}: {action.removesuffix('_server')}")
    return done


def cluster_tag(cluster: str) -> str:
    """The Neutron tag terraform/openstack puts on the cluster's network resources (main.tf, local.tags)."""
    return f"deployer-cluster-{cluster}"


def tagged(conn: Any, cluster: str) -> dict[str, list[Any]]:
    """The cluster's non-server resources, by its tag (Neutron) or metadata (Cinder);
    key pairs carry neither, so the key pair goes by the name the module gives it."""
    tag = cluster_tag(cluster)
    return {
        "floating IP": list(conn.network.ips(tags=tag)),
        "port": list(conn.network.ports(tags=tag)),
        "router": list(conn.network.routers(tags=tag)),
        "subnet": list(conn.network.subnets(tags=tag)),
        "network": list(conn.network.networks(tags=tag)),
        "security group": list(conn.network.security_groups(tags=tag)),
        "volume": [v for v in conn.block_storage.volumes() if (v.metadata or {}).get("deployer_cluster") == cluster],
        "key pair": [k for k in [conn.compute.find_keypair(f"{cluster}-key", ignore_missing=True)] if k],
    }


def _other(conn: Any, cluster: str) -> list[str]:
    """What of the cluster exists besides its servers, for `down`'s proof."""
    found = []
    for kind, items in tagged(conn, cluster).items():
        if kind == "subnet":
            continue  # goes with its network
        found += [f"{kind} {getattr(i, 'floating_ip_address', None) or i.name}" for i in items]
    return found


def deployer_servers(env: dict[str, str]) -> list[Any]:
    """Every server in the project that a deployer cluster made (deployer_cluster
    metadata), whatever the cluster: what `deployer gc` reads expiries from."""
    with session(env) as conn, cloud_errors(conn, "listing the project's deployer servers"):
        return [s for s in conn.compute.servers(details=True) if (s.metadata or {}).get("deployer_cluster")]
