"""The roles that only run on OpenStack, run for real on two emulated VMs (tests/vm/conftest.py):
the master formats, mounts and exports the shared volume found by its serial, the worker
mounts the export, and the NVIDIA role's reboot path restarts both, workers first, with
the shared dir back afterwards. LXC nodes cannot run any of it: they share this host's
kernel, which has no NFS server.

Before the fix of /etc/exports.d (the nfs_server role's export.yml), the storage play
failed here at "Export the shared directory to the cluster subnet": Debian's
nfs-kernel-server ships no /etc/exports.d, and the template module makes no parent.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest

from deployer.tools.ansible import PlayResult

from .conftest import VMCluster, site_play

FAKE_KERNEL = "0.0.0-deployer-vm-test"


@dataclass
class Storage:
    exports_dir_before: bool
    blkid_rc_before: int
    result: PlayResult


@pytest.fixture(scope="module")
def storage(vm_cluster: VMCluster) -> Storage:
    """The shared-storage play of site.yml, once, with what the nodes looked like before it."""
    c = vm_cluster
    exports_dir = c.ssh(c.master, "test -e /etc/exports.d").returncode == 0
    blkid = c.ssh(c.master, f"sudo blkid -p {c.cluster.shared_device}").returncode
    return Storage(exports_dir, blkid, c.play([site_play("The shared dir over NFS"), site_play("Shared storage")], "storage"))


def test_the_master_exports_the_volume_and_the_worker_reads_through_nfs(vm_cluster: VMCluster, storage: Storage):
    c = vm_cluster
    # As Nova hands them over: the NFS package present but no exports dir, the volume blank (blkid: 2).
    assert not storage.exports_dir_before
    assert storage.blkid_rc_before == 2
    assert not storage.result.failures, storage.result.failures

    # The volume, found by its serial, formatted once and mounted at the shared dir.
    source, fstype, label = c.sudo(c.master, "findmnt -n -o SOURCE,FSTYPE,LABEL --mountpoint /shared").split()
    assert (source, fstype, label) == ("/dev/vdb", "ext4", "deployer-shared")
    exports = c.sudo(c.master, "exportfs -v")
    assert "/shared" in exports and c.cluster.cluster_cidr in exports and "root_squash" in exports, exports
    assert c.sudo(c.worker, "findmnt -n -o SOURCE,FSTYPE --mountpoint /shared").split() == [
        f"{c.cluster.master.private_ip}:/shared", "nfs4"]
    # A set-uid file or device node in the shared dir works on no worker.
    assert {"nosuid", "nodev"} <= set(c.sudo(c.worker, "findmnt -n -o OPTIONS --mountpoint /shared").strip().split(","))

    # Written by the cluster user on one node, read on the other, both ways.
    token = uuid.uuid4().hex
    assert c.ssh(c.master, f"echo {token} > /shared/from-master").returncode == 0
    assert c.ssh(c.worker, "cat /shared/from-master").stdout.strip() == token
    assert c.ssh(c.worker, f"echo {token} > /shared/from-worker").returncode == 0
    assert c.ssh(c.master, "cat /shared/from-worker").stdout.strip() == token
    # root_squash: root on a worker is nobody on the share, which the cluster user owns (0755).
    assert c.sudo(c.master, "stat -c %U:%a /shared").strip() == f"{c.cluster.ssh_user}:755"
    root = c.ssh(c.worker, "sudo touch /shared/by-worker-root")
    assert root.returncode != 0 and "Permission denied" in root.stderr, root


def test_the_storage_play_again_changes_nothing(vm_cluster: VMCluster, storage: Storage):
    again = vm_cluster.play([site_play("The shared dir over NFS"), site_play("Shared storage")], "storage-again")
    assert not again.failures, again.failures
    assert again.total_changed == 0, again.changed


def test_a_pending_driver_reboots_workers_first_and_the_shared_dir_comes_back(vm_cluster: VMCluster, storage: Storage):
    """reboot_pending.yml finds a module built for a kernel that is not running (what a
    kernel upgraded with the driver leaves) and the role's handlers reboot the nodes."""
    c = vm_cluster
    assert not storage.result.failures, storage.result.failures
    token = uuid.uuid4().hex
    assert c.ssh(c.master, f"echo {token} > /shared/before-reboot").returncode == 0
    boot_ids = {n: c.sudo(n, "cat /proc/sys/kernel/random/boot_id").strip() for n in (c.master, c.worker)}
    fake = f"/lib/modules/{FAKE_KERNEL}/updates/dkms"
    for n in (c.master, c.worker):
        c.sudo(n, f"mkdir -p {fake} && touch {fake}/nvidia.ko")
    try:
        play = {
            "name": "The NVIDIA role's reboot path, without a GPU",
            "hosts": "all",
            "become": True,
            "tasks": [{"name": "Tell whether the installed driver waits for a reboot",
                       "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "reboot_pending.yml"}}],
        }
        t0 = time.monotonic()
        result = c.play([play], "reboot")
        print(f"both nodes rebooted in {time.monotonic() - t0:.0f} s")
        assert not result.failures, result.failures
    finally:
        for n in (c.master, c.worker):
            c.ssh(n, f"sudo rm -rf /lib/modules/{FAKE_KERNEL}", timeout=600)

    booted = {n: c.sudo(n, "cat /proc/sys/kernel/random/boot_id").strip() for n in (c.master, c.worker)}
    assert all(booted[n] != boot_ids[n] for n in booted), "a node was not rebooted"
    # Workers first: they are reached through the master, which goes last.
    since = {n: float(c.sudo(n, "echo $(( $(date +%s) - $(cut -d. -f1 /proc/uptime) ))")) for n in booted}
    assert since[c.worker] < since[c.master], since

    # Both mount units are enabled: the volume and the export are back without Ansible.
    assert c.sudo(c.master, "findmnt -n -o SOURCE --mountpoint /shared").strip() == "/dev/vdb"
    # The worker's hard mount waits out the restarted server's NFSv4 grace period (90 s).
    assert c.ssh(c.worker, "cat /shared/before-reboot", timeout=300).stdout.strip() == token
