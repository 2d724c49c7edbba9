"""OpenStack preflight: what the spec needs, checked through openstacksdk before Terraform.

Every check reads; nothing is created. The session (credentials, errors as one line) is
session.py; the quota arithmetic, quota.py; this module looks up
the flavor, image, networks, key pair and the cluster's own servers, and decides.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import PreflightError
from ...nodes import node_names
from .observe import carrying, named_servers, others_of_the_name
from .quota import (
    _quota_message,
    _quotas,
    fit,
    gpu_attachment,
    gpus_from_extra_specs,
    needs,
    net_of,
    own_usage,
)
from .session import client_config_env, cloud_errors, connect, quiet_sdk_logs

if TYPE_CHECKING:
    from ...spec import ClusterSpec, OpenStackSpec


# ---- the cloud -----------------------------------------------------------------------------


def with_baked_image(spec: ClusterSpec) -> OpenStackSpec:
    """The openstack settings with the spec's baked image (`image:`, Glance) in place of
    openstack.image: the nodes boot from it, and the preflight checks it as any image."""
    o = spec.openstack
    return o.model_copy(update={"image": spec.image}) if spec.image else o


@dataclass(frozen=True)
class PreflightResult:
    cloud: str | None
    project_id: str
    flavor: str
    vcpus: int
    ram_mb: int
    flavor_gpus: int
    gpus_per_node: int
    image_id: str
    existing_nodes: list[str]
    warnings: list[str]
    # What the names resolved to, for terraform/openstack: it looks a name up again
    # (and cannot tell a name from an ID, or pick among duplicates), an ID it takes as is.
    flavor_id: str = ""
    external_network_id: str = ""
    network_id: str | None = None
    # Who may SSH to the master when the spec does not say: this machine's public address.
    admin_cidr_from: str | None = None
    # A flavor change: the nodes (all named by --replace) that run another flavor, and which.
    reflavored: dict[str, str] = field(default_factory=dict)
    # Hypervisors up and enabled, counted for a spread; None: not counted, or this user may not.
    hosts: int | None = None


def _names(items: Any, limit: int = 10) -> str:
    names = sorted({getattr(i, "name", "") or getattr(i, "id", "?") for i in items})
    more = f", … ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more if names else "none"


def controller_address(conn: Any) -> ipaddress.IPv4Address | None:
    """This machine's address on the way to the cloud's identity endpoint: the source the
    kernel picks for it (a UDP connect sends nothing). Public: the cloud sees this
    machine by it. Private: a NAT is between, and only the user knows the address."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(conn.config.get_auth_args().get("auth_url") or "")
    if not url.hostname:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((url.hostname, url.port or (443 if url.scheme == "https" else 80)))
            return ipaddress.IPv4Address(s.getsockname()[0])
    except OSError:
        return None


ROUTER_INTERFACES = ("network:router_interface", "network:router_interface_distributed", "network:ha_router_replicated_interface")


def routed_to(conn: Any, network_id: str, external_id: str) -> bool | None:
    """Whether a router with an interface on the network has its gateway on the external
    network; None when a router is there that this user may not read (another project's)."""
    import openstack

    routers = {p.device_id for p in conn.network.ports(network_id=network_id) if p.device_owner in ROUTER_INTERFACES and p.device_id}
    hidden = False
    for router_id in routers:
        try:
            router = conn.network.get_router(router_id)
        except openstack.exceptions.NotFoundException:  # Neutron's answer for another project's router
            hidden = True
            continue
        if (router.external_gateway_info or {}).get("network_id") == external_id:
            return True
    return None if hidden else False


def port_security_off(net: Any) -> bool:
    """Whether Neutron says the network has port security disabled. Only its own word
    counts: openstacksdk defaults is_port_security_enabled to False when the answer has no
    such key (a cloud without the port_security extension, where groups work)."""
    said = getattr(getattr(net, "_body", None), "attributes", {}).get("port_security_enabled")
    return said is False


