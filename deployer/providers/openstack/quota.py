"""Quota arithmetic for the OpenStack preflight: what the spec needs, what the project has
left (the cluster's own servers counted as already used on a re-run), and whether it fits.

Pure functions, unit-tested without a cloud, but `_quotas`, which reads the three
services' quota APIs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .session import cloud_errors

if TYPE_CHECKING:
    from ...spec import ClusterSpec

MONITORING_PORTS = 1  # Grafana 3000; Prometheus is never exposed (terraform/openstack: monitoring_ports)
GPU_RESOURCE = re.compile(r"^resources[A-Za-z0-9_-]*:(VGPU|PGPU|CUSTOM_[A-Z0-9_]*GPU[A-Z0-9_]*)$")


def gpus_from_extra_specs(extra_specs: Mapping[str, Any] | None) -> int:
    """GPUs per instance that a flavor asks for.

    Nova flavors get GPUs in two ways: PCI pass-through, `pci_passthrough:alias` =
    "alias:count[, alias:count]" (aliases are the cloud's own names, e.g. V100:1), and
    placement resources, `resources[group]:VGPU` / `:PGPU` (the standard classes of
    os-resource-classes) or a custom class with GPU in its name. Every PCI alias is
    counted: a flavor that passes through a NIC as well over-counts.
    """
    if not extra_specs:
        return 0
    pci = 0
    alias = str(extra_specs.get("pci_passthrough:alias") or "")
    for part in alias.split(","):
        name, _, count = part.strip().partition(":")
        if name:
            pci += int(count) if count.strip().isdigit() else 1
    placement = 0
    for key, value in extra_specs.items():
        if GPU_RESOURCE.match(str(key)) and str(value).strip().isdigit():
            placement += int(str(value).strip())
    return max(pci, placement)


def gpu_attachment(extra_specs: Mapping[str, Any] | None) -> Literal["passthrough", "vgpu"] | None:
    """How a flavor attaches its GPUs, as Nova schedules them: `resources:VGPU` is a vGPU
    (a mediated device), `pci_passthrough:alias` or `resources:PGPU` a whole GPU; None
    when the flavor says neither (a custom resource class can be either)."""
    specs = {str(k): str(v) for k, v in (extra_specs or {}).items()}
    if any(re.match(r"^resources[^:]*:VGPU$", k) and v.strip() not in ("", "0") for k, v in specs.items()):
        return "vgpu"
    if specs.get("pci_passthrough:alias") or any(re.match(r"^resources[^:]*:PGPU$", k) and v.strip() not in ("", "0")
                                                 for k, v in specs.items()):
        return "passthrough"
    return None


@dataclass(frozen=True)
class Quota:
    """One quota of the project: limit < 0 means unlimited."""

    label: str
    limit: int
    used: int
    reserved: int = 0

    @property
    def free(self) -> int | None:
        if self.limit is None or self.limit < 0:
            return None
        return max(0, self.limit - self.used - self.reserved)


@dataclass(frozen=True)
class Needs:
    """What the spec asks of the quotas: per new node, and once for a new cluster."""

    per_node: dict[str, int]
    fixed: dict[str, int]


def needs(spec: ClusterSpec, vcpus: int, ram_mb: int, *, fresh: bool) -> Needs:
    """Resources terraform/openstack creates (keep in step with its .tf files)."""
    o = spec.openstack
    create_network = o.network is None
    per_node = {"instances": 1, "cores": vcpus, "ram": ram_mb, "ports": 1}
    if o.root_volume_size:  # boot from a volume: one more volume per node
        per_node |= {"volumes": 1, "gigabytes": o.root_volume_size}
    if o.server_group_policy:  # every node joins the cluster's server group (compute.tf)
        per_node["server_group_members"] = 1
    if not fresh:  # the cluster's network, groups, volume and floating IP exist already
        return Needs(per_node, {})
    m = spec.monitoring
    exposed = MONITORING_PORTS * len(m.allowed_cidrs) if (m.enabled and m.expose) else 0
    fixed = {
        "volumes": 1,
        "gigabytes": o.volume_size,
        "floating_ips": 0 if o.floating_ip else 1,
        "security_groups": 2,
        # <name>-cluster: IPv4+IPv6 from the group; <name>-master: SSH + exposed ports;
        # Neutron adds two default egress rules to each group.
        "security_group_rules": 2 + 1 + exposed + 2 * 2,
        "networks": 1 if create_network else 0,
        "subnets": 1 if create_network else 0,
        "routers": 1 if create_network else 0,
        "ports": 2 if create_network else 0,  # router interface + DHCP
        "server_groups": 1 if o.server_group_policy else 0,
    }
    return Needs(per_node, {k: v for k, v in fixed.items() if v})


@dataclass
class Fit:
    ok: bool
    largest_new: int | None  # None: no per-node quota binds
    short_per_node: list[str] = field(default_factory=list)
    short_fixed: list[str] = field(default_factory=list)


def fit(quotas: Mapping[str, Quota], want: Needs, new_nodes: int) -> Fit:
    """Whether `new_nodes` more nodes fit the quotas, and the most that would.

    Quotas a per-node resource shares with a one-off need (ports: one per node plus
    the router's and DHCP's) count the one-off part first.
    """
    largest: int | None = None
    short_fixed: list[str] = []
    short_per_node: list[str] = []
    for key, amount in want.fixed.items():
        q = quotas.get(key)
        if key in want.per_node or q is None or q.free is None:
            continue
        if amount > q.free:
            short_fixed.append(f"{q.label}: need {_amount(key, amount)}, {_amount(key, q.free)} free of {_amount(key, q.limit)}")
    for key, per in want.per_node.items():
        q = quotas.get(key)
        if q is None or q.free is None or per <= 0:
            continue
        once = want.fixed.get(key, 0)
        n = max(0, (q.free - once) // per)
        largest = n if largest is None else min(largest, n)
        need = per * new_nodes + once
        if need > q.free:
            short_per_node.append(f"{q.label}: need {_amount(key, need)}, {_amount(key, q.free)} free of {_amount(key, q.limit)}")
    return Fit(not short_fixed and not short_per_node, largest, short_per_node, short_fixed)


def _amount(key: str, value: int) -> str:
    if key == "ram":
        return f"{value / 1024:g} GiB"
    return str(value)


def own_usage(own: list[Any], flavor: Any, root_volume_size: int | None) -> dict[str, int]:
    """What the cluster's own servers take of the quotas (the flavor embedded in the
    server record when the cloud gives it, else the spec's flavor)."""
    def of(server: Any, key: str, default: int) -> int:
        f = server.flavor
        value = f.get(key) if isinstance(f, dict) else getattr(f, key, None)
        return int(value) if value else default

    usage = {
        "instances": len(own),
        "cores": sum(of(s, "vcpus", flavor.vcpus) for s in own),
        "ram": sum(of(s, "ram", flavor.ram) for s in own),
        "ports": len(own),
    }
    if root_volume_size:
        usage |= {"volumes": len(own), "gigabytes": root_volume_size * len(own)}
    return usage


def net_of(quotas: dict[str, Quota], usage: Mapping[str, int]) -> dict[str, Quota]:
    """`quotas` with `usage` taken out of what is used."""
    out = dict(quotas)
    for key, amount in usage.items():
        q = quotas.get(key)
        if q is not None:
            out[key] = Quota(q.label, q.limit, max(0, q.used - amount), q.reserved)
    return out


def _quota_message(spec: ClusterSpec, flavor: str, existing: list[str], new_nodes: int, r: Fit) -> str:
    if r.short_fixed:
        return (
            f"project quota too small for the cluster's shared resources: {'; '.join(r.short_fixed)}; "
            f"free some (or lower openstack.volume_size) or ask the cloud's admins to raise the quota"
        )
    total = r.largest_new or 0
    grown = f" ({len(existing)} exist, {new_nodes} to add)" if existing else ""
    if total < 1:
        return (
            f"project quota too small for even one node of {flavor}: {'; '.join(r.short_per_node)}; "
            f"choose a smaller openstack.flavor or ask the cloud's admins to raise the quota"
        )
    # Nova's default is 10 members a server group: a larger cluster can do without one.
    grouped = any(s.startswith("server group members") for s in r.short_per_node)
    return (
        f"project quota too small for {spec.nodes} nodes of {flavor}{grown}: {'; '.join(r.short_per_node)}; "
        f"the largest cluster that fits is {total} nodes: run with --nodes {total}, "
        + ("or set openstack.placement: any (no server group), " if grouped else "")
        + "or ask the cloud's admins for more quota"
    )


def _quotas(conn: Any, project_id: str, warnings: list[str]) -> dict[str, Quota]:
    """The project's quotas and usage; a service that refuses to say (403) is skipped with a warning."""
    import openstack

    quotas: dict[str, Quota] = {}

    def forbidden(service: str) -> None:
        warnings.append(f"the cloud does not let this user read its {service} quotas; that part of the check was skipped")

    with cloud_errors(conn, "reading compute limits"):
        try:
            a = conn.compute.get_limits().absolute
            quotas["instances"] = Quota("instances", _int(a.instances), _int(a.instances_used))
            quotas["cores"] = Quota("vCPUs (cores)", _int(a.total_cores), _int(a.total_cores_used))
            quotas["ram"] = Quota("RAM", _int(a.total_ram), _int(a.total_ram_used))
            quotas["server_groups"] = Quota("server groups", _int(a.server_groups), _int(a.server_groups_used))
            # A limit per group (Nova counts each group's members), and the cluster's group is
            # its own: none used of it (its own members are what the cluster asks for anyway).
            quotas["server_group_members"] = Quota("server group members", _int(a.server_group_members), 0)
        except openstack.exceptions.ForbiddenException:
            forbidden("compute")

    with cloud_errors(conn, "reading network quotas"):
        try:
            q = conn.network.get_quota(project_id, details=True)
            for key, attr, label in (
                ("floating_ips", "floating_ips", "floating IPs"),
                ("security_groups", "security_groups", "security groups"),
                ("security_group_rules", "security_group_rules", "security group rules"),
                ("networks", "networks", "networks"),
                ("subnets", "subnets", "subnets"),
                ("routers", "routers", "routers"),
                ("ports", "ports", "ports"),
            ):
                d = getattr(q, attr, None) or {}
                if isinstance(d, dict) and "limit" in d:
                    quotas[key] = Quota(label, _int(d.get("limit")), _int(d.get("used")), _int(d.get("reserved")))
        except openstack.exceptions.ForbiddenException:
            forbidden("network")

    with cloud_errors(conn, "reading block storage limits"):
        try:
            a = conn.block_storage.get_limits().absolute
            quotas["volumes"] = Quota("volumes", _int(a.max_total_volumes), _int(a.total_volumes_used))
            quotas["gigabytes"] = Quota("volume gigabytes", _int(a.max_total_volume_gigabytes), _int(a.total_gigabytes_used))
        except openstack.exceptions.ForbiddenException:
            forbidden("block storage")
    return quotas


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0 if v is None else -1
