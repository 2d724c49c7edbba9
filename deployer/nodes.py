"""Reading the `cluster` output's node list: the few lookups every verb needs.

Free of third-party imports, so `status` and `ssh` stay fast.
"""

from __future__ import annotations

from typing import Any


def names(cluster: dict[str, Any]) -> list[str]:
    return [n["name"] for n in cluster["nodes"]]


def gpus(node: dict[str, Any]) -> int:
    return int(node.get("gpus") or 0)


def slots(node: dict[str, Any]) -> int:
    """MPI slots of a node: one rank per GPU, one on a CPU node (the hostfile's rule)."""
    return gpus(node) or 1


def rank_nodes(cluster: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Rank -> node for a run on the first n nodes (--map-by slot: a node's slots in a row);
    its length is the run's rank count."""
    out: list[dict[str, Any]] = []
    for node in cluster["nodes"][:n]:
        out += [node] * slots(node)
    return out


def node_address(cluster: dict[str, Any], node: dict[str, Any]) -> str:
    return node.get("public_ip") or node["private_ip"]


def find_node(cluster: dict[str, Any], name: str | None) -> dict[str, Any]:
    if not name:
        return cluster["nodes"][0]
    for node in cluster["nodes"]:
        short = node["name"].removeprefix(cluster["name"] + "-")
        if name in (node["name"], short, node["private_ip"]):
            return node
    from .errors import UsageError

    names = ", ".join(n["name"] for n in cluster["nodes"])
    raise UsageError(f"no node {name!r} in cluster {cluster['name']!r}; pick one of: {names}")
