"""One node: a Debian system container on an overlay of the base image, seeded with its
user-data as a NoCloud datasource, recorded with the id of the cluster that made it."""

from __future__ import annotations

import ipaddress
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ...nodes import node_name_pattern
from ..base import MachineState
from .host import LXC_PATH, DriverError, file_lock, log, sh
from .image import PipCarry, base_rootfs, carry_ca, ensure_base_image, host_carry, image_lock, write_private


def containers(cluster: str) -> dict[str, MachineState]:
    """The cluster's containers on this host: name -> "running" | "stopped". Two plain
    `lxc-ls` (5 ms each) rather than one --fancy (20 ms): `status` waits for this. A
    failing `lxc-ls` raises (DriverError): an empty answer would read as "no containers"."""
    every = sh("lxc-ls", "-1", quiet=True).stdout
    running = sh("lxc-ls", "-1", "--running", quiet=True).stdout
    return parse_containers(every, running, cluster)


def parse_containers(every: str, running: str, cluster: str) -> dict[str, MachineState]:
    """`lxc-ls -1` and `lxc-ls -1 --running` -> the cluster's nodes and their state."""
    own = re.compile(node_name_pattern(cluster))
    up = set(running.split())
    return {name: ("running" if name in up else "stopped") for name in every.split() if own.match(name)}


def instance_id(name: str) -> str | None:
    """The id the driver gave the container when it made it (its cloud-init instance-id)."""
    meta = "var/lib/cloud/seed/nocloud/meta-data"
    try:  # an overlay node keeps it in its upper dir; a node made before overlays, in its rootfs
        text = next((d / meta).read_text() for d in (LXC_PATH / name / "upper", LXC_PATH / name / "rootfs") if (d / meta).exists())
    except (OSError, StopIteration):
        return None
    for line in text.splitlines():
        if line.startswith("instance-id:"):
            return line.split(":", 1)[1].strip()
    return None


CLUSTER_ID_FILE = "deployer-cluster-id"  # beside the container's config: the id of the cluster that made it


def cluster_id_of(name: str) -> str | None:
    """The id of the cluster that made the container (state.py: cluster_id); None: none
    recorded (no such container, or one made before ids)."""
    try:
        return (LXC_PATH / name / CLUSTER_ID_FILE).read_text().strip() or None
    except OSError:
        return None


def _refuse_another_clusters(name: str, cluster_id: str | None, doing: str) -> None:
    """A container of this name that another cluster made (another state dir, the same
    name) is not this cluster's to start or destroy."""
    theirs = cluster_id_of(name)
    if cluster_id and theirs and theirs != cluster_id:
        raise DriverError(f"[lxc] {name} belongs to another cluster (id {theirs}, not {cluster_id}): not {doing} it; "
                          f"pick another cluster name, or remove it where it was made (`deployer down` there)")


def node_state(name: str) -> str:
    """RUNNING, STOPPED, ... or ABSENT, only when lxc-info says the container does not
    exist. Any other failure is no answer (DriverError): read as "absent", it had the
    node's directory (home dirs, Prometheus data, Slurm state) removed and made anew."""
    proc = sh("lxc-info", "-n", name, "-s", "-H", check=False, quiet=True)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip()
    if proc.returncode != 0 and f"{name} doesn't exist" in proc.stderr:
        return "ABSENT"
    raise DriverError(f"[lxc] cannot tell whether container {name} exists: `lxc-info -n {name}` failed "
                      f"({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip() or 'no answer'}; "
                      f"nothing was changed")


def _memory_key() -> str:
    return "lxc.cgroup2.memory.max" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "lxc.cgroup.memory.limit_in_bytes"


def stable_mac(ip: str) -> str:
    """02:d5:<the four bytes of the address>: locally administered, unique per address."""
    octets = ipaddress.IPv4Interface(ip).ip.packed
    return "02:d5:" + ":".join(f"{b:02x}" for b in octets)


def _fstab(path: str) -> str:
    """A path as an fstab field (LXC reads mount entries with getmntent): a working
    directory with a space in its name otherwise splits the entry."""
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")


