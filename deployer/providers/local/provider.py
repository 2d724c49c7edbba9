"""Local provider: LXC system containers on this machine (the embedded default).

What cannot run in a container here, and so never runs locally: kernel NFS (the
shared dir is a host bind mount instead), NVIDIA drivers and GPUs, and the Grafana
server (no package source for it). Their roles run on OpenStack (and the NFS roles on
the tests' emulated VMs, tests/vm).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Collection
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import PreflightError
from ..base import CloudCluster, Machine, Observation, Repair

if TYPE_CHECKING:
    from ...cluster import Cluster
    from ...spec import ClusterSpec
    from ...state import ClusterState

# Tools the driver calls, and the Debian package that ships each.
# The zone the local provider reports for its nodes: there is one, this machine.
LOCAL_ZONE = "local"

REQUIRED_TOOLS = {
    "lxc-start": "lxc",
    "debootstrap": "debootstrap",
    "nft": "nftables",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}
HOST_RESERVE_MB = 1024  # left to the host, Terraform and Ansible
# Which state dir owns each local cluster name: containers, bridge and firewall table are
# named after the cluster, machine-wide, so a name is one cluster per machine whatever
# directory the deployer runs in. One file per name, holding the owner's state dir.
CLAIMS_DIR = Path("/var/lib/deployer/local-clusters")


def _claim_file(name: str) -> Path:
    return CLAIMS_DIR / name


def claim_holder(name: str) -> Path | None:
    try:
        return Path(_claim_file(name).read_text().splitlines()[0].strip())
    except (OSError, IndexError):
        return None


def _process_mark(pid: int) -> str | None:
    """The process's id and start time (so a reused pid is not it), or None: no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"  # field 22, counted after the command's name


def _claimer_running(name: str) -> bool:
    """Whether the process that took the claim still runs (a claim from before the mark: no)."""
    try:
        lines = _claim_file(name).read_text().splitlines()
    except OSError:
        return False
    if len(lines) < 2 or not lines[1].split():
        return False
    return _process_mark(int(lines[1].split()[0])) == lines[1].strip()


def claim_name(name: str, state_dir: Path) -> None:
    """Take the name for `state_dir`, or refuse (exit 2) when another state dir holds it and
    still records a cluster, or has just claimed it (the process that did still runs: its
    first record is not written yet). Decided and written under one lock, so two first
    `up`s of one name cannot both pass, over a stale claim neither; a holder that records
    nothing and whose claimer is gone (its cluster went down, or its preflight refused)
    gives the name up. The claim holds the state dir, then the claiming process."""
    from .host import file_lock

    mine = state_dir.resolve()
    CLAIMS_DIR.mkdir(parents=True, exist_ok=True)
    path = _claim_file(name)
    with file_lock(CLAIMS_DIR / ".lock"):
        holder = claim_holder(name)
        if holder and holder != mine and (_records_a_cluster(holder) or _claimer_running(name)):
            raise PreflightError(
                f"cluster name {name!r} is in use on this machine by the state dir {holder}: pick another --name "
                f"(or run `deployer down --name {name}` where that state dir is)")
        fresh = path.with_name(f".{name}.{os.getpid()}")
        fresh.write_text(f"{mine}\n{_process_mark(os.getpid())}\n")
        fresh.chmod(0o644)
        os.replace(fresh, path)


def _records_a_cluster(state_dir: Path) -> bool:
    from ...state import ClusterState

    return ClusterState(state_dir.parent, state_dir.name).origin_file.exists()


def release_name(name: str, state_dir: Path) -> None:
    from .host import file_lock

    CLAIMS_DIR.mkdir(parents=True, exist_ok=True)
    with file_lock(CLAIMS_DIR / ".lock"):
        if claim_holder(name) == state_dir.resolve():
            _claim_file(name).unlink(missing_ok=True)


def bridge_name(cluster: str) -> str:
    """A Linux interface name (<= 15 chars), readable when the cluster name allows."""
    if len(cluster) <= 11:
        return f"dpl-{cluster}"
    return f"dpl-{cluster[:6]}{hashlib.sha1(cluster.encode()).hexdigest()[:5]}"