def other_flavor(server: Any, flavor: Any) -> str | None:
    """The flavor `server` runs when it is not `flavor` (its name, or its ID where the
    cloud gives only that); None when it is, or when the server record does not say.
    Nova embeds the flavor in a server from microversion 2.47 (original_name, no ID);
    before, the server names the flavor's ID only."""
    f = server.flavor
    if f is None:
        return None

    def of(key: str) -> Any:
        return f.get(key) if isinstance(f, dict) else getattr(f, key, None)

    if name := of("original_name") or (isinstance(f, dict) and f.get("name")):
        return None if name == flavor.name else str(name)
    if flavor_id := of("id"):
        return None if flavor_id == flavor.id else str(flavor_id)
    return None


# An OpenStack ID (what the module takes as *_id rather than looking up by name).
UUID = re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$")


def find_image(conn: Any, ref: str) -> Any:
    """The image by ID, else by name; of several with that name the newest, as
    terraform/openstack's look-up (most_recent) picks it. Active ones first."""
    if UUID.match(ref):
        image = conn.image.find_image(ref, ignore_missing=True)
        if image is not None:
            return image
    named = list(conn.image.images(name=ref))
    if not named:
        return None
    active = [i for i in named if (i.status or "active") == "active"]
    return max(active or named, key=lambda i: i.created_at or "")


def check(spec: ClusterSpec, *, cluster_exists: bool = False, cluster_id: str | None = None,
          replacing: Collection[str] = ()) -> PreflightResult:
    """Every check; raises on the first category of problems, collecting within it.

    `cluster_exists`: Terraform's state records resources of this cluster (its network,
    volume, groups and floating IP exist, so they need no quota again). `cluster_id`: the
    id this state dir gave the cluster (None: it has made nothing yet); a deployer cluster
    of the same name with another id is someone else's, and refused. `replacing`: the
    nodes this run makes anew (--replace), which may change flavor."""
    client_config_env(spec.openstack.cloud)  # an unreadable clouds.yaml: one line, before any call
    with quiet_sdk_logs():
        conn, project_id = connect(spec.openstack.cloud)
        try:
            return _check(conn, project_id, spec, cluster_exists, cluster_id, replacing)
        finally:
            with contextlib.suppress(Exception):
                conn.close()