def _write_config(name: str, ip: str, gateway: str, bridge: str, shared: str, memory_mb: int, mounts: list[Path], lower: Path) -> None:
    host_shared, guest_shared = shared.split(":", 1)
    lines = [
        "# Written by deployer (providers/local/node.py). A Debian system container with its own systemd.",
        "lxc.include = /usr/share/lxc/config/common.conf",
        "lxc.arch = linux64",
        # The image version below, this node's own writes above (see ensure_base_image).
        f"lxc.rootfs.path = overlay:{lower}:{LXC_PATH / name / 'upper'}",
        f"lxc.uts.name = {name}",
        "lxc.net.0.type = veth",
        f"lxc.net.0.link = {bridge}",
        "lxc.net.0.flags = up",
        "lxc.net.0.name = eth0",
        # A MAC derived from the address: a node recreated at the same IP keeps its MAC,
        # so no neighbour cache (the host's, the master's) points at a dead one.
        f"lxc.net.0.hwaddr = {stable_mac(ip)}",
        f"lxc.net.0.ipv4.address = {ip}",
        f"lxc.net.0.ipv4.gateway = {gateway}",
        f"{_memory_key()} = {memory_mb}M",
        # The shared dir: a host bind mount where NFS mounts it on the cloud. nosuid and nodev
        # here are not applied by LXC 5.0 to a read-write bind (seen: findmnt shows neither), so
        # site.yml remounts it so at every boot (docs/architecture.md, "Security model").
        f"lxc.mount.entry = {_fstab(host_shared)} {_fstab(guest_shared.lstrip('/'))} none bind,create=dir 0 0",
    ]
    if not Path("/sys/kernel/security/apparmor").exists():
        lines.append("lxc.apparmor.profile = unconfined")  # no AppArmor on this host to confine with
    for m in mounts:  # the host's local package folders, read-only
        lines.append(f"lxc.mount.entry = {_fstab(str(m))} {_fstab(str(m).lstrip('/'))} none bind,ro,nosuid,nodev,create=dir 0 0")
    (LXC_PATH / name / "config").write_text("\n".join(lines) + "\n")


@contextmanager
def _mounted(name: str, lower: Path) -> Iterator[None]:
    """The node's overlay mounted on the host for a moment, so its first files go in
    with the image's own directories' owners and modes; LXC mounts it again at start."""
    d = LXC_PATH / name
    sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={d / 'upper'},workdir={d / 'work'}", str(d / "rootfs"))
    try:
        yield
    finally:
        _unmount(name)


def _unmount(name: str) -> None:
    rootfs = LXC_PATH / name / "rootfs"
    if any(line.split()[1] == str(rootfs) for line in Path("/proc/mounts").read_text().splitlines() if len(line.split()) > 1):
        sh("umount", str(rootfs), check=False)


ROOT_PIP_CONF = "root/.config/pip/pip.conf"  # pip reads a user's own after /etc/pip.conf


