"""What of a cluster exists in the OpenStack project: observe, start, and the proof for `down`.

A resource is this cluster's by the cluster's random id (state.py: cluster_id), which
terraform/openstack puts in the servers' and the volume's metadata (deployer_cluster_id)
and in the network resources' tags (deployer-id-<id>), and in the key pair's name (which
can carry neither). Never by name alone: another user's cluster of the same name in the
same project is somebody else's, and the preflight refuses to make a second one. Works
from the environment recorded when the cluster was made (OS_CLOUD, the clouds.yaml
path), so `down` needs no spec.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from ...errors import OperationFailed
from ...nodes import node_name_pattern
from ...tools.terraform import environment
from ..base import Machine, Observation
from .session import cloud_errors, connect, quiet_sdk_logs
from .teardown import CLUSTER_ID_KEY, CLUSTER_KEY

# What a server or network named as a deployer cluster's carries for an id when it carries
# none (made by hand, or by a tool that copied the metadata): no state dir's, so never ours.
NO_ID = "unknown"

# Nova statuses of a server that exists but does not run; ERROR and the rest count as
# running-but-broken and are left to the boot wait, which names the node.
STOPPED = {"SHUTOFF", "SUSPENDED", "PAUSED", "SHELVED", "SHELVED_OFFLOADED", "STOPPED"}


def named_servers(conn: Any, cluster: str) -> list[Any]:
    """Every server named as a node of `cluster` that some deployer cluster of that name
    made (deployer_cluster metadata), whoever's it is.

    Nova hands the name filter to the database as a regular expression, and on MySQL or
    MariaDB (most clouds) it escapes every `|` first (nova.db.utils._safe_regex_mysql):
    an alternation such as `-(master|worker-N)` matches nothing there. So the filter is
    the plain prefix and the full pattern is applied here."""
    pattern = re.compile(node_name_pattern(cluster))
    return [
        s for s in conn.compute.servers(details=True, name=f"^{cluster}-")
        if pattern.match(s.name or "") and (s.metadata or {}).get(CLUSTER_KEY) == cluster
    ]


def server_id_of(server: Any) -> str:
    """The cluster id a deployer server carries (NO_ID: none)."""
    return (server.metadata or {}).get(CLUSTER_ID_KEY) or NO_ID


def carrying(servers: list[Any], cluster_id: str | None) -> list[Any]:
    """Those of `servers` that carry `cluster_id`; None (a cluster that has made nothing
    yet) owns none."""
    return [s for s in servers if cluster_id and server_id_of(s) == cluster_id]


def own_servers(conn: Any, cluster: str, cluster_id: str | None) -> list[Any]:
    """This cluster's servers: named as its nodes and carrying its id."""
    return carrying(named_servers(conn, cluster), cluster_id)


def others_of_the_name(conn: Any, cluster: str, cluster_id: str | None, named: list[Any]) -> dict[str, list[str]]:
    """Another deployer cluster of the same name in the project: its id -> what of it was
    found (among `named`, the servers named_servers listed, by their metadata; networks
    by the name tag: a half-made cluster has one)."""
    found: dict[str, list[str]] = {}

    def note(their_id: str, what: str) -> None:
        if their_id != cluster_id:
            found.setdefault(their_id, []).append(what)

    for s in named:
        note(server_id_of(s), f"server {s.name}")
    for n in conn.network.networks(tags=name_tag(cluster)):
        note(next((t.removeprefix(ID_TAG) for t in n.tags or [] if t.startswith(ID_TAG)), NO_ID), f"network {n.name}")
    return found


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


def observe(cluster: str, cluster_id: str | None, env: dict[str, str], nodes: list[str]) -> Observation:
    if cluster_id is None:
        raise OperationFailed(f"cluster {cluster} has made nothing in this state dir (no origin.json): nothing to look for")
    with session(env) as conn, cloud_errors(conn, f"listing what exists of cluster {cluster}"):
        servers = {s.name: s for s in own_servers(conn, cluster, cluster_id)}
        seen = {n: _machine(servers[n]) if n in servers else Machine("missing") for n in nodes}
        return Observation(nodes=seen, extra=sorted(set(servers) - set(nodes)), other=_other(conn, cluster, cluster_id))


