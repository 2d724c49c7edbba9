"""Where Nova puts the nodes (openstack.placement), before and after Terraform.

Before: the preflight's part. A server group's policy is fixed once the group exists
(its `policies` is ForceNew in terraform-provider-openstack v3.4.0, and a replaced group
would leave the running servers in none), so a changed placement on a running cluster
is refused; a hard anti-affinity asks a host per node, so more nodes than the cloud has
hypervisors is refused too, when this user may count them (os-hypervisors is an admin
API by default; otherwise Nova says so itself, a node at a time, as a build failure).

After: where each server landed, from the server record: its hostId (Nova's hash of
project and hypervisor, which any member of the project may read), the hypervisor's
name where the user's role may see it (OS-EXT-SRV-ATTR:host, admin by default) and its
availability zone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GROUP_RESOURCE = "openstack_compute_servergroup_v2"


def recorded_policy(workdir: Path) -> tuple[bool, str | None]:
    """(whether Terraform's state records the cluster's server group, its policy) from
    terraform/openstack's state in `workdir`; (False, None) when it has none, as a cluster
    made before server groups, or with placement: any, has none."""
    path = workdir / "terraform.tfstate"
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False, None
    for r in state.get("resources") or []:
        if r.get("type") == GROUP_RESOURCE and r.get("mode") == "managed":
            for inst in r.get("instances") or []:
                policies = (inst.get("attributes") or {}).get("policies") or []
                return True, (policies[0] if policies else None)
    return False, None


def policy_change_problem(workdir: Path, wanted: str | None) -> str | None:
    """Why `wanted` cannot apply to the cluster recorded in `workdir`, or None."""
    has_group, policy = recorded_policy(workdir)
    if not has_group or policy == wanted:
        return None  # a first run, or a cluster that never had a group: one is made for the nodes to come
    asked = wanted or "no server group (placement: any)"
    return (f"openstack.placement: this cluster's server group has policy {policy}, the spec asks {asked}; a group's "
            f"policy is fixed at creation: set the placement back, or make a new cluster (`deployer down` first, or "
            f"another --name)")


def hosts_problem(hosts: int | None, nodes: int, policy: str | None) -> str | None:
    """A hard anti-affinity for more nodes than the cloud has hypervisors, or None
    (hosts None: this user cannot count them)."""
    if policy != "anti-affinity" or hosts is None or nodes <= hosts:
        return None
    return (f"openstack.placement: spread with placement_hard puts each node on a hypervisor of its own, and the cloud "
            f"has {hosts} up and enabled for {nodes} nodes: run with --nodes {hosts}, or set placement_hard: false "
            f"(spread as far as the hosts go)")


def count_hosts(conn: Any) -> int | None:
    """Hypervisors that are up and enabled; None when this user may not list them."""
    import openstack

    try:
        found = list(conn.compute.hypervisors(details=True))
    except (openstack.exceptions.ForbiddenException, openstack.exceptions.NotFoundException):
        return None
    return sum(1 for h in found if (getattr(h, "state", "up") or "up") == "up"
               and (getattr(h, "status", "enabled") or "enabled") == "enabled")


def where(server: Any) -> tuple[str | None, str | None, str | None]:
    """(host, host_id, zone) of a server record: host is the hypervisor's name where the
    user may see it, else the hostId; None where Nova says nothing (not yet scheduled)."""
    host_id = getattr(server, "host_id", None) or None
    name = getattr(server, "compute_host", None) or getattr(server, "hypervisor_hostname", None) or None
    zone = getattr(server, "availability_zone", None) or None
    return name or host_id, host_id, zone
