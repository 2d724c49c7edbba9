"""OpenStack preflight: what the spec needs, checked through openstacksdk before Terraform.

Credentials come from clouds.yaml / OS_CLOUD (or an openrc's OS_* variables), never from
the spec. Every check reads; nothing is created. A problem the user can fix becomes one
PreflightError line naming the fix (exit 2); a cloud that fails mid-way becomes
OperationFailed (exit 1). Exception text from keystoneauth/openstacksdk is never shown
raw: it passes through `scrub`, which removes every secret of the cloud's config.

openstacksdk is imported inside the functions: importing it costs about a second and
`deployer --help` must stay fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OperationFailed, PreflightError

if TYPE_CHECKING:
    from ..spec import ClusterSpec

CLOUDS_YAML_FIX = (
    "put your cloud's entry in clouds.yaml (./clouds.yaml or ~/.config/openstack/clouds.yaml; "
    "the dashboard's API Access page downloads one) and set OS_CLOUD=<entry> or openstack.cloud in cluster.yaml"
)
API_TIMEOUT_S = 60
MONITORING_PORTS = 2  # Grafana 3000, Prometheus 9090 (terraform/openstack: monitoring_ports)
SECRET_KEYS = ("password", "application_credential_secret", "token", "secret", "passcode", "totp")
GPU_RESOURCE = re.compile(r"^resources[A-Za-z0-9_-]*:(VGPU|PGPU|CUSTOM_[A-Z0-9_]*GPU[A-Z0-9_]*)$")


# ---- pure parts (unit-tested without a cloud) -------------------------------------------


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


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with every secret and any URL user-info removed, on one line."""
    for s in sorted({s for s in secrets if s and len(s) >= 3}, key=len, reverse=True):
        text = text.replace(s, "***")
    text = re.sub(r"(\w+://)[^/@\s]+@", r"\1***@", text)
    return " ".join(text.split())


def client_config_env(cloud: str | None, cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that makes Terraform's OpenStack provider read the credentials the
    preflight read.

    openstacksdk finds ./clouds.yaml (and ./secure.yaml) in the working directory;
    Terraform runs in the state dir, where the provider would find none. So a file found
    here, or named by OS_CLIENT_CONFIG_FILE / OS_CLIENT_SECURE_FILE, is handed over by
    absolute path. Only paths and the entry's name travel, never a secret. A file that
    exists but cannot be read is refused here, before anything is created.
    """
    environ = os.environ if environ is None else environ
    cwd = cwd or Path.cwd()
    env: dict[str, str] = {}
    for var, names in (("OS_CLIENT_CONFIG_FILE", ("clouds.yaml", "clouds.yml")), ("OS_CLIENT_SECURE_FILE", ("secure.yaml", "secure.yml"))):
        given = environ.get(var)
        path = Path(given).expanduser() if given else next((cwd / n for n in names if (cwd / n).exists()), None)
        if path is None or not path.exists():  # openstacksdk skips a named file that is not there too
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            how = f"${var}" if given else "found in the working directory"
            raise PreflightError(f"{path} ({how}) cannot be read ({e.strerror}): fix its permissions or path") from None
        env[var] = str(path.resolve())
    if cloud or environ.get("OS_CLOUD"):
        env["OS_CLOUD"] = cloud or environ["OS_CLOUD"]
    return env


# ---- the cloud -----------------------------------------------------------------------------


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


def _secrets(conn: Any = None) -> list[str]:
    found = [v for k, v in os.environ.items() if k.startswith("OS_") and any(s in k.lower() for s in SECRET_KEYS)]
    if conn is not None:
        with contextlib.suppress(Exception):  # redaction must never fail the run
            auth = conn.config.config.get("auth", {}) or {}
            found += [str(v) for k, v in auth.items() if any(s in k.lower() for s in SECRET_KEYS) and v]
    return found


@contextlib.contextmanager
def quiet_sdk_logs() -> Iterator[None]:
    """keystoneauth and openstacksdk log and warn on their own (discovery fall-backs,
    deprecated response fields); the deployer's one line says it better."""
    names = ("keystoneauth", "openstack", "stevedore", "os_service_types")
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)