def _machine(server: Any) -> Machine:
    from .placement import where

    host, host_id, zone = where(server)
    return Machine("stopped" if server.status in STOPPED else "running", server.id, host=host, host_id=host_id, zone=zone)


# The action that brings a server of each not-running status back (Nova allows `start`
# on SHUTOFF only and answers 409 otherwise).
RESUME = {"SHUTOFF": "start_server", "STOPPED": "start_server", "SUSPENDED": "resume_server", "PAUSED": "unpause_server",
          "SHELVED": "unshelve_server", "SHELVED_OFFLOADED": "unshelve_server"}


START_WAIT_S = 600.0  # an unshelve is scheduled again: a GPU host may take minutes to be found
_POLL_S = 2.0


def start(cluster: str, env: dict[str, str], server_ids: list[str], wait_s: float = START_WAIT_S) -> list[str]:
    """Bring each server back by the action its status needs, and wait until each is
    ACTIVE with no task running; returns what was done.

    The wait is what lets Terraform run next: the provider's Read refuses SUSPENDED (and
    any status but active, shutoff, paused, shelved[_offloaded], error, migrating, build),
    and where it reads shutoff, paused or shelved it sends its own start, unpause or
    unshelve, which Nova refuses with 409 while the deployer's is still under way
    (terraform-provider-openstack v3.4.0, resource_openstack_compute_instance_v2.go:
    Read's power_state switch, Update's power_state change)."""
    done = []
    with session(env) as conn, cloud_errors(conn, f"starting stopped nodes of cluster {cluster}"):
        for sid in server_ids:
            server = conn.compute.get_server(sid)
            action = RESUME.get(server.status)
            if action:
                getattr(conn.compute, action)(server)
                done.append(f"{server.name}: {action.removesuffix('_server')}")
        if done:
            _wait_active(conn, cluster, server_ids, wait_s)
    return done


def _wait_active(conn: Any, cluster: str, server_ids: list[str], wait_s: float) -> None:
    """Until every server in `server_ids` is ACTIVE with no task: one listing per poll,
    whatever their number. OperationFailed naming a server that went to ERROR, or each
    still on its way when `wait_s` is over."""
    import time

    deadline = time.monotonic() + wait_s
    pending = set(server_ids)
    while True:
        listed = {s.id: s for s in conn.compute.servers(details=True, name=f"^{cluster}-") if s.id in pending}
        for sid, s in listed.items():
            if s.status == "ERROR":
                raise OperationFailed(f"{s.name} went to ERROR while it was brought back "
                                      f"(`openstack server show {s.id}` says why); `deployer up --replace {s.name}` makes it anew")
            if s.status == "ACTIVE" and not getattr(s, "task_state", None):
                pending.discard(sid)
        pending &= set(listed)  # a server deleted meanwhile: Terraform makes it anew
        if not pending:
            return
        if time.monotonic() >= deadline:
            late = ", ".join(f"{listed[i].name} ({listed[i].status}, {getattr(listed[i], 'task_state', None) or 'no task'})"
                             for i in sorted(pending))
            raise OperationFailed(f"still not running {wait_s:.0f}s after it was started: {late}; run `deployer up` again")
        time.sleep(_POLL_S)


# What terraform-provider-openstack v3.4.0 can destroy (resource_openstack_compute_instance_v2.go):
# its Read refuses SUSPENDED, REBOOT, RESCUE, RESIZE and the like ("Invalid power_state"),
# and after the DELETE it waits only through ACTIVE and SHUTOFF ("unexpected state
# 'PAUSED'"); a SHELVED_OFFLOADED server has no host and is gone at once.
DESTROYABLE = {"ACTIVE", "SHUTOFF", "SHELVED_OFFLOADED"}


