"""`deployer image build` on an emulated VM, and a node booted from what it saved.

A builder VM boots from the Debian 12 base image (tests/vm/image.py) through the same
config drive and user-data as every VM here, with `image build`'s own one-node builder
spec (image_build.builder_spec). The deployer's bake play (ansible/bake.yml through
image_build.bake_play) installs into it from the real Debian mirror, reached through
package_proxy.py (the VMs have no route out), then the deployer's SEAL_SCRIPT runs on it
(image_build.seal). The VM is powered off, its disk saved as a standalone qcow2 (what
Nova's snapshot makes of a server's disk), and a node of another cluster boots from that:
cloud-init must run again (new host key, new machine-id, its own instance id, its own
cluster user's key and not the builder's). The storage and NVIDIA-driver plays of site.yml
then run on it twice: the first installs nothing (the bake has the driver role's pciutils,
the base image the NFS packages, and the node has no route to a mirror anyway), the second
changes nothing.

Left out of the bake: its training-environment play (torch into the image, tag `runtime`),
GBs unpacked and byte-compiled under emulation (not tried); the local bake runs it.

The bake takes ~10 min under emulation, so its disk is kept on the machine (CACHE/baked),
with what was observed of the builder and the bake's play, keyed by a hash of everything
that goes into it (bake_key: the base image's stamp, the installing roles, bake.yml, the
deployer's bake and seal, this harness). A run that finds it boots the node from it and
says so; any change to those inputs bakes again, as does DEPLOYER_VM_REBAKE=1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deployer import image_build, image_manifest
from deployer.cluster import Cluster
from deployer.paths import ansible_dir
from deployer.pipeline import boot, inventory, readiness
from deployer.providers.local.host import file_lock
from deployer.spec import ClusterSpec
from deployer.state import ClusterState
from deployer.tools.ansible import PlayResult, close_connections

from . import machines, package_proxy
from .conftest import BOOT_TIMEOUT_S, USER, VMCluster, _why_not, cluster_output, site_play
from .image import CACHE, Image, ensure_image, stamp

# Addresses and tap names of their own: these VMs may run beside conftest's two.
BUILDER_IP, NODE_IP = 30, 31
# What bake.yml's package plays install that neither the base image nor a stock Debian has.
BAKED_PACKAGES = ["pciutils", "iperf3", "openmpi-bin", "libopenmpi-dev", "munge", "slurmd", "slurmctld",
                  "prometheus-node-exporter", "prometheus", "prometheus-pushgateway"]
PLAYS = ("Shared storage", "NVIDIA driver")
INSTALLING_ACTIONS = ("apt", "package", "pip", "dpkg_selections")
BAKE_CACHE = CACHE / "baked"
HERE = Path(__file__).parent


@dataclass
class BakeVM(machines.VM):
    tap_suffix: str = ""

    @property
    def tap(self) -> str:
        return (machines.TAP_PREFIX + self.tap_suffix)[:15]


@dataclass
class Baked:
    node: VMCluster
    made: dict[str, Any]  # made.json beside the saved disk: the builder before the bake, the bake's play, the manifest
    baked_now: bool  # False: the disk came from the machine's cache (bake_key)
    saved_backing: str | None  # the saved disk's backing file (None: standalone)
    first: PlayResult
    second: PlayResult
    packages_before: str
    packages_after_first: str
    seconds: dict[str, float] = field(default_factory=dict)


def bake_key() -> str:
    """Of everything a bake here is made of: another value, another bake."""
    h = hashlib.sha256(f"{stamp()} {image_manifest.roles_hash()} {sorted(BAKED_PACKAGES)}".encode())
    ansible = ansible_dir()
    for f in [ansible / "bake.yml", ansible / "ansible.cfg", *sorted((ansible / "group_vars").rglob("*.yml")),
              *sorted((ansible / "filter_plugins").rglob("*.py")),
              Path(image_build.__file__), HERE / "test_bake.py", HERE / "machines.py", HERE / "package_proxy.py",
              HERE / "conftest.py"]:
        h.update(f.name.encode())
        h.update(f.read_bytes() if f.exists() else b"-")
    return h.hexdigest()[:16]


def _start(name: str, ip: int, state: ClusterState, image: Image, *, tap: str, volume_id: str | None = None,
           **hardware: int) -> BakeVM:
    vm = BakeVM(name, machines.SUBNET[ip], state.boot_dir / f"{name}.user-data", volume_id=volume_id, tap_suffix=tap,
                **hardware)
    machines.stop(vm)  # a killed run's
    machines.start(vm, image)
    return vm


def _one_node(name: str, ip: int, work: Path, *, gpus: int = 0, spec: ClusterSpec | None = None,
              volume: bool = False) -> tuple[ClusterSpec, ClusterState, Cluster, str | None]:
    spec = spec or ClusterSpec(name=name, provider="openstack", nodes=1, ssh_user=USER)
    state = ClusterState(work / "state", spec.name)
    state.create()
    boot.write_user_data(spec, state)
    volume_id = str(uuid.uuid4()) if volume else None
    out = cluster_output(spec, volume_id or str(uuid.uuid4()), first_ip=ip)
    out["nodes"][0]["gpus"] = gpus
    return spec, state, Cluster.parse(out), volume_id


def _ready(state: ClusterState, cluster: Cluster, vm: BakeVM) -> None:
    boot.write_access(state, cluster)
    readiness.wait_for_boot(state, cluster, timeout_s=BOOT_TIMEOUT_S, hint=lambda _: str(vm.console))


def _facts(c: VMCluster, node: str) -> dict[str, str]:
    return {
        "machine_id": c.sudo(node, "cat /etc/machine-id").strip(),
        "instance_id": c.sudo(node, "cat /var/lib/cloud/data/instance-id").strip(),
        "host_key": c.sudo(node, "cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub").strip(),
        "missing": " ".join(p for p in BAKED_PACKAGES if c.ssh(node, f"dpkg -s {p} >/dev/null 2>&1").returncode != 0),
    }


def _events(c: VMCluster, label: str) -> list[dict[str, Any]]:
    lines = (c.workdir / "runs" / label / "ansible-events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _installing_changes(c: VMCluster, label: str) -> list[str]:
    return [f"{e['event_data'].get('task')} ({e['event_data'].get('task_action')})" for e in _events(c, label)
            if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")
            and str(e["event_data"].get("task_action", "")).rsplit(".", 1)[-1] in INSTALLING_ACTIONS]


def _bake(work: Path, image: Image, into: Path, vms: list[BakeVM]) -> dict[str, Any]:
    """The builder booted, baked, sealed with a manifest, powered off and its disk saved
    as `into`/root.qcow2; what was seen of it, for made.json."""
    seconds: dict[str, float] = {}
    t = time.monotonic()
    # The builder: `image build`'s own one-node spec of a cluster's spec, booted from the base image.
    bspec, bstate, bcluster, _ = _one_node("", BUILDER_IP, work / "builder",
                                           spec=image_build.builder_spec(ClusterSpec(
                                               name="vmb", provider="openstack", nodes=2, ssh_user=USER), gpu=False))
    # As `image build` sizes its builder (more memory than a node); two vCPUs: dpkg
    # decompresses in a process of its own, and each vCPU is a host thread.
    builder_vm = _start(bcluster.master.name, BUILDER_IP, bstate, image, tap="bake",
                        memory_mb=image_build.BUILDER_MEMORY_MB, cpus=2)
    vms.append(builder_vm)
    _ready(bstate, bcluster, builder_vm)
    b = VMCluster(bstate, bspec, bcluster, inventory.write(bcluster, bspec, bstate), [builder_vm], work / "builder")
    seconds["builder boot"] = time.monotonic() - t
    before = _facts(b, b.master)

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


def _baked_disk(work: Path, image: Image, vms: list[BakeVM]) -> tuple[Path, dict[str, Any], bool]:
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
                made = _bake(work, image, staging, vms)
                (staging / "made.json").write_text(json.dumps(made, indent=1) + "\n")
                for old in BAKE_CACHE.iterdir():  # one bake kept: the current one
                    if old != staging:
                        shutil.rmtree(old, ignore_errors=True)
                staging.rename(kept)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return kept / "root.qcow2", json.loads((kept / "made.json").read_text()), fresh


@pytest.fixture(scope="module")
def baked(tmp_path_factory) -> Baked:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    image = ensure_image()
    work = tmp_path_factory.mktemp("vm-bake")
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    made_bridge = not machines.network_exists()
    vms: list[BakeVM] = []
    try:
        if made_bridge:
            machines.network_up()
        disk, made, fresh = _baked_disk(work, image, vms)
        seconds.update(made["seconds"] if fresh else {"bake": 0.0})
        info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(disk)],
                                         text=True, capture_output=True, check=True).stdout)

        # A node of another cluster, from the saved disk (the kernel is booted from outside, as for every VM here).
        t = time.monotonic()
        nspec, nstate, ncluster, volume_id = _one_node("vmn", NODE_IP, work / "node", gpus=1, volume=True)
        node_vm = _start(ncluster.master.name, NODE_IP, nstate, Image(disk, image.kernel, image.initrd),
                         tap="baked", volume_id=volume_id)  # an overlay over it: the kept disk is not written
        vms.append(node_vm)
        _ready(nstate, ncluster, node_vm)
        node = VMCluster(nstate, nspec, ncluster, inventory.write(ncluster, nspec, nstate), [node_vm], work / "node")
        seconds["node boot"] = time.monotonic() - t

        plays = [site_play(p) for p in PLAYS]
        t = time.monotonic()
        packages_before = node.sudo(node.master, "dpkg-query -W")
        first = node.play(plays, "first")
        packages_after = node.sudo(node.master, "dpkg-query -W")
        seconds["storage and driver plays"] = time.monotonic() - t
        t = time.monotonic()
        second = node.play(plays, "second")
        seconds["the same again"] = time.monotonic() - t
        seconds["total"] = time.monotonic() - t0
        where = (f"baked now, {made['requests_through_proxy']} requests through the package proxy" if fresh else
                 f"the bake of {made['made_at']} from this machine's cache ({disk.parent}; same inputs: "
                 f"DEPLOYER_VM_REBAKE=1 bakes again; that bake took {made['seconds']['bake']:.0f} s)")
        print("bake on VMs: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()) + f"; {where}")
        yield Baked(node, made, fresh, info.get("backing-filename"), first, second, packages_before, packages_after,
                    seconds)
    finally:
        for vm in vms:
            if vm.console.exists():
                shutil.copy(vm.console, work / f"{vm.name}.console.log")
            machines.stop(vm)
        if made_bridge:  # nothing else of the harness was running
            subprocess.run(["ip", "link", "del", machines.BRIDGE], check=False, capture_output=True)
            with contextlib.suppress(OSError):
                machines.RUN_DIR.rmdir()


def test_the_bake_installs_the_roles_packages_into_the_image(baked: Baked):
    # Not on the base image, all on the node of the bake.
    assert set(baked.made["builder_before"]["missing"].split()) == set(BAKED_PACKAGES)
    assert _facts(baked.node, baked.node.master)["missing"] == ""
    assert baked.made["bake_changed"] > 0 and not baked.made["bake_failures"]
    assert baked.saved_backing is None  # a standalone disk, as an image in Glance is


def test_the_image_carries_its_manifest_where_the_roles_read_it(baked: Baked):
    """The seal wrote it into the disk: what a node of an OpenStack bake reads (the
    snapshot carries the disk only; Glance's properties reach no node)."""
    c = baked.node
    on_node = image_manifest.parse(c.sudo(c.master, f"cat {image_manifest.MANIFEST_PATH}"))
    assert on_node is not None and json.loads(on_node.to_json()) == baked.made["manifest"]
    assert on_node.roles_hash == image_manifest.roles_hash() and not on_node.gpu
    assert c.sudo(c.master, f"stat -c '%a %U' {image_manifest.MANIFEST_PATH}").strip() == "644 root"


def test_the_node_of_the_image_is_a_new_machine(baked: Baked):
    c = baked.node
    now = _facts(c, c.master)
    # cloud-init ran again: this server's instance id, the host key of this node's user-data
    # (the deployer's pinned known_hosts let the SSH in), a machine-id of its own.
    before = baked.made["builder_before"]
    assert now["instance_id"] == c.vms[0].server_id != before["instance_id"]
    assert now["host_key"] != before["host_key"]
    assert len(now["machine_id"]) == 32 and now["machine_id"] != before["machine_id"]
    # The cluster user holds this cluster's key alone, nothing of the builder's.
    keys = c.sudo(c.master, f"cat ~{USER}/.ssh/authorized_keys")
    assert baked.made["builder_key"] not in keys and c.state.ssh_public_key.read_text().split()[1] in keys
    # The builder's package-proxy setting, package lists and logs were sealed away.
    assert c.ssh(c.master, "test -e /etc/apt/apt.conf.d/01deployer-package-cache").returncode == 1
    assert c.sudo(c.master, "find /var/lib/apt/lists -name '*Packages*'") == ""
    assert "Cloud-init" in c.sudo(c.master, "cat /var/log/cloud-init-output.log")


def test_storage_and_driver_plays_install_nothing_and_then_change_nothing(baked: Baked):
    c = baked.node
    assert not baked.first.failures and baked.first.total_changed > 0  # the volume formatted, mounted, exported
    # Nothing installed: the driver role's pciutils came with the bake, NFS with the base image.
    assert _installing_changes(c, "first") == []
    assert baked.packages_after_first == baked.packages_before
    lspci = [e for e in _events(c, "first") if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Install lspci"]
    assert len(lspci) == 1 and not lspci[0]["event_data"]["res"].get("changed")
    assert c.sudo(c.master, "findmnt -n -o FSTYPE,LABEL --mountpoint /shared").split() == ["ext4", "deployer-shared"]
    assert "/shared" in c.sudo(c.master, "exportfs -v")
    # The second run: changed=0.
    assert not baked.second.failures and baked.second.total_changed == 0, baked.second.changed