def _check(conn: Any, project_id: str, spec: ClusterSpec, cluster_exists: bool, cluster_id: str | None,
           replacing: Collection[str] = ()) -> PreflightResult:
    # The spec's own settings: what the preflight fills in (admin_cidr, gpu_virtualization)
    # is written into them, and tfvars reads them. Only the image is the bake's where one stands in.
    o = spec.openstack
    image_ref = with_baked_image(spec).image
    problems: list[str] = []
    warnings: list[str] = []

    if o.auto_teardown:
        from .appcred import login_restriction

        why = login_restriction(conn)
        if why:
            problems.append(f"openstack.auto_teardown: {why}; log in with a password in clouds.yaml (or an unrestricted "
                            f"application credential), or set auto_teardown: false")

    admin_cidr_from = None
    if o.admin_cidr is None:
        address = controller_address(conn)
        if address is not None and address.is_global:
            o.admin_cidr = ipaddress.IPv4Network(f"{address}/32")
            admin_cidr_from = str(address)
        else:
            problems.append(
                f"openstack.admin_cidr is not set and this machine's address toward the cloud ({address or 'unknown'}) is not a "
                f"public one (NAT): set openstack.admin_cidr to the addresses you SSH from, e.g. `admin_cidr: 203.0.113.7/32` "
                f"(`curl -s https://ifconfig.me` shows yours)")
    elif o.admin_cidr.prefixlen == 0:
        warnings.append(f"openstack.admin_cidr {o.admin_cidr}: SSH to the master is open to the whole internet; narrow it "
                        f"to the addresses you SSH from")
    m = spec.monitoring
    if m.enabled and m.expose and not m.grafana:
        # Here, not in the spec model: a recorded spec from before must still read (down).
        problems.append("monitoring.expose opens Grafana only (Prometheus never leaves the cluster network): with "
                        "monitoring.grafana false there is nothing to expose; turn expose off and use `deployer dashboard`")
    if spec.exposed_to_world():
        warnings.append("monitoring.allowed_cidrs has 0.0.0.0/0: Grafana is open to the whole internet, behind its login "
                        "and TLS; narrow it, or use `deployer dashboard` (SSH tunnel) with expose off")

    with cloud_errors(conn, f"looking up flavor {o.flavor!r}"):
        flavor = conn.compute.find_flavor(o.flavor, ignore_missing=True, get_extra_specs=True)
        if flavor is None:
            problems.append(f"flavor {o.flavor!r} not found; set openstack.flavor to one of: {_names(conn.compute.flavors())}")
        elif flavor.is_disabled:
            problems.append(f"flavor {o.flavor!r} is disabled; choose another openstack.flavor")

    with cloud_errors(conn, f"looking up image {image_ref!r}"):
        image = find_image(conn, image_ref)
        if image is None:
            problems.append(f"image {image_ref!r} not found (by name or ID); set openstack.image to one from `openstack image list`")
        elif (image.status or "active") != "active":
            problems.append(f"image {image_ref!r} is {image.status}, not active; choose another openstack.image")
        elif flavor is not None:
            min_disk = int(image.min_disk or 0)
            if o.root_volume_size:
                if min_disk > o.root_volume_size:
                    problems.append(
                        f"image {image_ref!r} needs a {min_disk} GB root disk; set openstack.root_volume_size to {min_disk} or more"
                    )
            elif not flavor.disk:
                problems.append(
                    f"flavor {o.flavor!r} has no root disk (0 GB): boot from a volume with openstack.root_volume_size "
                    f"(e.g. {max(min_disk, 50)})"
                )
            elif min_disk > flavor.disk:
                problems.append(
                    f"image {image_ref!r} needs a {min_disk} GB root disk, flavor {o.flavor!r} has {flavor.disk} GB; "
                    f"set openstack.root_volume_size: {max(min_disk, 50)} to boot from a volume, or choose a larger flavor"
                )
            if image.min_ram and int(image.min_ram) > flavor.ram:
                problems.append(f"image {image_ref!r} needs {image.min_ram} MB RAM, flavor {o.flavor!r} has {flavor.ram} MB")

    with cloud_errors(conn, f"looking up external network {o.external_network!r}"):
        ext = conn.network.find_network(o.external_network, ignore_missing=True)
        if ext is None or not ext.is_router_external:
            externals = _names(conn.network.networks(is_router_external=True))
            state = "not found" if ext is None else "is not an external network"
            problems.append(f"external network {o.external_network!r} {state}; set openstack.external_network to one of: {externals}")

    net = None
    if o.network is None:
        room = o.network_cidr.num_addresses - 4  # network, broadcast, gateway (router), DHCP port
        if spec.nodes > room:
            problems.append(
                f"openstack.network_cidr {o.network_cidr} has room for {max(0, room)} nodes, not {spec.nodes}; "
                f"use a larger subnet such as 192.168.77.0/24"
            )
    else:
        with cloud_errors(conn, f"looking up network {o.network!r}"):
            net = conn.network.find_network(o.network, ignore_missing=True)
            if net is None:
                problems.append(
                    f"network {o.network!r} not found; set openstack.network to an existing network of the project, "
                    f"or remove it to create a dedicated one"
                )
            elif port_security_off(net):
                # Neutron refuses a security group on a port of such a network ("Port
                # security must be enabled ... in order to use security groups"), and every
                # node's port carries the cluster's: Terraform would fail on the first port.
                problems.append(
                    f"network {o.network!r} has port security disabled, so Neutron refuses the security groups every "
                    f"node's port carries; enable it (openstack network set --enable-port-security {o.network}) or "
                    f"remove openstack.network to create a dedicated one"
                )
            else:
                subnets = list(conn.network.subnets(network_id=net.id, ip_version=4))
                if len(subnets) != 1:
                    problems.append(
                        f"network {o.network!r} has {len(subnets)} IPv4 subnets, the deployer needs exactly one; "
                        f"pick another openstack.network or remove it to create a dedicated one"
                    )
                elif ext is not None and ext.is_router_external:
                    routed = routed_to(conn, net.id, ext.id)
                    if routed is False and net.project_id == project_id:
                        problems.append(
                            f"network {o.network!r} has no router to external network {o.external_network!r}, so the master's "
                            f"floating IP cannot reach it; add one (openstack router set --external-gateway {o.external_network} R; "
                            f"openstack router add subnet R {subnets[0].name or subnets[0].id}) or remove openstack.network"
                        )
                    elif not routed:
                        # A network shared by another project: its router is that project's,
                        # and Neutron shows a member neither the router nor its ports.
                        warnings.append(
                            f"network {o.network!r} belongs to another project, whose router this user cannot see: assuming "
                            f"it reaches {o.external_network!r}; if the master's floating IP cannot be associated, ask the "
                            f"network's owners for a router to {o.external_network!r}"
                        )

    if o.key_pair:
        with cloud_errors(conn, f"looking up key pair {o.key_pair!r}"):
            if conn.compute.find_keypair(o.key_pair, ignore_missing=True) is None:
                problems.append(
                    f"key pair {o.key_pair!r} not found; set openstack.key_pair to one of: {_names(conn.compute.keypairs())}, "
                    f"or remove it to upload the cluster key"
                )

    with cloud_errors(conn, "listing the cluster's servers"):
        named = named_servers(conn, spec.name)  # one listing for both questions
        others = others_of_the_name(conn, spec.name, cluster_id, named)
        own = carrying(named, cluster_id)
    if others:
        # Checked first and alone: every other finding would be about a cluster this run must not touch.
        theirs = "; ".join(f"id {their_id}: {', '.join(what[:3])}{', …' if len(what) > 3 else ''}"
                           for their_id, what in others.items())
        raise PreflightError(
            f"cluster name {spec.name!r} is in use in this OpenStack project by another deployer cluster ({theirs}), "
            f"not made from this state dir: pick another --name, or run `deployer down` where it was made")
    existing = sorted(s.name for s in own)
    fresh = not (cluster_exists or own)
    reflavored: dict[str, str] = {}
    if flavor is not None:
        kept = set(node_names(spec.name, spec.nodes))  # a node scaled in away needs no new flavor
        reflavored = {s.name: was for s in own if s.name in kept and (was := other_flavor(s, flavor)) is not None}
        resized = sorted(n for n in reflavored if n not in replacing)
        if resized:
            # Raised alone: nothing else matters while the answer is "not this way".
            was = ", ".join(sorted(set(reflavored.values())))
            raise PreflightError(
                f"flavor {o.flavor!r} is not the flavor of running node(s) {', '.join(resized)} ({was}), and a node is "
                f"never resized in place (a GPU VM under a running job): make them anew with it, `deployer up "
                f"{' '.join('--replace ' + n for n in sorted(reflavored))}` (what is on their disks is lost; the shared "
                f"volume is kept), or make a new cluster with it (another --name, or `deployer down` first), or set "
                f"openstack.flavor back to {was}")

    if o.floating_ip:
        with cloud_errors(conn, f"looking up floating IP {o.floating_ip}"):
            ips = list(conn.network.ips(floating_ip_address=o.floating_ip))
            if not ips:
                problems.append(
                    f"floating IP {o.floating_ip} is not allocated to this project; allocate it "
                    f"(openstack floating ip create {o.external_network}) or remove openstack.floating_ip"
                )
            else:
                fip = ips[0]
                if ext is not None and fip.floating_network_id and fip.floating_network_id != ext.id:
                    problems.append(
                        f"floating IP {o.floating_ip} belongs to another external network than {o.external_network!r}; "
                        f"set openstack.external_network to its network"
                    )
                if fip.port_id and fresh:
                    problems.append(
                        f"floating IP {o.floating_ip} is associated with another port; disassociate it or remove openstack.floating_ip"
                    )

    hosts: int | None = None
    if o.server_group_policy in ("anti-affinity", "soft-anti-affinity"):
        from .placement import count_hosts, hosts_problem

        # Soft too: `up` evens out a soft spread (lifecycle.spread_out) up to this many
        # hosts; a user who may not count them learns it from where a node made anew lands.
        with cloud_errors(conn, "counting the cloud's hypervisors"):
            hosts = count_hosts(conn)
        problem = hosts_problem(hosts, spec.nodes, o.server_group_policy)
        if problem:
            problems.append(problem)
        elif hosts is None and o.server_group_policy == "anti-affinity":
            warnings.append("openstack.placement_hard: this user may not list the cloud's hypervisors, so whether each node "
                            "can have one of its own is not known before Nova tries (a node it cannot place fails to build)")

    if problems:
        extra = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        raise PreflightError(problems[0] + extra)

    flavor_gpus = gpus_from_extra_specs(flavor.extra_specs)
    attached = gpu_attachment(flavor.extra_specs)
    if o.enable_gpu and attached:
        # The flavor is the hypervisor's own word on how the GPUs come: recorded in the spec
        # for the driver role, which otherwise cannot tell a whole GPU from a vGPU before a driver.
        if o.gpu_virtualization == "auto":
            o.gpu_virtualization = attached
        elif o.gpu_virtualization != attached:
            warnings.append(f"openstack.gpu_virtualization is {o.gpu_virtualization} but flavor {o.flavor!r} asks for "
                            f"{'a vGPU (resources:VGPU)' if attached == 'vgpu' else 'whole GPUs'}: the spec's word is taken")
    if o.enable_gpu and flavor_gpus == 0:
        gpus = 1
        warnings.append(
            f"openstack.enable_gpu is set but flavor {o.flavor!r} asks for no GPU in its extra specs "
            f"(pci_passthrough:alias, resources:VGPU/PGPU); assuming 1 GPU per node — choose a GPU flavor if that is wrong"
        )
    elif o.enable_gpu:
        gpus = flavor_gpus
    else:
        gpus = 0
        if flavor_gpus:
            warnings.append(
                f"flavor {o.flavor!r} has {flavor_gpus} GPU(s) per node but openstack.enable_gpu is false: "
                f"no driver is installed and training runs on CPUs; set enable_gpu: true to use them"
            )
    if flavor.disk and flavor.disk < 40 and o.enable_gpu and not o.root_volume_size:
        warnings.append(
            f"flavor {o.flavor!r} has a {flavor.disk} GB root disk: the NVIDIA driver, CUDA and torch take 15-25 GB; "
            f"consider openstack.root_volume_size: 100"
        )

    # The quotas' usage, net of this cluster's own servers; then the whole cluster must
    # fit. Right for a first run, a resumed one, a scale-out and a scale-in alike.
    new_nodes = max(0, spec.nodes - len(existing))
    want = needs(spec, flavor.vcpus, flavor.ram, fresh=fresh)
    quotas = net_of(_quotas(conn, project_id, warnings), own_usage(own, flavor, o.root_volume_size))
    result = fit(quotas, want, spec.nodes)
    if not result.ok:
        raise PreflightError(_quota_message(spec, flavor.name, existing, new_nodes, result))

    return PreflightResult(
        cloud=spec.openstack.cloud or os.environ.get("OS_CLOUD"),
        project_id=project_id,
        flavor=flavor.name,
        vcpus=flavor.vcpus,
        ram_mb=flavor.ram,
        flavor_gpus=flavor_gpus,
        gpus_per_node=gpus,
        image_id=image.id,
        existing_nodes=existing,
        warnings=warnings,
        hosts=hosts,
        flavor_id=flavor.id,
        external_network_id=ext.id,
        network_id=net.id if net is not None else None,
        admin_cidr_from=admin_cidr_from,
        reflavored=reflavored,
    )


