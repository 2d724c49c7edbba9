"""Reading the `cluster` output's node list: the few lookups every verb needs.

Free of third-party imports, so `status` and `ssh` stay fast.
"""

from __future__ import annotations

from typing import Any


def names(cluster: dict[str, Any]) -> list[str]:
    return [n["name"] for n in cluster["nodes"]]


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
