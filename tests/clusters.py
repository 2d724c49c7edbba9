"""Typed clusters for tests from the few fields a test cares about (deployer/cluster.py).

A test writes the nodes and fields it asserts on; the rest takes the local module's
values, so each literal stays as short as the old dict literals were.
"""

from __future__ import annotations

from typing import Any

from deployer.cluster import Cluster


def typed(data: dict[str, Any]) -> Cluster:
    name = data.get("name", "t")
    nodes = []
    for i, n in enumerate(data.get("nodes", [])):
        nodes.append({"role": "master" if i == 0 else "worker", "private_ip": f"10.0.0.{10 + i}", **n})
    return Cluster.parse({"name": name, "provider": "local", "ssh_user": "deployer", "shared_dir": "/shared",
                          **data, "nodes": nodes})