def connect(cloud: str | None) -> tuple[Any, str]:
    """An authenticated connection and its project id; credential problems → PreflightError."""
    import openstack
    from keystoneauth1 import exceptions as ka

    name = cloud or os.environ.get("OS_CLOUD")
    label = f"cloud {name!r}" if name else "the OS_* environment"
    conn = None
    try:
        conn = openstack.connect(cloud=cloud, api_timeout=API_TIMEOUT_S)
        conn.session.get_token()
        project_id = conn.current_project_id
    except openstack.exceptions.ConfigException:
        if name:
            raise PreflightError(
                f"OpenStack {label} is not in any clouds.yaml (./clouds.yaml, ~/.config/openstack/, /etc/openstack/ "
                f"or $OS_CLIENT_CONFIG_FILE): add it, or fix openstack.cloud / OS_CLOUD"
            ) from None
        raise PreflightError(f"no usable OpenStack configuration: {CLOUDS_YAML_FIX}") from None
    except (ka.MissingRequiredOptions, ka.MissingAuthPlugin, ka.NoMatchingPlugin):
        if name:  # no clouds.yaml at all: openstacksdk falls back to OS_* variables, which are not there either
            raise PreflightError(
                f"OpenStack {label} is not in any clouds.yaml (none found in ./, ~/.config/openstack/, /etc/openstack/ "
                f"or $OS_CLIENT_CONFIG_FILE): add it, or fix openstack.cloud / OS_CLOUD"
            ) from None
        raise PreflightError(f"no OpenStack credentials found: {CLOUDS_YAML_FIX}") from None
    except ka.Unauthorized:
        raise PreflightError(
            f"OpenStack refused the credentials of {label} (HTTP 401): check username, password, project and "
            f"domain in clouds.yaml, or use an application credential"
        ) from None
    except ka.Forbidden:
        raise PreflightError(
            f"OpenStack {label}: the user may not use that project (HTTP 403); check project_name / project_id in clouds.yaml"
        ) from None
    except (ka.DiscoveryFailure, ka.ConnectionError) as e:
        url = _auth_url(conn, cloud)
        why = "timed out" if isinstance(e, ka.ConnectTimeout) else "no Keystone answered"
        raise PreflightError(
            f"cannot reach the OpenStack identity service at {scrub(url, _secrets(conn))} ({why}): "
            f"check auth_url in clouds.yaml and your network, VPN or proxy"
        ) from None
    except ka.ClientException as e:
        raise PreflightError(
            f"OpenStack authentication failed for {label} ({type(e).__name__}: {scrub(str(e), _secrets(conn))}); check clouds.yaml"
        ) from None
    if not project_id:
        raise PreflightError(f"OpenStack {label}: the token is not scoped to a project; set project_name in clouds.yaml")
    return conn, project_id


def _auth_url(conn: Any, cloud: str | None) -> str:
    try:
        if conn is not None:
            return str(conn.config.config["auth"]["auth_url"])
        import openstack.config

        region = openstack.config.OpenStackConfig().get_one(cloud=cloud)
        return str(region.config["auth"].get("auth_url", "auth_url"))
    except Exception:  # noqa: BLE001
        return "the configured auth_url"


@contextlib.contextmanager
def cloud_errors(conn: Any, what: str) -> Iterator[None]:
    """Map what is left (the cloud failing mid-way) to OperationFailed, scrubbed."""
    import openstack
    from keystoneauth1 import exceptions as ka

    try:
        yield
    except (PreflightError, OperationFailed):
        raise
    except openstack.exceptions.DuplicateResource as e:
        raise PreflightError(f"{what}: {scrub(str(e), _secrets(conn))}; use the ID instead of the name") from None
    except (openstack.exceptions.SDKException, ka.ClientException) as e:
        code = getattr(e, "status_code", None)
        status = f" (HTTP {code})" if code else ""
        raise OperationFailed(
            f"OpenStack failed while {what}{status}: {scrub(str(e), _secrets(conn))}; try again, or check the cloud's status page"
        ) from None


def _names(items: Any, limit: int = 10) -> str:
    names = sorted({getattr(i, "name", None) or getattr(i, "id", "?") for i in items})
    more = f", … ({len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more if names else "none"


def node_name_pattern(cluster: str) -> str:
    """Nova's name filter is a regular expression; this matches terraform/modules/design."""
    return f"^{re.escape(cluster)}-(master|worker-[0-9]+)$"


ROUTER_INTERFACES = ("network:router_interface", "network:router_interface_distributed", "network:ha_router_replicated_interface")


def routed_to(conn: Any, network_id: str, external_id: str) -> bool:
    """Whether a router with an interface on the network has its gateway on the external network."""
    routers = {p.device_id for p in conn.network.ports(network_id=network_id) if p.device_owner in ROUTER_INTERFACES and p.device_id}
    for router_id in routers:
        router = conn.network.get_router(router_id)
        if (router.external_gateway_info or {}).get("network_id") == external_id:
            return True
    return False


def own_servers(conn: Any, cluster: str) -> list[Any]:
    """This cluster's servers: the name filter narrows the list, the metadata that
    terraform/openstack sets (deployer_cluster) decides; a look-alike name is not ours."""
    pattern = re.compile(node_name_pattern(cluster))
    return [
        s for s in conn.compute.servers(details=True, name=pattern.pattern)
        if pattern.match(s.name or "") and (s.metadata or {}).get("deployer_cluster") == cluster
    ]


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


