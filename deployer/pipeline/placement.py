"""Where the nodes landed: read from the provider after Terraform, kept in the cluster
record, and what `up` says about it.

Terraform's OpenStack provider reads no hostId (v3.4.0's instance resource has only
`hypervisor_hostname`, which an ordinary member of a project is never shown), so the
provider's own observation, which every user may make, is what fills `host`, `host_id`
and `zone` in the record. Everything that uses placement (the hostfile's order, Slurm's
topology, the check's network matrix, bench's report) reads it from the record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..providers.base import Observation, Provider
    from ..spec import ClusterSpec
    from ..state import ClusterState


def located(cluster: Cluster, seen: Observation) -> Cluster:
    """`cluster` with each node's host, host_id and zone as `seen` has them."""
    return cluster.placed({name: (m.host, m.host_id, m.zone) for name, m in seen.nodes.items()})


def locate(provider: Provider, state: ClusterState, env: dict[str, str], cluster: Cluster) -> Cluster:
    """Ask the provider where each node runs (one observation) and put it in `cluster`."""
    return located(cluster, provider.observe(state, env, cluster.names))


def describe(cluster: Cluster) -> str | None:
    """One line for `up`: how many hosts the nodes are on; None when not known."""
    groups = cluster.host_groups()
    if None in groups or not groups:
        return None
    counts = sorted((len(nodes) for nodes in groups.values()), reverse=True)
    zones = sorted({n.zone for n in cluster.nodes if n.zone})
    where = f" in zone {', '.join(zones)}" if zones else ""
    return f"placement: {len(cluster.nodes)} node(s) on {len(groups)} host(s){where} ({'+'.join(map(str, counts))})"


def spread_warning(spec: ClusterSpec, cluster: Cluster) -> str | None:
    """A cluster asked to spread that ended up on one host, named with its cause; None
    otherwise (a local cluster is one host by nature, and asks nothing)."""
    if spec.provider != "openstack" or spec.openstack.placement != "spread" or len(cluster.nodes) < 2:
        return None
    groups = cluster.host_groups()
    if len(groups) != 1 or None in groups:
        return None
    host = next(iter(groups))
    return (f"placement: spread was asked, but all {len(cluster.nodes)} nodes run on one host ({host}). soft-anti-affinity "
            f"is a preference Nova drops rather than fail: either no other host had room for {spec.openstack.flavor}, or "
            f"the nodes were made at once and Nova weighed each before any had a host (docs/openstack.md, \"Placement\"). "
            f"One host's failure takes the whole cluster, and every pair talks through its bridge, not the network. "
            f"`deployer up --replace NODE`, one node at a time, sends a node where the fewest of the others are; "
            f"placement_hard: true makes nova-compute enforce it (a node it cannot place fails to build)")
