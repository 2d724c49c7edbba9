"""Reading the `cluster` output's node list: the few lookups every verb needs.

Free of third-party imports, so `status` and `ssh` stay fast.
"""

from __future__ import annotations

import re
from typing import Any

# The naming and size rules, once (terraform/modules/design and the modules' variable
# validations hold the same; tests/unit/test_boot.py and test_terraform_modules.py check).
CLUSTER_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,19}$"
MAX_NODES = 64


def node_names(cluster: str, count: int) -> list[str]:
    """Master first, then worker-1…, as terraform/modules/design names them."""
    return [f"{cluster}-master"] + [f"{cluster}-worker-{i}" for i in range(1, count)]


def node_name_pattern(cluster: str) -> str:
    """A regular expression for exactly the cluster's node names (Nova's name filter is one)."""
    return f"^{re.escape(cluster)}-(master|worker-[0-9]+)$"


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
