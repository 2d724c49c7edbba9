"""The emulated VMs' base image: stock Debian 12 from debootstrap, booted as a cloud image is.

Built once per machine and kept under CACHE, keyed by a stamp of everything that goes
into it (packages, settings, this file's recipe version): a change to any of them builds
a new one, and the old one is removed. About three minutes from nothing on two cores.

What it holds is what a Debian cloud image holds for these roles (systemd, udev,
openssh-server, sudo, python3, cloud-init, a stock `linux-image-amd64`) plus the NFS
packages the roles would install: the VMs have no route to a package mirror, and the
harness tests the roles' work on a kernel, not apt.

The guest kernel is booted directly (QEMU `-kernel`), with an initramfs of only the
modules a virtio guest needs to find its root and its config drive (`MODULES=list`):
measured on this machine, the kernel stage takes 13 s under emulation against 34 s with
Debian's default initramfs. A reboot inside the guest boots the same kernel again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from deployer.providers.local.host import file_lock
from deployer.providers.local.image import MIRROR

CACHE = Path(os.environ.get("DEPLOYER_VM_CACHE", "/var/cache/deployer-vm"))
SUITE = "bookworm"
RECIPE = 1  # bump when the steps below change in a way the stamp does not see
IMAGE_SIZE = "3G"

PACKAGES = [
    # what a Debian cloud image boots with
    "systemd", "systemd-sysv", "udev", "dbus", "kmod", "ifupdown", "iproute2", "netbase",
    "openssh-server", "sudo", "python3", "python3-apt", "cloud-init", "python3-cffi-backend",
    "e2fsprogs", "util-linux", "procps", "nftables", "initramfs-tools",
    # what the NFS roles install (nfs_server_packages, nfs_client_packages)
    "nfs-kernel-server", "nfs-common",
]
KERNEL_PACKAGE = "linux-image-amd64"
# The initramfs loads only these: the root disk and the volume (virtio-blk on PCI), the
# config drive (an IDE CD-ROM with an ISO 9660 filesystem, as Nova's libvirt driver
# attaches it on an i440fx machine), and the root filesystem.
INITRAMFS_MODULES = ["virtio_pci", "virtio_blk", "virtio_net", "ata_piix", "sr_mod", "cdrom", "isofs", "ext4"]

# A cloud image's own cloud-init settings, as Debian's cloud images ship them: the config
# drive is the only datasource tried (no metadata-service probing on a private bridge).
# The locale is the one the image has; cloud-init otherwise tries to generate en_US.UTF-8.
CLOUD_CFG = """\
# Written by the deployer's VM test harness (tests/vm/image.py).
datasource_list: [ ConfigDrive, None ]
locale: C.UTF-8
"""
FSTAB = "LABEL=root / ext4 defaults,errors=remount-ro 0 1\n"
INTERFACES = "auto lo\niface lo inet loopback\n\nsource /etc/network/interfaces.d/*\n"
# Timers a cloud image runs that would only take the emulated CPU from the test.
MASKED_UNITS = ["apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer",
                "fstrim.timer", "systemd-tmpfiles-clean.timer"]


@dataclass(frozen=True)
class Image:
    disk: Path    # qcow2, the root filesystem (labelled root); VMs boot from overlays of it
    kernel: Path
    initrd: Path


def stamp() -> str:
    text = json.dumps({"recipe": RECIPE, "suite": SUITE, "mirror": MIRROR, "packages": PACKAGES, "kernel": KERNEL_PACKAGE,
                       "modules": INITRAMFS_MODULES, "cloud_cfg": CLOUD_CFG, "fstab": FSTAB, "interfaces": INTERFACES,
                       "masked": MASKED_UNITS, "size": IMAGE_SIZE})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_image(log=print) -> Image:
    """The cached image for today's stamp, built when missing; older builds removed."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with file_lock(CACHE / "image.lock"):
        d = CACHE / f"image-{stamp()}"
        image = Image(d / "root.qcow2", d / "vmlinuz", d / "initrd.img")
        if not (d / "ok").exists():
            log(f"building the VM base image (debootstrap {SUITE}, once; cached in {d})")
            shutil.rmtree(d, ignore_errors=True)
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=CACHE))
            try:
                _build(staging)
                (staging / "ok").write_text(stamp() + "\n")
                staging.rename(d)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        for old in CACHE.glob("image-*"):
            if old != d:
                shutil.rmtree(old, ignore_errors=True)
        return image


def _run(*argv: str, what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(argv, text=True, capture_output=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"VM image: {what} failed ({proc.returncode}):\n{tail}")


@contextlib.contextmanager
def _proc_mounted(rootfs: Path) -> Iterator[None]:
    _run("mount", "-t", "proc", "proc", str(rootfs / "proc"), what="mounting /proc in the chroot")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(rootfs / "proc")], check=False)


def _build(out: Path) -> None:
    rootfs = out / "rootfs"
    _run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), MIRROR,
         what="debootstrap")
    etc = rootfs / "etc"
    # The initramfs is configured before the kernel's package builds it, so it is built once.
    (etc / "initramfs-tools/conf.d/90-vm-harness").write_text("MODULES=list\nCOMPRESS=gzip\n")
    (etc / "initramfs-tools/modules").write_text("\n".join(INITRAMFS_MODULES) + "\n")
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    with _proc_mounted(rootfs):
        _run("chroot", str(rootfs), "apt-get", "install", "-y", "-qq", "--no-install-recommends", KERNEL_PACKAGE,
             what=f"installing {KERNEL_PACKAGE}", env=env)
        _run("chroot", str(rootfs), "apt-get", "clean", what="apt-get clean", env=env)
    (etc / "fstab").write_text(FSTAB)
    (etc / "network/interfaces").write_text(INTERFACES)
    (etc / "network/interfaces.d").mkdir(parents=True, exist_ok=True)
    (etc / "cloud/cloud.cfg.d/90-vm-harness.cfg").write_text(CLOUD_CFG)
    (etc / "hostname").write_text("debian\n")
    # Every VM gets its own machine-id, and its host key from its user-data.
    (etc / "machine-id").write_text("")
    (rootfs / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    for key in (etc / "ssh").glob("ssh_host_*"):
        key.unlink()
    shutil.rmtree(rootfs / "var/lib/cloud", ignore_errors=True)
    for unit in MASKED_UNITS:
        link = etc / "systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    boot = rootfs / "boot"
    shutil.copy2(next(boot.glob("vmlinuz-*")), out / "vmlinuz")
    shutil.copy2(next(boot.glob("initrd.img-*")), out / "initrd.img")
    raw = out / "root.raw"
    _run("mkfs.ext4", "-q", "-L", "root", "-d", str(rootfs), str(raw), IMAGE_SIZE, what="mkfs.ext4 -d")
    _run("qemu-img", "convert", "-O", "qcow2", str(raw), str(out / "root.qcow2"), what="qemu-img convert")
    raw.unlink()
    shutil.rmtree(rootfs)