def check(spec: ClusterSpec, *, cluster_exists: bool = False) -> PreflightResult:
    """Every check; raises on the first category of problems, collecting within it.

    `cluster_exists`: Terraform's state records resources of this cluster (its network,
    volume, groups and floating IP exist, so they need no quota again)."""
    client_config_env(spec.openstack.cloud)  # an unreadable clouds.yaml: one line, before any call
    with quiet_sdk_logs():
        conn, project_id = connect(spec.openstack.cloud)
        try:
            return _check(conn, project_id, spec, cluster_exists)
        finally:
            with contextlib.suppress(Exception):
                conn.close()


def _check(conn: Any, project_id: str, spec: ClusterSpec, cluster_exists: bool) -> PreflightResult:
    o = spec.openstack
    problems: list[str] = []
    warnings: list[str] = []

    with cloud_errors(conn, f"looking up flavor {o.flavor!r}"):
        flavor = conn.compute.find_flavor(o.flavor, ignore_missing=True, get_extra_specs=True)
        if flavor is None:
            problems.append(f"flavor {o.flavor!r} not found; set openstack.flavor to one of: {_names(conn.compute.flavors())}")
        elif flavor.is_disabled:
            problems.append(f"flavor {o.flavor!r} is disabled; choose another openstack.flavor")

    with cloud_errors(conn, f"looking up image {o.image!r}"):
        image = conn.image.find_image(o.image, ignore_missing=True)
        if image is None:
            problems.append(f"image {o.image!r} not found (by name or ID); set openstack.image to one from `openstack image list`")
        elif (image.status or "active") != "active":
            problems.append(f"image {o.image!r} is {image.status}, not active; choose another openstack.image")
        elif flavor is not None:
            min_disk = int(image.min_disk or 0)
            if o.root_volume_size:
                if min_disk > o.root_volume_size:
                    problems.append(f"image {o.image!r} needs a {min_disk} GB root disk; set openstack.root_volume_size to {min_disk} or more")
            elif not flavor.disk:
                problems.append(
                    f"flavor {o.flavor!r} has no root disk (0 GB): boot from a volume with openstack.root_volume_size "
                    f"(e.g. {max(min_disk, 50)})"
                )
            elif min_disk > flavor.disk:
                problems.append(
                    f"image {o.image!r} needs a {min_disk} GB root disk, flavor {o.flavor!r} has {flavor.disk} GB; "
                    f"set openstack.root_volume_size: {max(min_disk, 50)} to boot from a volume, or choose a larger flavor"
                )
            if image.min_ram and int(image.min_ram) > flavor.ram:
                problems.append(f"image {o.image!r} needs {image.min_ram} MB RAM, flavor {o.flavor!r} has {flavor.ram} MB")

    with cloud_errors(conn, f"looking up external network {o.external_network!r}"):
        ext = conn.network.find_network(o.external_network, ignore_missing=True)
        if ext is None or not ext.is_router_external:
            externals = _names(conn.network.networks(is_router_external=True))
            state = "not found" if ext is None else "is not an external network"
            problems.append(f"external network {o.external_network!r} {state}; set openstack.external_network to one of: {externals}")

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
            else:
                subnets = list(conn.network.subnets(network_id=net.id, ip_version=4))
                if len(subnets) != 1:
                    problems.append(
                        f"network {o.network!r} has {len(subnets)} IPv4 subnets, the deployer needs exactly one; "
                        f"pick another openstack.network or remove it to create a dedicated one"
                    )
                elif ext is not None and ext.is_router_external and not routed_to(conn, net.id, ext.id):
                    problems.append(
                        f"network {o.network!r} has no router to external network {o.external_network!r}, so the master's "
                        f"floating IP cannot reach it; add one (openstack router set --external-gateway {o.external_network} R; "
                        f"openstack router add subnet R {subnets[0].name or subnets[0].id}) or remove openstack.network"
                    )

    if o.key_pair:
        with cloud_errors(conn, f"looking up key pair {o.key_pair!r}"):
            if conn.compute.find_keypair(o.key_pair, ignore_missing=True) is None:
                problems.append(
                    f"key pair {o.key_pair!r} not found; set openstack.key_pair to one of: {_names(conn.compute.keypairs())}, "
                    f"or remove it to upload the cluster key"
                )

    with cloud_errors(conn, "listing the cluster's servers"):
        own = own_servers(conn, spec.name)
    existing = sorted(s.name for s in own)
    fresh = not (cluster_exists or own)

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

    if problems:
        extra = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        raise PreflightError(problems[0] + extra)

    flavor_gpus = gpus_from_extra_specs(flavor.extra_specs)
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
    )


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
    return (
        f"project quota too small for {spec.nodes} nodes of {flavor}{grown}: {'; '.join(r.short_per_node)}; "
        f"the largest cluster that fits is {total} nodes: run with --nodes {total}, or ask the cloud's admins for more quota"
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
