"""The `cluster` output, typed: what Terraform says the cluster is, parsed once.

Both Terraform modules end in one output of this shape (docs/architecture.md, "The
`cluster` output contract"); the state dir keeps it as cluster.json and every verb reads
it through `ClusterState.cluster()`, which returns a `Cluster`. Nothing else indexes the
output: the master is `cluster.master`, never "the first node".

Free of third-party imports, so `status` and `ssh` stay fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from .errors import OperationFailed, UsageError

Role = Literal["master", "worker"]
Access = Literal["direct", "via_master"]
SharedStorage = Literal["nfs", "host_bind"]


class ClusterOutputError(OperationFailed):
    """The output lacks a field or has one of the wrong type: a module and this reader disagree."""


@dataclass(frozen=True)
class Node:
    name: str
    role: Role
    private_ip: str
    public_ip: str | None = None
    gpus: int = 0
    id: str | None = None  # the server's (OpenStack) or the container's instance id (local)
    # Where the node runs, as the provider's observation said after Terraform (placement):
    # host names the hypervisor (its name where the user may see it, else Nova's hostId;
    # locally this machine), host_id is Nova's hostId, zone the availability zone.
    # None: not known (a record from before placement was read).
    host: str | None = None
    host_id: str | None = None
    zone: str | None = None

    @property
    def is_master(self) -> bool:
        return self.role == "master"

    @property
    def slots(self) -> int:
        """MPI slots: one rank per GPU, one on a CPU node (the hostfile's rule)."""
        return self.gpus or 1

    @property
    def address(self) -> str:
        """Where this machine reaches the node when it reaches it directly."""
        return self.public_ip or self.private_ip


@dataclass(frozen=True)
class Cluster:
    name: str
    provider: str
    ssh_user: str
    shared_dir: str
    nodes: tuple[Node, ...]
    access: Access = "direct"
    shared_storage: SharedStorage = "host_bind"
    cluster_cidr: str | None = None
    shared_device: str | None = None  # OpenStack: the master's block device for the shared volume
    # Set when the nodes share fewer host cores than there are nodes (local provider).
    shared_cpus: int | None = None
    host_package_sources: bool = False
    grafana_installable: bool = True
    machine: Mapping[str, Any] = field(default_factory=dict)  # image and flavor, for the benchmark record

    # -- the nodes ------------------------------------------------------------
    @property
    def master(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[Node, ...]:
        return self.nodes[1:]

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def has_gpus(self) -> bool:
        """GPU nodes in the cluster: the benchmarks then run on CUDA with NCCL, else on CPUs with gloo."""
        return any(n.gpus > 0 for n in self.nodes)

    def find(self, name: str | None) -> Node:
        """A node by full name, short name (worker-1) or cluster address; none: the master."""
        if not name:
            return self.master
        for node in self.nodes:
            if name in (node.name, node.name.removeprefix(self.name + "-"), node.private_ip):
                return node
        raise UsageError(f"no node {name!r} in cluster {self.name!r}; pick one of: {', '.join(self.names)}")

    @property
    def by_host(self) -> tuple[Node, ...]:
        """The nodes with those on one host next to each other: the master's host first (the
        master first in it), then each host in the order its first node comes; the MPI
        hostfile's order, so neighbouring ranks share a host and a run on the first n nodes
        spans as few hosts as the placement allows. Nodes of no known host are one group.
        With no host known (an old record) it is the nodes' own order."""
        return tuple(node for group in self.host_groups().values() for node in group)

    def host_groups(self) -> dict[str | None, list[Node]]:
        """Host -> its nodes, the master's host first, each host's nodes in the nodes' own
        order (by_host's order); None: not known."""
        groups: dict[str | None, list[Node]] = {}
        for node in self.nodes:
            groups.setdefault(node.host, []).append(node)
        return groups

    def hosts_of(self, n: int) -> int | None:
        """How many hosts a run on the first n nodes (by_host) spans; None: a node's host is not known."""
        nodes = self.by_host[:n]
        if any(node.host is None for node in nodes):
            return None
        return len({node.host for node in nodes})

    def same_host(self, a: str, b: str) -> bool | None:
        """Whether nodes `a` and `b` (names) run on one host; None: a host not known."""
        hosts = {node.name: node.host for node in self.nodes}
        ha, hb = hosts.get(a), hosts.get(b)
        return None if ha is None or hb is None else ha == hb

    def placed(self, where: Mapping[str, tuple[str | None, str | None, str | None]]) -> Cluster:
        """This cluster with each node's (host, host_id, zone) from `where` (by node name);
        a node `where` says nothing of keeps what it had."""
        def moved(node: Node) -> Node:
            host, host_id, zone = where.get(node.name, (None, None, None))
            if host is None and host_id is None and zone is None:
                return node
            return replace(node, host=host, host_id=host_id, zone=zone)

        return replace(self, nodes=tuple(moved(n) for n in self.nodes))

    def rank_nodes(self, n: int) -> list[Node]:
        """Rank -> node for a run on the first n nodes of the hostfile (by_host; --map-by
        slot: a node's slots in a row); its length is the run's rank count."""
        return [node for node in self.by_host[:n] for _ in range(node.slots)]

    # -- the record -----------------------------------------------------------
    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Cluster:
        """From the Terraform output (or cluster.json); one error naming what is wrong."""
        try:
            nodes = tuple(
                Node(name=str(n["name"]), role=_one_of(n["role"], ("master", "worker"), "role"),
                     private_ip=str(n["private_ip"]), public_ip=n.get("public_ip") or None,
                     gpus=int(n.get("gpus") or 0), id=n.get("id"), host=n.get("host") or None,
                     host_id=n.get("host_id") or None, zone=n.get("zone") or None)
                for n in data["nodes"]
            )
            if not nodes or not nodes[0].is_master or any(n.is_master for n in nodes[1:]):
                raise ClusterOutputError("the first node, and only it, must be the master")
            cpus = data.get("shared_cpus")
            return cls(
                name=str(data["name"]), provider=str(data["provider"]), ssh_user=str(data["ssh_user"]),
                shared_dir=str(data["shared_dir"]), nodes=nodes,
                access=_one_of(data.get("access") or "direct", ("direct", "via_master"), "access"),
                shared_storage=_one_of(data.get("shared_storage") or "host_bind", ("nfs", "host_bind"), "shared_storage"),
                cluster_cidr=data.get("cluster_cidr"), shared_device=data.get("shared_device") or None,
                shared_cpus=int(cpus) if cpus is not None else None,
                host_package_sources=bool(data.get("host_package_sources", False)),
                grafana_installable=bool(data.get("grafana_installable", True)),
                machine=dict(data.get("machine") or {}),
            )
        except KeyError as e:
            raise ClusterOutputError(f"the cluster output has no {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ClusterOutputError(f"the cluster output is malformed: {e}") from None

    def to_output(self) -> dict[str, Any]:
        """The output's own shape again (cluster.json, `deployer status --json`)."""
        out = asdict(self)
        out["nodes"] = [asdict(n) for n in self.nodes]
        out["machine"] = dict(self.machine)
        return out


def _one_of(value: Any, allowed: tuple[str, ...], what: str) -> Any:
    if value not in allowed:
        raise ClusterOutputError(f"{what} is {value!r}, not one of {', '.join(allowed)}")
    return value
