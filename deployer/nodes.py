"""The naming and size rules of a cluster's nodes, before any exists (the `cluster`
output's own nodes are deployer/cluster.py's).

Free of third-party imports, so `status` and `ssh` stay fast.
"""

from __future__ import annotations

import re

# The naming and size rules, once (terraform/modules/design and the modules' variable
# validations hold the same; tests/unit/test_boot.py and test_terraform_modules.py check).
CLUSTER_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,19}$"
DEFAULT_NAME = "demo"  # the cluster a verb means when none is named and none exists
MAX_NODES = 64


def node_names(cluster: str, count: int) -> list[str]:
    """Master first, then worker-1…, as terraform/modules/design names them."""
    return [f"{cluster}-master"] + [f"{cluster}-worker-{i}" for i in range(1, count)]


def node_name_pattern(cluster: str) -> str:
    """A regular expression for exactly the cluster's node names (Nova's name filter is one)."""
    return f"^{re.escape(cluster)}-(master|worker-[0-9]+)$"
