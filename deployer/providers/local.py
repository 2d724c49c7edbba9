"""Local provider: LXC system containers on this machine (the embedded default).

What cannot run in a container here, and so never runs locally: kernel NFS (the
shared dir is a host bind mount instead), NVIDIA drivers and GPUs, and the Grafana
server (no package source for it). Their roles run on OpenStack.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PreflightError
from .base import Machine, Observation, Repair

if TYPE_CHECKING:
    from ..spec import ClusterSpec
    from ..state import ClusterState

# Tools the driver calls, and the Debian package that ships each.
REQUIRED_TOOLS = {
    "lxc-start": "lxc",
    "debootstrap": "debootstrap",
    "nft": "nftables",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
}
HOST_RESERVE_MB = 1024  # left to the host, Terraform and Ansible


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

    def preflight(self, spec: "ClusterSpec", state: "ClusterState") -> None:
        if os.geteuid() != 0:
            raise PreflightError("the local provider creates containers and bridges: run as root (e.g. sudo deployer up ...)")
        for tool, package in REQUIRED_TOOLS.items():
            if shutil.which(tool) is None:
                raise PreflightError(f"{tool} not found: install it with `apt-get install {package}` (or run `make deps`)")
        existing = state.cluster()
        running = len(existing["nodes"]) if existing else 0
        need = (spec.nodes - running) * spec.local.memory_mb
        have = _mem_available_mb() - HOST_RESERVE_MB
        if need > have:
            fit = running + max(0, have // spec.local.memory_mb)
            raise PreflightError(
                f"{spec.nodes} nodes x {spec.local.memory_mb} MiB do not fit in {have + HOST_RESERVE_MB} MiB available: "
                f"use --nodes {fit} or less, or lower local.memory_mb"
            )
        subnet = spec.local.subnet
        own = bridge_name(spec.name)
        for net, dev in _host_routes():
            if dev != own and net.overlaps(subnet):
                raise PreflightError(
                    f"local.subnet {subnet} collides with the host route {net} on {dev}: pick another, e.g. local.subnet: 10.78.0.0/24"
                )

    def prepare(self, spec: "ClusterSpec", state: "ClusterState") -> None:
        from . import lxc

        todo = lxc.image_todo()
        if todo:
            from .. import ui

            doing = {
                "build": f"building the Debian {lxc.SUITE} base image with debootstrap (once, about two minutes)",
                "refresh": "refreshing the base image's package lists (once for every node: they skip their own apt update)",
            }[todo]
            with ui.status(doing):
                lxc.ensure_base_image()
        state.shared_host_dir.mkdir(parents=True, exist_ok=True)

    def observe(self, state: "ClusterState", env: dict[str, str], nodes: list[str]) -> Observation:
        """Containers, bridge and firewall table of the cluster, read from the host: one
        `lxc-ls` and a file read per node, no SSH (status stays fast)."""
        from concurrent.futures import ThreadPoolExecutor

        from . import lxc

        with ThreadPoolExecutor(max_workers=1) as pool:
            has_table = pool.submit(lxc.nft_table_exists, state.name)  # beside lxc-ls: two commands, one wait
            found = lxc.containers(state.name)
            seen = {n: Machine(found[n], lxc.instance_id(n)) if n in found else Machine("missing") for n in nodes}
            other = []
            if Path("/sys/class/net", bridge_name(state.name)).exists():
                other.append(f"bridge {bridge_name(state.name)}")
            if has_table.result():
                other.append(f"nftables table ip {lxc.nft_table(state.name)}")
        return Observation(nodes=seen, extra=sorted(set(found) - set(nodes)), other=other)

    def repair(self, spec: "ClusterSpec", state: "ClusterState", cluster: dict[str, Any], seen: Observation) -> Repair:
        """Bring back what a host reboot takes (the bridge, the firewall table, running
        containers). The table is rewritten every time, so a changed local.access applies
        to a running cluster. A missing container goes back to Terraform: recreated, it
        gets a new id and is configured again."""
        from . import lxc

        v = self.tfvars(spec, state)
        net = ipaddress.IPv4Network(v["subnet"])
        gateway = net.network_address + 1
        only_master = cluster["nodes"][0]["private_ip"] if v["access"] == "via_master" else None
        lxc.network_up(spec.name, bridge_name(spec.name), str(net), f"{gateway}/{net.prefixlen}", only_master)
        fix = Repair()
        for n in cluster["nodes"]:
            machine = seen.nodes.get(n["name"], Machine("missing"))
            if machine.state == "missing":
                fix.recreate.append(n["name"])
            elif machine.state == "stopped":
                fix.started.append(n["name"])
                lxc.node_up(n["name"], f"{n['private_ip']}/{net.prefixlen}", str(gateway), bridge_name(spec.name),
                            f"{v['shared_host_dir']}:{v['shared_dir']}", v["memory_mb"], state.boot_dir / f"{n['name']}.user-data")
        return fix

    def place(self, spec: "ClusterSpec", state: "ClusterState", cluster: dict[str, Any]) -> str | None:
        """Cores of its own for each node when this machine has at least one per node,
        so nodes do not fight over cores and E(N) measures communication; else all share."""
        from . import lxc

        cpus = sorted(os.sched_getaffinity(0))
        plan = lxc.pin_cpus([n["name"] for n in cluster["nodes"]], cpus)
        if plan:
            pairs = ", ".join(f"{node['name']}: {cores}" for node, cores in zip(cluster["nodes"], plan, strict=True))
            return f"cores: each node has its own ({pairs})"
        return f"cores: the {len(cluster['nodes'])} nodes share this machine's {len(cpus)} (fewer cores than nodes)"

    def tfvars(self, spec: "ClusterSpec", state: "ClusterState", checked: Any = None) -> dict[str, Any]:
        return {
            "cluster_name": spec.name,
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
            # The driver runs with this interpreter and this package, wherever it is installed.
            "driver": [sys.executable, "-m", "deployer.providers.lxc"],
        }

    def forget(self, state: "ClusterState", env: dict[str, str]) -> None:
        """Nothing outside Terraform to revoke locally."""

    def boot_log_hint(self, node: str) -> str:
        from . import lxc

        return lxc.boot_log_hint(node)

    def manual_cleanup_hint(self, cluster: str) -> str:
        from . import lxc

        return (f"`lxc-ls -1 | grep ^{cluster}-` (then lxc-destroy -f -n NAME), `ip link del {bridge_name(cluster)}`, "
                f"`nft delete table ip {lxc.nft_table(cluster)}`")