def delete_undestroyable(cluster: str, cluster_id: str | None, env: dict[str, str], wait_s: float = START_WAIT_S) -> list[str]:
    """Before `down`'s Terraform destroy: delete, through the API, this cluster's servers
    in a status the provider cannot destroy (DESTROYABLE), and wait until they are gone;
    Terraform's refresh then finds them gone and destroys the rest. Returns what was
    deleted. (Resuming them first would take a GPU host to unshelve a server only to
    delete it.)"""
    import time

    if cluster_id is None:
        return []
    with session(env) as conn, cloud_errors(conn, f"deleting the servers of cluster {cluster} Terraform cannot destroy"):
        odd = [s for s in own_servers(conn, cluster, cluster_id) if s.status not in DESTROYABLE]
        for s in odd:
            conn.compute.delete_server(s)
        deadline = time.monotonic() + wait_s
        waiting = {s.id for s in odd}
        while waiting:
            waiting &= {s.id for s in conn.compute.servers(name=f"^{cluster}-")}
            if waiting and time.monotonic() >= deadline:
                raise OperationFailed(f"servers of cluster {cluster} still not deleted after {wait_s:.0f}s: "
                                      f"{', '.join(s.name for s in odd if s.id in waiting)}; run `deployer down` again")
            if waiting:
                time.sleep(_POLL_S)
    return [f"{s.name} was {s.status}, which Terraform's OpenStack provider cannot destroy: deleted it through the API first"
            for s in odd]


ID_TAG = "deployer-id-"


def name_tag(cluster: str) -> str:
    """The Neutron tag with the cluster's name, for people (main.tf, local.tags)."""
    return f"deployer-cluster-{cluster}"


def id_tag(cluster_id: str) -> str:
    """The Neutron tag with the cluster's id (main.tf, local.tags): what the deployer matches."""
    return f"{ID_TAG}{cluster_id}"


def key_pair_name(cluster: str, cluster_id: str) -> str:
    """The key pair terraform/openstack uploads (compute.tf): unique per user, as Nova wants."""
    return f"{cluster}-key-{cluster_id}"


def server_group_name(cluster: str, cluster_id: str) -> str:
    """The server group terraform/openstack makes (compute.tf): named with the id."""
    return f"{cluster}-{cluster_id}"


def tagged(conn: Any, cluster: str, cluster_id: str) -> dict[str, list[Any]]:
    """The cluster's non-server resources, by its id: a Neutron tag, the volume's
    metadata, the key pair's and the server group's names."""
    tag = id_tag(cluster_id)
    volume = [v for v in conn.block_storage.volumes() if (v.metadata or {}).get(CLUSTER_ID_KEY) == cluster_id]
    key = key_pair_name(cluster, cluster_id)
    return {
        "floating IP": list(conn.network.ips(tags=tag)),
        "port": list(conn.network.ports(tags=tag)),
        "router": list(conn.network.routers(tags=tag)),
        "subnet": list(conn.network.subnets(tags=tag)),
        "network": list(conn.network.networks(tags=tag)),
        "security group": list(conn.network.security_groups(tags=tag)),
        "volume": volume,
        "key pair": [k for k in [conn.compute.find_keypair(key, ignore_missing=True)] if k],
        # A server group carries neither tags nor metadata: by its name, which holds the id (compute.tf).
        "server group": [g for g in conn.compute.server_groups() if g.name == server_group_name(cluster, cluster_id)],
    }


def _other(conn: Any, cluster: str, cluster_id: str) -> list[str]:
    """What of the cluster exists besides its servers, for `down`'s proof."""
    found = []
    for kind, items in tagged(conn, cluster, cluster_id).items():
        if kind == "subnet":
            continue  # goes with its network
        found += [f"{kind} {getattr(i, 'floating_ip_address', None) or i.name}" for i in items]
    return found


def deployer_resources(env: dict[str, str]) -> tuple[list[Any], list[Any]]:
    """Every server and every volume in the project that a deployer cluster made (its id
    in the metadata), whatever the cluster: what `deployer gc` reads expiries from."""
    with session(env) as conn, cloud_errors(conn, "listing the project's deployer servers and volumes"):
        servers = [s for s in conn.compute.servers(details=True) if (s.metadata or {}).get(CLUSTER_ID_KEY)]
        volumes = [v for v in conn.block_storage.volumes() if (v.metadata or {}).get(CLUSTER_ID_KEY)]
        return servers, volumes
