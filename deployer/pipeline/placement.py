"""Where the nodes landed: read from the provider after Terraform, kept in the cluster
record, and what `up` says about it.

Terraform's OpenStack provider reads no hostId (v3.4.0's instance resource has only
`hypervisor_hostname`, which an ordinary member of a project is never shown), so the
provider's own observation, which every user may make, is what fills `host`, `host_id`
and `zone` in the record. Everything that uses placement (the hostfile's order, Slurm's
topology, the check's network matrix, bench's report) reads it from the record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
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


# Soft spread, evened out after Terraform (lifecycle.spread_out does the moves).
#
# Nova's ServerGroupSoftAntiAffinityWeigher (nova/scheduler/weights/affinity.py) weighs a
# host by the group members in `host_state.instances`: the scheduler's view of what runs
# there, which learns a server only when its nova-compute reports it (update_instance_info,
# once the build is done) or, within one multi-create request, from a stub the scheduler
# sets itself (manager._consume_selected_host). Terraform sends one POST /servers per node,
# all at once: each is weighed before the others have a host, every host weighs 0 and the
# other weighers (RAM, CPU, ...) decide, which may put several on one host while others
# stand empty (the test cloud's three hosts: 3 nodes on 1 host, or 2 + 1). A server made
# once the others run is weighed against all of them, and goes where the fewest are. So
# the crowded nodes this run made are made anew, one at a time, each against the others.


def loads(where: Mapping[str, str | None]) -> Counter[str]:
    """Host -> how many of the nodes run there (`where`: node -> host)."""
    return Counter(h for h in where.values() if h is not None)


def spread_is_even(where: Mapping[str, str | None], hosts: int | None) -> bool:
    """Whether a soft spread of the nodes in `where` is as even as this user can tell:
    no host holds two more than another, and as many hosts as nodes are used, or as the
    cloud has (`hosts`: None when this user may not count them; then a host of no node
    may stand empty, which only a node made anew can tell)."""
    load = loads(where)
    if not load:
        return True
    wanted = len(where) if hosts is None else min(len(where), hosts)
    return len(load) >= wanted and max(load.values()) - min(load.values()) <= 1


def crowded_node(where: Mapping[str, str | None], raced: Collection[str], master: str,
                 hosts: int | None) -> str | None:
    """The node to make anew so that a soft spread comes closer to even, or None (even
    already, a host not known, or no node on a crowded host lost the race).

    `where`: node -> host, in the nodes' order; `raced`: the nodes this run made at once
    and has not made anew since. Only such a node that shares its host with another of
    them may move: two weighed without knowing of each other is the race; a node that
    ran before may hold work, and one made alone (a scale-out by one, a move) was weighed
    against all the others already. It comes from the most loaded host; a worker before
    the master (whose shared volume would be detached and attached again), the last made
    first."""
    if any(h is None for h in where.values()) or spread_is_even(where, hosts):
        return None
    load = loads(where)
    fewest = min(load.values())
    wanted = len(where) if hosts is None else min(len(where), hosts)
    short_of_hosts = len(load) < wanted
    order = list(where)

    def may_go(node: str, host: str) -> bool:
        # A lone node cannot be spread further; with every host in use, only a host two
        # over another gains from a move.
        crowded = load[host] >= 2 and (short_of_hosts or load[host] >= fewest + 2)
        return crowded and any(other != node and where[other] == host for other in raced)

    candidates = [node for node, host in where.items() if node in raced and host is not None and may_go(node, host)]
    candidates.sort(key=lambda node: (-load[where[node] or ""], node == master, -order.index(node)))
    return candidates[0] if candidates else None


def moved_closer(before: Mapping[str, str | None], node: str, now: str | None) -> bool:
    """Whether `node`, made anew, came closer to even: it landed on a host that had none of
    the nodes, or on one that has, counting it, fewer than it left behind. Otherwise Nova
    had no better host for it (the others are full, or only those it had are up): the
    moves stop there."""
    load = loads(before)
    was = before[node]
    if now is None or was is None or now == was:
        return False
    return now not in load or load[now] + 1 < load[was]


def evens_out(spec: ClusterSpec) -> bool:
    """Whether `up` evens out where the new nodes landed: a soft spread (a hard one is
    Nova's to enforce; pack and any ask nothing of the kind)."""
    return spec.provider == "openstack" and spec.openstack.server_group_policy == "soft-anti-affinity"


def short_host(host: str | None) -> str:
    """A host for a line: a hostId (56 hex digits) by its first 12, a name as it is."""
    if host is None:
        return "host not known"
    return f"hostId {host[:12]}…" if len(host) == 56 and all(c in "0123456789abcdef" for c in host) else host


def move_line(where: Mapping[str, str | None], node: str, now: str | None) -> str:
    """One progress line for a node made anew by spread_out."""
    load = loads(where)
    was = where[node]
    others = load[was] - 1 if was else 0
    there = sum(1 for n, h in where.items() if h == now and n != node)
    if now is not None and now not in load:
        landed = "on a host none of the others is on"
    elif moved_closer(where, node, now):
        landed = f"on a host with {there} of the others"
    else:
        landed = (f"on a host with {there} of the others: no host with fewer took it (full, or Nova's weighers "
                  f"of free RAM, vCPUs and disk outweigh the group's soft-anti-affinity on this cloud: "
                  f"placement_hard: true insists), so the moves stop")
    return (f"placement: {node} shared {short_host(was)} with {others} other node(s) (Nova weighs "
            f"servers made at once before any has a host): made it anew; now {landed} ({short_host(now)})")


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
            f"is a preference Nova drops rather than fail: no other host had room for {spec.openstack.flavor} (a node "
            f"this run made anew, weighed against the others, landed there again), or the nodes were made at once by "
            f"an earlier run, before `up` evened a spread out (docs/openstack.md, \"Placement\"). "
            f"One host's failure takes the whole cluster, and every pair talks through its bridge, not the network. "
            f"`deployer up --replace NODE`, one node at a time, sends a node where the fewest of the others are; "
            f"placement_hard: true makes nova-compute enforce it (a node it cannot place fails to build)")
