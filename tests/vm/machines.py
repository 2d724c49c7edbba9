"""Emulated VMs booted the way Nova's libvirt driver boots a server, for the roles that need
a kernel of their own (NFS server and client, reboots). A test harness, not a provider:
under QEMU's software emulation (TCG) a VM boots in about a minute and runs Ansible
several times slower than a cloud VM.

What a VM gets, as on OpenStack:
- SMBIOS system information `OpenStack Foundation` / `OpenStack Nova` and the server's
  UUID (cloud-init's ConfigDrive datasource and `ds-identify` read them);
- a config drive: an ISO 9660 filesystem labelled `config-2` with
  `openstack/latest/{meta_data,network_data}.json` and `user_data` (the node's user-data
  from deployer/pipeline/boot.py, byte for byte what Terraform hands Nova), on an IDE CD-ROM;
- the root disk as the first virtio disk (`vda`, the lowest PCI address);
- the shared volume (the master only) as a virtio disk whose serial is the Cinder volume's
  UUID, so the guest names it `/dev/disk/by-id/virtio-<first 20 characters>` as it names
  an attached Cinder volume;
- one NIC on a private bridge, its address given in `network_data.json` (Neutron's port).

Everything the harness makes (bridge, taps, QEMU processes, overlays) is under one prefix
and one run directory, and `cleanup()` removes it, leftovers of a killed run included.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .image import CACHE, Image

BRIDGE = "dplvm0"
TAP_PREFIX = "dplvm-"
SUBNET = ipaddress.IPv4Network("10.251.0.0/24")
GATEWAY = SUBNET[1]
RUN_DIR = CACHE / "run"  # pidfiles, overlays, volumes, config drives, consoles of the VMs running now
MEMORY_MB = 640
# A smaller translation cache than QEMU's default (a quarter of guest RAM... or 1 GiB):
# each VM stays near 540 MB of host memory, measured.
TCG = "tcg,tb-size=128"
VOLUME_SIZE = "2G"


@dataclass
class VM:
    name: str
    ip: ipaddress.IPv4Address
    user_data: Path
    volume_id: str | None = None  # the master's shared volume (a Cinder volume's UUID)
    server_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_mb: int = MEMORY_MB
    cpus: int = 1  # more than one: QEMU's multi-threaded TCG, a host thread each

    @property
    def dir(self) -> Path:
        return RUN_DIR / self.name

    @property
    def tap(self) -> str:
        # Interface names are at most 15 characters.
        return (TAP_PREFIX + self.name.rsplit("-", 1)[-1])[:15]

    @property
    def mac(self) -> str:
        return "52:54:00:" + ":".join(f"{b:02x}" for b in self.ip.packed[1:])

    @property
    def console(self) -> Path:
        return self.dir / "console.log"

    @property
    def pidfile(self) -> Path:
        return self.dir / "qemu.pid"

    @property
    def qmp(self) -> Path:
        return self.dir / "qmp.sock"

    @property
    def root_disk(self) -> Path:
        return self.dir / "root.qcow2"  # an overlay on the image the VM was started from


def network_up() -> None:
    """The private bridge (the host at .1: it plays the master's floating IP's router) and no route out."""
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{GATEWAY}/{SUBNET.prefixlen}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def start(vm: VM, image: Image) -> None:
    vm.dir.mkdir(parents=True, exist_ok=True)
    overlay = vm.root_disk
    _run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(image.disk), str(overlay))
    drive = config_drive(vm)
    _ip("tuntap", "add", "dev", vm.tap, "mode", "tap")
    _ip("link", "set", vm.tap, "master", BRIDGE)
    _ip("link", "set", vm.tap, "up")
    argv = [
        "qemu-system-x86_64", "-name", vm.name, "-machine", "pc", "-accel", TCG,
        "-m", str(vm.memory_mb), "-smp", str(vm.cpus), "-nodefaults", "-no-user-config", "-vga", "none", "-display", "none",
        "-uuid", vm.server_id,
        "-smbios", f"type=1,manufacturer=OpenStack Foundation,product=OpenStack Nova,uuid={vm.server_id},serial={vm.server_id}",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd),
        "-append", "root=/dev/vda ro console=ttyS0 net.ifnames=0",
        "-serial", f"file:{vm.console}",
        "-drive", f"if=none,id=root,file={overlay},format=qcow2,cache=unsafe",
        "-device", "virtio-blk-pci,drive=root,addr=0x4",
        "-netdev", f"tap,id=net0,ifname={vm.tap},script=no,downscript=no",
        "-device", f"virtio-net-pci,netdev=net0,mac={vm.mac},addr=0x3",
        "-drive", f"file={drive},if=ide,media=cdrom,readonly=on",
        # QMP: power_off() presses the ACPI power button, as Nova's stop does.
        "-qmp", f"unix:{vm.qmp},server=on,wait=off",
        "-pidfile", str(vm.pidfile), "-daemonize",
    ]
    if vm.volume_id:
        volume = vm.dir / "volume.qcow2"  # blank, as a new Cinder volume is
        _run("qemu-img", "create", "-q", "-f", "qcow2", str(volume), VOLUME_SIZE)
        # The serial goes on -device (QEMU 7.2 refuses it on -drive); the guest sees its first 20 bytes.
        argv += ["-drive", f"if=none,id=vol,file={volume},format=qcow2,cache=unsafe",
                 "-device", f"virtio-blk-pci,drive=vol,serial={vm.volume_id},addr=0x6"]
    _run(*argv)


def power_off(vm: VM, timeout_s: float = 300) -> None:
    """A clean shutdown by the guest (the ACPI power button, as Nova's `stop`); returns once
    QEMU has exited, its disks closed."""
    pid = int(vm.pidfile.read_text().strip())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(vm.qmp))
        f = s.makefile("rw")
        f.readline()  # the greeting
        for command in ("qmp_capabilities", "system_powerdown"):
            f.write(json.dumps({"execute": command}) + "\n")
            f.flush()
            while "return" not in (reply := json.loads(f.readline())):
                if "error" in reply:
                    raise RuntimeError(f"{vm.name}: QMP {command}: {reply['error']}")
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{vm.name} did not power off in {timeout_s:.0f} s (console: {vm.console})")
        time.sleep(0.5)


def save_disk(vm: VM, dest: Path) -> None:
    """The stopped VM's disk as a standalone qcow2 (its overlay and the image under it, merged)."""
    _run("qemu-img", "convert", "-O", "qcow2", str(vm.root_disk), str(dest))


def stop(vm: VM) -> None:
    """This VM alone: its QEMU, tap and files (cleanup() is every VM of the harness)."""
    if vm.pidfile.exists():
        _kill(vm.pidfile)
    subprocess.run(["ip", "link", "del", vm.tap], check=False, capture_output=True)
    shutil.rmtree(vm.dir, ignore_errors=True)


def network_exists() -> bool:
    return subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0


def config_drive(vm: VM) -> Path:
    """The ISO Nova writes for `config_drive = true`, in the layout cloud-init reads."""
    src = Path(tempfile.mkdtemp(prefix="config-drive-", dir=vm.dir))
    latest = src / "openstack" / "latest"
    latest.mkdir(parents=True)
    meta = {"uuid": vm.server_id, "name": vm.name, "hostname": vm.name, "launch_index": 0,
            "availability_zone": "nova", "project_id": "vmharness", "meta": {}, "devices": []}
    link = {"id": "tap0", "vif_id": str(uuid.uuid4()), "type": "ovs", "mtu": 1500, "ethernet_mac_address": vm.mac}
    network = {
        "links": [link],
        "networks": [{"id": "network0", "type": "ipv4", "link": "tap0", "ip_address": str(vm.ip),
                      "netmask": str(SUBNET.netmask), "routes": [], "network_id": str(uuid.uuid4())}],
        "services": [],
    }
    (latest / "meta_data.json").write_text(json.dumps(meta))
    (latest / "network_data.json").write_text(json.dumps(network))
    shutil.copy(vm.user_data, latest / "user_data")
    iso = vm.dir / "config-drive.iso"
    _run("genisoimage", "-quiet", "-o", str(iso), "-V", "config-2", "-J", "-R", str(src))
    shutil.rmtree(src)
    return iso


def cleanup() -> None:
    """Stop every VM of the harness and remove its taps, bridge and disks (a killed run's too)."""
    for pidfile in RUN_DIR.glob("*/qemu.pid"):
        _kill(pidfile)
    links = subprocess.run(["ip", "-o", "link", "show"], text=True, capture_output=True).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(TAP_PREFIX) or name == BRIDGE:
            subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)
    shutil.rmtree(RUN_DIR, ignore_errors=True)


def _kill(pidfile: Path) -> None:
    try:
        pid = int(pidfile.read_text().strip())
        # Only a QEMU: a pid left in a stale file may belong to something else by now.
        if "qemu-system" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
            return
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def _ip(*args: str) -> None:
    _run("ip", *args)


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, text=True, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}… failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()[-2000:]}")
