"""The bake on an emulated VM that tests/vm/test_bake.py checks: a builder VM booted with
`image build`'s own builder spec, the deployer's bake play through the package proxy, the
seal, a power-off and the disk saved as a standalone qcow2, kept on the machine under
CACHE/baked/<bake_key>.

Apart from the test's assertions so that editing those does not bake again (10 min
under emulation): bake_key hashes this file, not test_bake.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer import image_build, image_manifest
from deployer.cluster import Cluster
from deployer.paths import ansible_dir
from deployer.pipeline import boot, inventory, readiness
from deployer.providers.local.host import file_lock
from deployer.spec import ClusterSpec
from deployer.state import ClusterState
from deployer.tools.ansible import close_connections

from . import machines, package_proxy
from .conftest import BOOT_TIMEOUT_S, USER, VMCluster, cluster_output
from .image import CACHE, Image, stamp

# Addresses and tap names of their own: these VMs may run beside conftest's two.
BUILDER_IP, NODE_IP = 30, 31
# What bake.yml's package plays install that neither the base image nor a stock Debian has.
BAKED_PACKAGES = ["pciutils", "iperf3", "openmpi-bin", "libopenmpi-dev", "munge", "slurmd", "slurmctld",
                  "prometheus-node-exporter", "prometheus", "prometheus-pushgateway"]
BAKE_CACHE = CACHE / "baked"
HERE = Path(__file__).parent


@dataclass
class BakeVM(machines.VM):
    tap_suffix: str = ""

    @property
    def tap(self) -> str:
        return (machines.TAP_PREFIX + self.tap_suffix)[:15]


def bake_key() -> str:
    """Of everything a bake here is made of: another value, another bake."""
    h = hashlib.sha256(f"{stamp()} {image_manifest.roles_hash()} {sorted(BAKED_PACKAGES)}".encode())
    ansible = ansible_dir()
    for f in [ansible / "bake.yml", ansible / "ansible.cfg", *sorted((ansible / "group_vars").rglob("*.yml")),
              *sorted((ansible / "filter_plugins").rglob("*.py")),
              Path(image_build.__file__), HERE / "bake.py", HERE / "machines.py", HERE / "package_proxy.py",
              HERE / "conftest.py"]:
        h.update(f.name.encode())
        h.update(f.read_bytes() if f.exists() else b"-")
    return h.hexdigest()[:16]


def start_vm(name: str, ip: int, state: ClusterState, image: Image, *, tap: str, volume_id: str | None = None,
           **hardware: int) -> BakeVM:
    vm = BakeVM(name, machines.SUBNET[ip], state.boot_dir / f"{name}.user-data", volume_id=volume_id, tap_suffix=tap,
                **hardware)
    machines.stop(vm)  # a killed run's
    machines.start(vm, image)
    return vm


def one_node(name: str, ip: int, work: Path, *, gpus: int = 0, spec: ClusterSpec | None = None,
              volume: bool = False) -> tuple[ClusterSpec, ClusterState, Cluster, str | None]:
    spec = spec or ClusterSpec(name=name, provider="openstack", nodes=1, ssh_user=USER)
    state = ClusterState(work / "state", spec.name)
    state.create()
    boot.write_user_data(spec, state)
    volume_id = str(uuid.uuid4()) if volume else None
    out = cluster_output(spec, volume_id or str(uuid.uuid4()), first_ip=ip)
    out["nodes"][0]["gpus"] = gpus
    return spec, state, Cluster.parse(out), volume_id


def ready(state: ClusterState, cluster: Cluster, vm: BakeVM) -> None:
    boot.write_access(state, cluster)
    readiness.wait_for_boot(state, cluster, timeout_s=BOOT_TIMEOUT_S, hint=lambda _: str(vm.console))


def facts(c: VMCluster, node: str) -> dict[str, str]:
    return {
        "machine_id": c.sudo(node, "cat /etc/machine-id").strip(),
        "instance_id": c.sudo(node, "cat /var/lib/cloud/data/instance-id").strip(),
        "host_key": c.sudo(node, "cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub").strip(),
        "missing": " ".join(p for p in BAKED_PACKAGES if c.ssh(node, f"dpkg -s {p} >/dev/null 2>&1").returncode != 0),
    }


def bake(work: Path, image: Image, into: Path, vms: list[BakeVM]) -> dict[str, Any]:
    """The builder booted, baked, sealed with a manifest, powered off and its disk saved
    as `into`/root.qcow2; what was seen of it, for made.json."""
    seconds: dict[str, float] = {}
    t = time.monotonic()
    # The builder: `image build`'s own one-node spec of a cluster's spec, booted from the base image.
    bspec, bstate, bcluster, _ = one_node("", BUILDER_IP, work / "builder",
                                           spec=image_build.builder_spec(ClusterSpec(
                                               name="vmb", provider="openstack", nodes=2, ssh_user=USER), gpu=False))
    # As `image build` sizes its builder (more memory than a node); two vCPUs: dpkg
    # decompresses in a process of its own, and each vCPU is a host thread.
    builder_vm = start_vm(bcluster.master.name, BUILDER_IP, bstate, image, tap="bake",
                        memory_mb=image_build.BUILDER_MEMORY_MB, cpus=2)
    vms.append(builder_vm)
    ready(bstate, bcluster, builder_vm)
    b = VMCluster(bstate, bspec, bcluster, inventory.write(bcluster, bspec, bstate), [builder_vm], work / "builder")
    seconds["builder boot"] = time.monotonic() - t
    before = facts(b, b.master)

    t = time.monotonic()
    with package_proxy.serving() as proxy:
        host, port = proxy.server_address[:2]
        # The file the common role writes for the cluster's package cache; the seal removes it.
        b.sudo(b.master, f"echo 'Acquire::http::Proxy \"http://{host}:{port}\";' "
                         f"> /etc/apt/apt.conf.d/01deployer-package-cache")
        bake = image_build.bake_play(b.inventory, b.workdir / "runs" / "bake", gpu=False, runtime=False)
    seconds["bake"] = time.monotonic() - t

    t = time.monotonic()
    # No versions: the play that reports them is the training environment's, left out here.
    manifest = image_manifest.new(f"vm-bake-{bake_key()}", "openstack", gpu=False, base="debian 12 (tests/vm)",
                                  versions={}, at=time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()))
    image_build.seal(bstate, bcluster, manifest)
    close_connections(b.workdir / "cp")  # Ansible's ControlPersist masters, before the machine goes
    machines.power_off(builder_vm)
    machines.save_disk(builder_vm, into / "root.qcow2")
    machines.stop(builder_vm)
    seconds["seal, power off, save"] = time.monotonic() - t
    return {"builder_before": before, "builder_key": bstate.ssh_public_key.read_text().split()[1],
            "bake_changed": bake.total_changed, "bake_failures": bake.failures, "manifest": json.loads(manifest.to_json()),
            "requests_through_proxy": proxy.requests, "seconds": seconds,
            "made_at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def baked_disk(work: Path, image: Image, vms: list[BakeVM]) -> tuple[Path, dict[str, Any], bool]:
    """The saved disk of a bake of these inputs, its made.json, and whether it was baked
    now: from the machine's cache when one of the same key is there."""
    key = bake_key()
    kept = BAKE_CACHE / key
    with file_lock(CACHE / "bake.lock"):
        fresh = not (kept / "made.json").exists() or os.environ.get("DEPLOYER_VM_REBAKE") == "1"
        if fresh:
            BAKE_CACHE.mkdir(parents=True, exist_ok=True)
            staging = BAKE_CACHE / f".staging-{key}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            try:
                made = bake(work, image, staging, vms)
                (staging / "made.json").write_text(json.dumps(made, indent=1) + "\n")
                for old in BAKE_CACHE.iterdir():  # one bake kept: the current one
                    if old != staging:
                        shutil.rmtree(old, ignore_errors=True)
                staging.rename(kept)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return kept / "root.qcow2", json.loads((kept / "made.json").read_text()), fresh