def _mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def _host_routes() -> list[tuple[ipaddress.IPv4Network, str]]:
    out = subprocess.run(["ip", "-j", "-4", "route", "show", "table", "all"], text=True, capture_output=True).stdout
    routes = []
    for r in json.loads(out or "[]"):
        dst = r.get("dst", "")
        if not dst or dst == "default" or r.get("type") in ("local", "broadcast"):
            continue
        try:
            routes.append((ipaddress.IPv4Network(dst, strict=False), r.get("dev", "?")))
        except ValueError:
            continue
    return routes


class LocalProvider:
    name = "local"
    description = "LXC containers on this machine; --provider openstack for a cloud"
    boot_timeout_s = 120  # a container boots in seconds; cloud-init adds about 2-3 s

    def terraform_env(self, spec: "ClusterSpec") -> dict[str, str]:
        return {}

    def node_resource(self, node: str) -> str:
        return f'terraform_data.node["{node}"]'

    def preflight(self, spec: "ClusterSpec", state: "ClusterState", replacing: Collection[str] = ()) -> None:
        if os.geteuid() != 0:
            raise PreflightError("the local provider creates containers and bridges: run as root (e.g. sudo deployer up ...)")
        for tool, package in REQUIRED_TOOLS.items():
            if shutil.which(tool) is None:
                raise PreflightError(f"{tool} not found: install it with `apt-get install {package}` (or run `make deps`)")
        claim_name(spec.name, state.dir)
        self._refuse_foreign(state)
        existing = state.cluster()
        running = len(existing.nodes) if existing else 0
        need = (spec.nodes - running) * spec.local.memory_mb
        have = _mem_available_mb() - HOST_RESERVE_MB
        if need > have:
            fit = running + max(0, have // spec.local.memory_mb)
            raise PreflightError(
                f"{spec.nodes} nodes x {spec.local.memory_mb} MiB do not fit in {have + HOST_RESERVE_MB} MiB available: "
                f"use --nodes {fit} or less, or lower local.memory_mb"
            )
        self._place_subnet(spec, state)

    def _place_subnet(self, spec: "ClusterSpec", state: "ClusterState") -> None:
        """The cluster's subnet: the one the spec names, else the one the cluster was made
        with, else the default or the next free /24 after it (a second local cluster of
        default spec gets one of its own instead of a refusal). Sets spec.local.subnet."""
        own = bridge_name(spec.name)
        routes = [(net, dev) for net, dev in _host_routes() if dev != own]

        def collision(subnet: ipaddress.IPv4Network) -> tuple[ipaddress.IPv4Network, str] | None:
            return next(((net, dev) for net, dev in routes if net.overlaps(subnet)), None)

        recorded = state.spec()
        made_with = recorded.local.subnet if recorded else None
        if "subnet" not in spec.local.model_fields_set and made_with:
            spec.local.subnet = made_with
        if "subnet" in spec.local.model_fields_set:
            hit = collision(spec.local.subnet)
            if hit:
                raise PreflightError(f"local.subnet {spec.local.subnet} collides with the host route {hit[0]} on {hit[1]}: "
                                     "pick another, e.g. local.subnet: 10.78.0.0/24")
            return
        default = spec.local.subnet
        taken = collision(default)
        if taken is None:
            return
        net, dev = taken
        for candidate in default.supernet(new_prefix=16).subnets(new_prefix=24):
            if candidate > default and collision(candidate) is None:
                from ... import ui

                ui.info(f"local.subnet: {default} is taken on this machine ({net} on {dev}); using {candidate}")
                spec.local.subnet = candidate
                return
        raise PreflightError(f"local.subnet: no /24 from {default} up in {default.supernet(new_prefix=16)} is free of this "
                             f"machine's routes ({net} on {dev}): set local.subnet, e.g. local.subnet: 10.78.0.0/24")

    def _refuse_foreign(self, state: "ClusterState") -> None:
        """Containers, a bridge or a table by this cluster's name that this state dir did not
        make: another's (a state dir from before names were claimed, or one deleted by
        hand). Taking them over would let Terraform and `down` destroy them. Containers
        carry the id of the cluster that made them; a state dir that has made nothing yet
        owns no container, bridge or table."""
        from . import node

        made = state.cluster_id is not None
        found = [f"node {n}" for n in node.containers(state.name) if not made or node.cluster_id_of(n) != state.cluster_id]
        if not made:
            found += self.observe(state, {}, []).other  # the bridge and the table
        if found:
            raise PreflightError(
                f"{', '.join(found)} of another cluster named {state.name!r} exist on this machine, and this state dir did "
                f"not make them: pick another --name, or remove them ({self.manual_cleanup_hint(state)})")

    def prepare(self, spec: "ClusterSpec", state: "ClusterState") -> None:
        from . import image

        todo = image.image_todo()
        if todo:
            from ... import ui

            doing = {
                "build": f"building the Debian {image.SUITE} base image with debootstrap (once, about two minutes)",
                "refresh": "refreshing the base image's package lists (once for every node: they skip their own apt update)",
            }[todo]
            with ui.status(doing):
                image.ensure_base_image()
        state.shared_host_dir.mkdir(parents=True, exist_ok=True)
        if not spec.image:  # a baked image has its environment on its own disk; the role links to it
            self._link_training_env(spec, state)

    def _link_training_env(self, spec: "ClusterSpec", state: "ClusterState") -> None:
        """The cluster's `<shared>/venv`, hard-linked from the one this machine prepared
        (runtime_env): torch is downloaded and installed once per machine, not per cluster."""
        from ... import ui
        from . import image, runtime_env

        target = state.shared_host_dir / "venv"
        if target.exists():
            return
        rt = runtime_env.runtime_for(spec.shared_dir, spec.gpu_runtime.torch)
        what = "installing" if runtime_env.fetched(rt.requirements) else "downloading and installing"
        saying = ui.status(f"{what} the training environment ({', '.join(rt.requirements)}) once for this machine "
                           f"into {runtime_env.CACHE_ROOT} (about two minutes)")
        with saying if not runtime_env.ready(rt) else contextlib.nullcontext():
            env = runtime_env.ensure(rt, image.base_rootfs().resolve())
        runtime_env.link_into(env, target)

    def observe(self, state: "ClusterState", env: dict[str, str], nodes: list[str]) -> Observation:
        """Containers, bridge and firewall table of the cluster, read from the host: one
        `lxc-ls` and a file read per node, no SSH (status stays fast)."""
        from concurrent.futures import ThreadPoolExecutor

        from . import network, node

        with ThreadPoolExecutor(max_workers=1) as pool:
            has_table = pool.submit(network.nft_table_exists, state.name)  # beside lxc-ls: two commands, one wait
            # Containers another cluster of this name made (another id) are not this one's.
            found = {n: st for n, st in node.containers(state.name).items() if node.cluster_id_of(n) == state.cluster_id}
            # Every container runs on this machine: one host, named as the machine names itself.
            here = socket.gethostname()
            seen = {n: Machine(found[n], node.instance_id(n), host=here, host_id=here, zone=LOCAL_ZONE) if n in found
                    else Machine("missing") for n in nodes}
            other = []
            if Path("/sys/class/net", bridge_name(state.name)).exists():
                other.append(f"bridge {bridge_name(state.name)}")
            if has_table.result():
                other.append(f"nftables table ip {network.nft_table(state.name)}")
        return Observation(nodes=seen, extra=sorted(set(found) - set(nodes)), other=other)

    def repair(self, spec: "ClusterSpec", state: "ClusterState", cluster: Cluster, seen: Observation) -> Repair:
        """Bring back what a host reboot takes (the bridge, the firewall table, running
        containers). The table is rewritten every time, so a changed local.access applies
        to a running cluster. A missing container goes back to Terraform: recreated, it
        gets a new id and is configured again."""
        from . import network, node

        v = self.tfvars(spec, state)
        net = ipaddress.IPv4Network(v["subnet"])
        gateway = net.network_address + 1
        only_master = cluster.master.private_ip if v["access"] == "via_master" else None
        network.network_up(network.NetworkUp(spec.name, bridge_name(spec.name), str(net), f"{gateway}/{net.prefixlen}", only_master))
        fix = Repair()
        for n in cluster.nodes:
            machine = seen.nodes.get(n.name, Machine("missing"))
            if machine.state == "missing":
                fix.recreate.append(n.name)
            elif machine.state == "stopped":
                fix.started.append(n.name)
                node.node_up(node.NodeUp(
                    name=n.name, ip=f"{n.private_ip}/{net.prefixlen}", gateway=str(gateway), bridge=bridge_name(spec.name),
                    shared=f"{v['shared_host_dir']}:{v['shared_dir']}", memory_mb=v["memory_mb"],
                    user_data=str(state.boot_dir / f"{n.name}.user-data"), cluster_id=state.cluster_id, instance_id=n.id,
                    image=spec.image))
        return fix

    def place(self, spec: "ClusterSpec", state: "ClusterState", cluster: Cluster) -> str | None:
        """Cores of its own for each node when this machine has at least one per node,
        so nodes do not fight over cores and E(N) measures communication; else all share."""
        from . import pinning

        cpus = sorted(os.sched_getaffinity(0))
        plan = pinning.pin_cpus([n.name for n in cluster.nodes], cpus)
        if plan:
            pairs = ", ".join(f"{node.name}: {cores}" for node, cores in zip(cluster.nodes, plan, strict=True))
            return f"cores: each node has its own ({pairs})"
        return f"cores: the {len(cluster.nodes)} nodes share this machine's {len(cpus)} (fewer cores than nodes)"

    def tfvars(self, spec: "ClusterSpec", state: "ClusterState", checked: object = None) -> dict[str, Any]:
        return {
            "cluster_name": spec.name,
            "cluster_id": state.cluster_id,  # made before Terraform runs (lifecycle.up)
            "node_count": spec.nodes,
            "subnet": str(spec.local.subnet),
            "bridge": bridge_name(spec.name),
            "ssh_user": spec.ssh_user,
            "shared_dir": spec.shared_dir,
            "shared_host_dir": str(state.shared_host_dir),
            "boot_dir": str(state.boot_dir),
            "access": spec.local.access,
            "memory_mb": spec.local.memory_mb,
            "host_cpus": len(os.sched_getaffinity(0)),
            "image": spec.image,
            # The driver runs with this interpreter and this package, wherever it is installed.
            "driver": [sys.executable, "-m", "deployer.providers.local.lxc"],
        }

    def remove_leftovers(self, state: "ClusterState", env: dict[str, str]) -> list[str]:
        """After Terraform's destroy: the containers that still carry this cluster's id. A
        node whose creation failed (made, then `lxc-start` aborted) is a tainted resource,
        and Terraform runs no destroy provisioner for one; the deployer made it for this
        cluster all the same. The bridge and the table of a network whose creation failed
        too, when this state dir holds the cluster's name (nothing else may make them).
        Returns what was removed."""
        from . import network, node

        cluster_id = state.cluster_id
        if cluster_id is None:
            return []
        removed = []
        for name in sorted(node.containers(state.name)):
            if node.cluster_id_of(name) == cluster_id:
                node.node_down(name, cluster_id)
                removed.append(f"node {name}")
        if claim_holder(state.name) == state.dir.resolve():
            bridge = Path("/sys/class/net", bridge_name(state.name)).exists()
            if bridge or network.nft_table_exists(state.name):
                network.network_down(state.name, bridge_name(state.name))
                removed.append(f"network {bridge_name(state.name)}")
        return removed

    def forget(self, state: "ClusterState", env: dict[str, str]) -> None:
        """Nothing outside Terraform to revoke locally; the name is free again."""
        release_name(state.name, state.dir)

    def inventory_vars(self, spec: "ClusterSpec", state: "ClusterState", cluster: Cluster) -> dict[str, Any]:
        return {"deployer_auto_teardown": False, "deployer_teardown_credential_id": None, "deployer_teardown_server_id": None,
                "deployer_teardown_worker_ids": [], "deployer_teardown_script": None}

    def expired_in_cloud(self, env: dict[str, str], at: datetime) -> list[CloudCluster]:
        return []  # a container carries no expiry: the state dir's lifetime.json is the only one

    def settle(self, spec: ClusterSpec, state: ClusterState) -> str | None:
        return None

    def record_expiry(self, state: ClusterState, env: dict[str, str], expires_at: str | None, was: str | None) -> str | None:
        return None  # the state dir's lifetime.json is a local cluster's only record

    def cloud_keeps(self, state: ClusterState, env: dict[str, str], at: datetime) -> str | None:
        return None

    def delete_from_cloud(self, env: dict[str, str], name: str, cluster_id: str, *, say: Callable[[str], None],
                          expired_at: datetime) -> list[str]:
        raise NotImplementedError("local clusters are found through their state dir only")

    def boot_log_hint(self, node: str) -> str:
        from .node import boot_log_hint

        return boot_log_hint(node)

    def manual_cleanup_hint(self, state: "ClusterState") -> str:
        from . import network

        cluster = state.name

        return (f"`lxc-ls -1 | grep ^{cluster}-` (then lxc-destroy -f -n NAME), `ip link del {bridge_name(cluster)}`, "
                f"`nft delete table ip {network.nft_table(cluster)}`")
