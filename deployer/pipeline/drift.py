"""Drift: what `up` must do about the difference between the records and what exists.

The one home for "what changed since the last time": pure functions of the `cluster`
output, the provider's observation and the record of the last configuration, so every
decision is unit-tested without a cluster.

The configuration record (configured.json) holds the fingerprint of what Ansible's
result depends on (spec, inventory, roles) and, per node, the identity (`id` in the
cluster output) of the machine it configured. A node is configured again when it is new,
or its machine was replaced; every node is, when the fingerprint changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..providers.base import Observation
from ..records import Configured

if TYPE_CHECKING:
    from ..cluster import Cluster

EVERY_NODE_REASONS = {
    "reconfigure": "--reconfigure",
    "first": "first configuration",
    "fingerprint": "spec, inventory or roles changed since the last configuration",
    "master": "the master was replaced: every node must trust its new cluster SSH key",
}


@dataclass(frozen=True)
class ConfigurePlan:
    why: dict[str, str]  # node -> why Ansible configures it
    every_node: bool  # the whole cluster, not a subset

    def limit(self) -> list[str] | None:
        """Ansible's --limit: None for the whole cluster."""
        return None if self.every_node else sorted(self.why)

    def describe(self) -> str:
        if not self.why:
            return "nothing changed since the last configuration"
        if self.every_node:
            return f"all {len(self.why)} node(s) ({next(iter(self.why.values()))})"
        return ", ".join(f"{n} ({r})" for n, r in self.why.items())


def configure_plan(cluster: Cluster, record: Configured | None, fingerprint: str, *, reconfigure: bool = False) -> ConfigurePlan:
    names = [n.name for n in cluster.nodes]

    def everyone(key: str) -> ConfigurePlan:
        return ConfigurePlan({n: EVERY_NODE_REASONS[key] for n in names}, every_node=True)

    if reconfigure:
        return everyone("reconfigure")
    if not record:
        return everyone("first")
    if record.fingerprint != fingerprint:
        return everyone("fingerprint")
    done = record.nodes
    why = {}
    for node in cluster.nodes:
        if node.name not in done:
            why[node.name] = "new since the last configuration"
        elif done[node.name] != node.id:
            why[node.name] = "replaced since the last configuration"
    if names and names[0] in why:
        # The master makes the cluster user's key pair (ssh_mesh) and serves the shared
        # storage and monitoring: a new master changes what every node must hold.
        return everyone("master")
    return ConfigurePlan(why, every_node=False)


def configured_record(fingerprint: str, cluster: Cluster, only: list[str] | None = None, run: str | None = None) -> Configured:
    """The record after configuring `only` (every node when None) of `cluster`."""
    nodes = {n.name: n.id for n in cluster.nodes if only is None or n.name in only}
    return Configured(fingerprint=fingerprint, nodes=nodes, run=run)


def node_states(cluster: Cluster, seen: Observation, record: Configured | None, reachable: dict[str, bool]) -> dict[str, str]:
    """What `status` says of each node: ok · stopped · missing · replaced (needs configure) ·
    new (needs configure) · unreachable."""
    done = record.nodes if record else {}
    states = {}
    for node in cluster.nodes:
        name = node.name
        machine = seen.nodes.get(name)
        if machine is None or machine.state == "missing":
            states[name] = "missing"
        elif machine.state == "stopped":
            states[name] = "stopped"
        elif record and name in done and done[name] != node.id:
            states[name] = "replaced (needs configure)"
        elif not record or name not in done:  # never configured: new, or made by `up --no-setup`
            states[name] = "new (needs configure)"
        elif not reachable.get(name):
            states[name] = "unreachable"
        else:
            states[name] = "ok"
    return states