def _customise(rootfs: Path, pip: PipCarry) -> None:
    """What a site's cloud image would already have: the host's resolver and CA (its
    package sources are in the image, whose stamp changes with them), and its pip
    configuration: /etc/pip.conf for everyone with no credential in it, the options that
    carry one in root's own pip.conf, 0600 (the common role gives the cluster user a copy;
    docs/architecture.md, "Security model")."""
    shutil.copy2("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    carry_ca(rootfs)
    (rootfs / "etc/pip.conf").write_text(pip.public)
    (rootfs / "etc/pip.conf").chmod(0o644)
    if pip.private:
        write_private(rootfs / ROOT_PIP_CONF, pip.private)


def _seed(rootfs: Path, name: str, user_data: Path, iid: str | None) -> None:
    """The NoCloud seed: the node's user-data, and meta-data with the machine's id
    (Terraform's id of the node: it changes whenever the node is made anew, and
    cloud-init runs its once-per-instance modules for a new id)."""
    seed = rootfs / "var/lib/cloud/seed/nocloud"
    seed.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(user_data, seed / "user-data")
    (seed / "user-data").chmod(0o600)  # it holds the node's private host key
    iid = iid or f"iid-{name}-{uuid.uuid4().hex[:12]}"
    (seed / "meta-data").write_text(f"instance-id: {iid}\nlocal-hostname: {name}\n")


@dataclass(frozen=True)
class NodeUp:
    """node-up's arguments, once: Terraform hands them to the driver as its node's
    `input.node` (terraform/local/main.tf, as JSON), LocalProvider.repair builds them in
    Python; tests/unit/test_lxc_driver.py holds main.tf to these fields."""
    name: str
    ip: str  # address/prefix length
    gateway: str
    bridge: str
    shared: str  # host dir:guest dir
    memory_mb: int
    user_data: str  # the node's cloud-init user-data file
    cluster_id: str | None = None  # recorded beside the container; another cluster's is refused
    instance_id: str | None = None  # Terraform's id of the node, seeded as cloud-init's instance-id
    image: str | None = None  # a baked image's name (baked.py); None: the base image


def node_up(a: NodeUp) -> None:
    """Create (when absent) and start the node. Returns once the container runs: like a
    cloud server turning ACTIVE, that is not yet a booted node; the deployer waits for
    SSH with the pinned key and for cloud-init before it configures anything."""
    address = ipaddress.IPv4Interface(a.ip)
    Path(a.shared.split(":", 1)[0]).mkdir(parents=True, exist_ok=True)
    if _left_by_a_failed_creation(a):
        # Terraform makes this node anew (its id is new), and runs no destroy provisioner
        # for the tainted resource of the creation that failed: that container is no node.
        log(f"{a.name}: the container of an earlier, failed creation is in the way; made anew")
        node_down(a.name, a.cluster_id)
    if node_state(a.name) == "ABSENT":
        # New, or left half-made by an interrupted run: (re)build it whole.
        node_create(a.name, a.ip, a.gateway, a.bridge, a.shared, a.memory_mb, Path(a.user_data), a.instance_id, a.cluster_id,
                    image=a.image)
    _refuse_another_clusters(a.name, a.cluster_id, "starting")
    if node_state(a.name) != "RUNNING":
        # A stopped node keeps what cloud-init and Ansible made of it; only start it again.
        sh("lxc-start", "-n", a.name, "-d", "-l", "WARN", "-o", str(LXC_PATH / a.name / "lxc.log"))
    log(f"{a.name} started at {address.ip}")


def _left_by_a_failed_creation(a: NodeUp) -> bool:
    """The container is this cluster's but was seeded with another instance id than the
    one Terraform creates the node with now: what a creation that failed left (Terraform
    gives a node a new id only when it makes it). Without either id, or seeded with the
    driver's own (`iid-<name>-…`: made before Terraform's ids were seeded), it is kept."""
    if not a.instance_id or not a.cluster_id or cluster_id_of(a.name) != a.cluster_id:
        return False
    seeded = instance_id(a.name)
    return seeded is not None and not seeded.startswith("iid-") and seeded != a.instance_id


def node_create(name: str, ip: str, gateway: str, bridge: str, shared: str, memory_mb: int, user_data: Path,
                iid: str | None = None, cluster_id: str | None = None, image: str | None = None) -> None:
    """The node's container, made whole from the current image (or the baked `image`) and
    its seed, not started."""
    from .baked import lower_for

    address = ipaddress.IPv4Interface(ip)
    if not user_data.is_file():
        raise DriverError(f"[lxc] {name}: no user-data at {user_data}; run `deployer up` (it renders it before Terraform)")
    _refuse_another_clusters(name, cluster_id, "rebuilding")  # a half-made one of another cluster included
    ensure_base_image()
    _unmount(name)
    shutil.rmtree(LXC_PATH / name, ignore_errors=True)
    for sub in ("upper", "work", "rootfs"):
        (LXC_PATH / name / sub).mkdir(parents=True)
    pip = host_carry()
    # Shared: no new version is made, and none removed, until this node's config
    # names the one it stands on.
    with file_lock(image_lock(), shared=True):
        lower = lower_for(image) or base_rootfs().resolve()
        with _mounted(name, lower):
            _customise(LXC_PATH / name / "rootfs", pip)
            _seed(LXC_PATH / name / "rootfs", name, user_data, iid)
        if cluster_id:
            (LXC_PATH / name / CLUSTER_ID_FILE).write_text(f"{cluster_id}\n")
        _write_config(name, str(address), gateway, bridge, shared, memory_mb, pip.mounts, lower)  # last: marks it made


def node_down(name: str, cluster_id: str | None = None) -> None:
    _refuse_another_clusters(name, cluster_id, "destroying")
    if node_state(name) != "ABSENT":
        sh("lxc-stop", "-n", name, "-k", check=False, quiet=True)
        sh("lxc-destroy", "-n", name, check=False, quiet=True)
    _unmount(name)
    if (LXC_PATH / name).exists():
        shutil.rmtree(LXC_PATH / name)
    log(f"{name} removed")


def boot_log_hint(name: str) -> str:
    """Where to look when a node does not come up."""
    return (
        f"`lxc-attach -n {name} -- journalctl -b --no-pager` and `lxc-attach -n {name} -- cat /var/log/cloud-init.log`, "
        f"or {LXC_PATH / name / 'lxc.log'}"
    )
