"""Each local node's own cores (a cgroup cpuset), when the host has one core per node at least."""

from __future__ import annotations

from .host import sh
from .node import node_state


def cpu_plan(cpus: list[int], nodes: int) -> list[str] | None:
    """Cores of its own for each node (cpuset lists, node i in order), or None when there
    are fewer cores than nodes and they must share them all. Cores left over stay free."""
    if nodes < 1 or len(cpus) < nodes:
        return None
    k = len(cpus) // nodes
    return [",".join(str(c) for c in cpus[i * k:(i + 1) * k]) for i in range(nodes)]


def pin_cpus(names: list[str], cpus: list[int]) -> list[str] | None:
    """Apply cpu_plan to the running nodes (cgroup cpuset, live: no restart); without a
    plan every node gets every core back. Applied on every `up`, so it follows the
    cluster's size and survives a restart. Returns the plan."""
    plan = cpu_plan(cpus, len(names))
    everything = ",".join(map(str, cpus))
    for i, name in enumerate(names):
        if node_state(name) == "RUNNING":
            sh("lxc-cgroup", "-n", name, "cpuset.cpus", plan[i] if plan else everything)
    return plan
