"""Two emulated VMs, a master with a shared volume and a worker, booted once for every test
here (tests/vm/machines.py says how they resemble Nova's servers), and reached through
the deployer's own state dir, ssh_config, readiness wait and Ansible inventory, as an
OpenStack cluster is.

Needs root, QEMU and genisoimage (`make vm-deps`); skipped with the reason otherwise.
DEPLOYER_VM_KEEP=1 leaves the VMs running after the tests, for a look (`ssh -F` the state
dir's ssh_config, printed); the next run removes them.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.cluster import Cluster
from deployer.paths import ansible_dir
from deployer.pipeline import boot, inventory, readiness
from deployer.spec import ClusterSpec
from deployer.state import ClusterState
from deployer.tools.ansible import PlayResult, run_playbook

from . import machines
from .image import ensure_image

NAME = "vmt"
USER = "debian"
BOOT_TIMEOUT_S = 900  # under emulation on two cores; about 90 s each when the machine is quiet


@dataclass
class VMCluster:
    state: ClusterState
    spec: ClusterSpec
    cluster: Cluster
    inventory: Path
    vms: list[machines.VM]
    workdir: Path

    @property
    def master(self) -> str:
        return self.cluster.master.name

    @property
    def worker(self) -> str:
        return self.cluster.workers[0].name

    def ssh(self, node: str, cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", str(self.state.ssh_config), node, cmd],
                              text=True, capture_output=True, timeout=timeout)

    def sudo(self, node: str, cmd: str, timeout: float = 300) -> str:
        p = self.ssh(node, f"sudo sh -c {shlex.quote(cmd)}", timeout=timeout)
        assert p.returncode == 0, f"{node}: {cmd}: {p.stderr or p.stdout}"
        return p.stdout

    def play(self, plays: list[dict[str, Any]], label: str) -> PlayResult:
        """Run these plays through the deployer's Ansible runner with the cluster's inventory."""
        path = self.workdir / f"{label}.yml"
        path.write_text(yaml.safe_dump(plays, sort_keys=False))
        return run_playbook(self.inventory, self.workdir / "runs" / label, playbook=str(path))


def site_play(name_prefix: str) -> dict[str, Any]:
    """One play of ansible/site.yml as it is, picked by its name: the VMs run what `up` runs."""
    plays = yaml.safe_load((ansible_dir() / "site.yml").read_text())
    return next(p for p in plays if p["name"].startswith(name_prefix))


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (taps, a bridge, debootstrap)"
    for tool in ("qemu-system-x86_64", "qemu-img", "genisoimage", "debootstrap", "mkfs.ext4"):
        if shutil.which(tool) is None:
            return f"{tool} missing: run `make vm-deps`"
    return None


def cluster_output(spec: ClusterSpec, volume_id: str, first_ip: int = 10) -> dict[str, Any]:
    """What terraform/openstack's `cluster` output would say about these servers, the
    master at SUBNET[first_ip] and each worker at the next address."""
    names = spec.node_names()
    ips = [machines.SUBNET[first_ip + i] for i in range(len(names))]
    return {
        "name": spec.name, "provider": "openstack", "ssh_user": USER, "shared_dir": spec.shared_dir,
        "access": "via_master", "shared_storage": "nfs", "machine": {"image": "debian-12 (emulated)", "flavor": "tcg"},
        "shared_cpus": None, "host_package_sources": False, "grafana_installable": True,
        "nodes": [{"name": n, "role": "master" if i == 0 else "worker", "id": None, "private_ip": str(ip),
                   "public_ip": None, "gpus": 0} for i, (n, ip) in enumerate(zip(names, ips, strict=True))],
        "cluster_cidr": str(machines.SUBNET),
        # storage.tf: the first 20 characters of the volume's id, as virtio-blk shows its serial
        "shared_device": f"/dev/disk/by-id/virtio-{volume_id[:20]}",
    }


@pytest.fixture(scope="session")
def vm_cluster(tmp_path_factory) -> VMCluster:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    machines.cleanup()  # a killed run's VMs and bridge
    image = ensure_image()
    work = tmp_path_factory.mktemp("vm")
    spec = ClusterSpec(name=NAME, provider="openstack", nodes=2, ssh_user=USER)
    state = ClusterState(work / "state", NAME)
    state.create()
    boot.write_user_data(spec, state)
    volume_id = str(uuid.uuid4())
    cluster = Cluster.parse(cluster_output(spec, volume_id))
    vms = [machines.VM(n.name, ipaddress.IPv4Address(n.private_ip), state.boot_dir / f"{n.name}.user-data",
                       volume_id=volume_id if n.is_master else None)
           for n in cluster.nodes]
    try:
        machines.network_up()
        t0 = time.monotonic()
        for vm in vms:
            machines.start(vm, image)
        boot.write_access(state, cluster)
        readiness.wait_for_boot(state, cluster, timeout_s=BOOT_TIMEOUT_S, hint=lambda name: str(machines.RUN_DIR / name / "console.log"))
        print(f"two VMs booted in {time.monotonic() - t0:.0f} s")
        path = inventory.write(cluster, spec, state)
        yield VMCluster(state, spec, cluster, path, vms, work)
    finally:
        for vm in vms:  # kept with the test's files for a failure's post-mortem
            if vm.console.exists():
                shutil.copy(vm.console, work / f"{vm.name}.console.log")
        if os.environ.get("DEPLOYER_VM_KEEP"):  # for a look after a failure; the next run removes them
            print(f"VMs kept: ssh -F {state.ssh_config} {NAME}-master")
        else:
            machines.cleanup()
