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
that goes into it (bake.bake_key: the base image's stamp, the installing roles, bake.yml,
the deployer's bake and seal, the harness in bake.py; not this file's assertions). A run
that finds it boots the node from it and says so; any change to those inputs bakes again,
as does DEPLOYER_VM_REBAKE=1.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from deployer import image_manifest
from deployer.pipeline import inventory
from deployer.tools.ansible import PlayResult

from . import bake, machines
from .conftest import USER, VMCluster, _why_not, site_play
from .image import Image, ensure_image

PLAYS = ("The shared dir over NFS", "Shared storage", "NVIDIA driver")
INSTALLING_ACTIONS = ("apt", "package", "pip", "dpkg_selections")


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


def _events(c: VMCluster, label: str) -> list[dict[str, Any]]:
    lines = (c.workdir / "runs" / label / "ansible-events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _installing_changes(c: VMCluster, label: str) -> list[str]:
    return [f"{e['event_data'].get('task')} ({e['event_data'].get('task_action')})" for e in _events(c, label)
            if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")
            and str(e["event_data"].get("task_action", "")).rsplit(".", 1)[-1] in INSTALLING_ACTIONS]


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
    vms: list[bake.BakeVM] = []
    try:
        if made_bridge:
            machines.network_up()
        disk, made, fresh = bake.baked_disk(work, image, vms)
        seconds.update(made["seconds"] if fresh else {"bake": 0.0})
        info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(disk)],
                                         text=True, capture_output=True, check=True).stdout)

        # A node of another cluster, from the saved disk (the kernel is booted from outside, as for every VM here).
        t = time.monotonic()
        nspec, nstate, ncluster, volume_id = bake.one_node("vmn", bake.NODE_IP, work / "node", gpus=1, volume=True)
        node_vm = bake.start_vm(ncluster.master.name, bake.NODE_IP, nstate, Image(disk, image.kernel, image.initrd),
                         tap="baked", volume_id=volume_id)  # an overlay over it: the kept disk is not written
        vms.append(node_vm)
        bake.ready(nstate, ncluster, node_vm)
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
    assert set(baked.made["builder_before"]["missing"].split()) == set(bake.BAKED_PACKAGES)
    assert bake.facts(baked.node, baked.node.master)["missing"] == ""
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
    now = bake.facts(c, c.master)
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
