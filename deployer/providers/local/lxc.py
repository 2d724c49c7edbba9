"""The LXC node driver: what Terraform's local-exec provisioners call.

    python -m deployer.providers.local.lxc network-up  --cluster C --bridge B --subnet S --gateway G/P [--only-master IP]
    python -m deployer.providers.local.lxc network-down --cluster C --bridge B
    python -m deployer.providers.local.lxc node-up --name N --ip IP/P --gateway G --bridge B \
        --shared HOST:GUEST --memory-mb M --user-data FILE [--instance-id ID] [--cluster-id CID]
    python -m deployer.providers.local.lxc node-down --name N [--cluster-id CID]
    python -m deployer.providers.local.lxc base-image

Each node is a Debian system container (its own systemd, sshd, hostname, static IP)
on an overlay of a base image built once with debootstrap (made in a moment, whatever N). It boots as a cloud VM does:
the image has Debian's cloud-init, and the node's user-data (deployer/boot.py, the
same text OpenStack hands to Nova) goes in as a NoCloud seed, so cloud-init creates
the user, installs its key and the node's pinned host key. The driver itself writes
only what a cloud image would already have: the host's package sources.

Every command is idempotent: Terraform may re-run a create after an interruption, and
`down` may run twice. Kept free of third-party imports so Terraform can call it
cheaply, many at a time.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import OperationFailed
from ...nodes import node_name_pattern

IMAGE_ROOT = Path(os.environ.get("DEPLOYER_IMAGE_DIR", "/var/lib/deployer/images"))
LXC_PATH = Path("/var/lib/lxc")
SUITE = "bookworm"
MIRROR = os.environ.get("DEPLOYER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What a cloud image has and Ansible needs: systemd, sshd, sudo, python3 (+apt bindings).
BASE_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "sudo", "python3", "python3-apt",
    "iproute2", "iputils-ping", "ca-certificates", "procps", "less", "netbase",
    # Priority important, so in every Debian cloud image: the user-data's byte counter.
    "nftables",
]
# Pre-baked, as a site's golden image would be: the packages the common, mpi,
# training_runtime and node_exporter roles install. The roles still install them (and do
# on OpenStack); here they find them present, so N nodes do not unpack the same packages
# N times on the host's few cores. A baked service is disabled in the image: only its
# role enables it, after writing its flags (monitoring: false leaves nothing listening).
BAKED_DISABLED_SERVICES = ["prometheus-node-exporter.service", "apt-cacher-ng.service"]
PREBAKED_PACKAGES = [
    "openssh-client", "rsync", "iperf3", "curl", "psmisc", "pciutils", "python3-venv",
    "python3-packaging", "openmpi-bin",
    # The mpi role's master-only headers: they cost a fresh master ~25 s of dpkg.
    "libopenmpi-dev",
    "prometheus-node-exporter",
    # The master's package cache (common role), enabled there only.
    "apt-cacher-ng",
    # The cloud's boot path: the node's user-data arrives as a NoCloud seed.
    "cloud-init",
]
# The image carries the host's package sources (_carry_apt) and its lists are made from
# them, so a node finds lists that match its sources. Throwaway containers
# skip dpkg's fsync per file (as eatmydata would) and the lists' translations.
IMAGE_APT_CONF = {
    "dpkg/dpkg.cfg.d/90-deployer-unsafe-io": "force-unsafe-io\n",
    "apt/apt.conf.d/90-deployer-no-translations": 'Acquire::Languages "none";\n',
}
# The lists are refreshed once on the host when older than this, before cloning, so N
# nodes do not fetch and parse the same lists N times. Below the common role's
# cache_valid_time (an hour): the nodes find them fresh and skip their own update.
LISTS_MAX_AGE_S = 1800
APT_STAMP = "var/lib/apt/periodic/update-success-stamp"


def _host_apt_digest() -> str:
    """Of what _carry_apt puts into the image: a change to it makes a new image."""
    sources, proxies = _host_apt_files()
    text = "\n".join(f"{p.name}\n{p.read_text()}" for p in sources + proxies)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# cloud-init in the local image runs in two of its four stages. Each stage is a Python
# process of its own (~0.45 s of CPU to start), and eight nodes boot at once on the
# host's two cores, so at N = 8 boot time is CPU time (scripts/bench_boot.py, side by
# side: 2.5 s of CPU per node with four stages and every stock module, 1.2 s with this;
# eight nodes all booted in 10.4 s against 5.2 s). The local stage exists to write network
# configuration before networking starts: here the driver owns eth0 (network config
# disabled), so the init stage finds the NoCloud seed by itself. The modules the
# user-data needs (deployer/boot.py) all run in init, set_passwords included (so sshd
# starts with its setting already written); final only reports: its stage writes the
# result.json that `cloud-init status` reads, final_message the boot-finished file.
# tests/unit/test_lxc_image.py checks every user-data key still has its module here,
# against the installed cloud-init's schema. A cloud image keeps its own lists.
CLOUD_INIT_MODULES = ["bootcmd", "set_hostname", "update_hostname", "update_etc_hosts", "users_groups", "ssh",
                      "set_passwords"]
CLOUD_FINAL_MODULES = ["final_message"]
# Masked in the image, with the units a container cannot use (no clock, no kernel modules).
MASKED_UNITS = ["cloud-init-local.service", "cloud-config.service",
                "systemd-timesyncd.service", "systemd-modules-load.service"]
# And what the minimal image needs for cloud-init to finish without errors: a datasource
# list (NoCloud only; no metadata-service probing), no network configuration (the
# driver owns eth0).
CLOUD_CFG = f"""\
# Written by deployer (providers/local/lxc.py): the local image boots through NoCloud.
datasource_list: [ NoCloud, None ]
network:
  config: disabled
cloud_init_modules: [{", ".join(CLOUD_INIT_MODULES)}]
cloud_config_modules: []
cloud_final_modules: [{", ".join(CLOUD_FINAL_MODULES)}]
"""
IMAGE_STAMP = json.dumps({"suite": SUITE, "packages": BASE_PACKAGES + PREBAKED_PACKAGES, "apt": IMAGE_APT_CONF,
                          "disabled": BAKED_DISABLED_SERVICES, "masked": MASKED_UNITS, "cloud_cfg": CLOUD_CFG})


class DriverError(OperationFailed):
    """A host command of the driver failed: in the error family, so an in-process caller
    gets exit 1 and one line; only `main` turns it into an exit status."""


# Progress lines go to Terraform's log when the driver runs as a command; called in
# process (repair), the deployer says what happened in its own words.
VERBOSE = False


def log(msg: str) -> None:
    if not VERBOSE:
        return
    print(f"[lxc] {msg}", file=sys.stderr, flush=True)


def sh(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(args), text=True, capture_output=True)
    except OSError as e:  # the tool itself is missing or cannot run
        raise DriverError(f"[lxc] {args[0]} cannot run: {e.strerror}") from None
    if check and proc.returncode != 0:
        raise DriverError(f"[lxc] {shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    if not quiet and proc.stderr.strip() and proc.returncode != 0:
        log(proc.stderr.strip())
    return proc


@contextmanager
def file_lock(path: Path, shared: bool = False) -> Iterator[None]:
    """Exclusive while the image is built or refreshed; shared while a node is cloned from it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)  # waits: parallel node-ups share one image build
        yield


# -- base image -------------------------------------------------------------------
# Versions live side by side under IMAGE_ROOT/SUITE (v<time>/rootfs), `current` names the
# newest. A node is an overlay on one version (its writes in its own upper dir), as a
# cloud server is a copy-on-write disk on its image: made in no time, whatever N. So a
# version is never changed in place: a rebuild or a refresh of the package lists makes
# a new one, and a version goes only when no container's config names it any more.
def image_dir() -> Path:
    return IMAGE_ROOT / SUITE


def base_rootfs() -> Path:
    return image_dir() / "current" / "rootfs"


def image_lock() -> Path:
    return IMAGE_ROOT / f"{SUITE}.lock"


def ensure_base_image() -> Path:
    """Build the Debian base image once (about two minutes); refresh its package lists
    once for all nodes when they are older than LISTS_MAX_AGE_S. Returns the current
    version's rootfs (a real path, not through `current`)."""
    with file_lock(image_lock()):
        todo = image_todo()
        if todo == "build":
            log(f"building the {SUITE} base image with debootstrap (once; cached in {IMAGE_ROOT})")
            _new_version(_build)
        elif todo == "refresh":
            log(f"refreshing the base image's package lists (older than {LISTS_MAX_AGE_S // 60} min; once for every node)")
            _new_version(_refreshed_copy)
        _remove_unused_versions()
        return base_rootfs().resolve()


def _new_version(make: Callable[[Path], None]) -> None:
    d = image_dir()
    d.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=d))
    staging.chmod(0o755)
    try:
        make(staging / "rootfs")
        version = d / f"v{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        staging.rename(version)
        link = d / ".current.tmp"
        link.unlink(missing_ok=True)
        link.symlink_to(version.name)
        link.replace(d / "current")  # atomic: a reader sees the old version or the new
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _build(rootfs: Path) -> None:
    proc = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), MIRROR],
        text=True, capture_output=True,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise DriverError(f"[lxc] debootstrap failed:\n{tail}")
    _finish_image(rootfs)


def _refreshed_copy(rootfs: Path) -> None:
    sh("cp", "-a", "--reflink=auto", str(base_rootfs().resolve()), str(rootfs))
    _refresh_lists(rootfs)


def _remove_unused_versions() -> None:
    """Every entry under the image dir but the current version and those a container
    still stands on (its config names the version's rootfs as its lower layer)."""
    d = image_dir()
    keep = {(d / "current").resolve().name, "current"}
    configs = " ".join(c.read_text(errors="replace") for c in LXC_PATH.glob("*/config"))
    for entry in d.iterdir():
        if entry.name not in keep and str(entry / "rootfs") not in configs:
            log(f"removing the unused image {entry.name}")
            shutil.rmtree(entry, ignore_errors=True)
            if entry.is_symlink() or entry.is_file():
                entry.unlink(missing_ok=True)


def image_todo() -> str | None:
    """What ensure_base_image has to do: "build", "refresh" (its lists) or nothing."""
    if not image_current():
        return "build"
    stamp = base_rootfs() / APT_STAMP
    age = time.time() - stamp.stat().st_mtime if stamp.exists() else float("inf")
    return "refresh" if age > LISTS_MAX_AGE_S else None


def _chroot_apt(rootfs: Path, *cmds: list[str], what: str) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    for cmd in cmds:
        proc = subprocess.run(["chroot", str(rootfs), *cmd], text=True, capture_output=True, env=env)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
            raise DriverError(f"[lxc] {what} failed:\n{tail}")


def _refresh_lists(rootfs: Path) -> None:
    """apt-get update once in the image, stamped as apt's own daily job stamps it
    (the Ansible apt module reads that stamp for cache_valid_time)."""
    shutil.copy2("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    _chroot_apt(rootfs, ["apt-get", "update", "-qq"], what="refreshing the base image's package lists")
    stamp = rootfs / APT_STAMP
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()


def _prebake(rootfs: Path) -> None:
    """apt-get install PREBAKED_PACKAGES in the chroot (debootstrap's --include cannot
    order -dev packages' configuration), with services kept from starting."""
    policy = rootfs / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")  # invoke-rc.d: start nothing in the chroot
    policy.chmod(0o755)
    for rel, text in IMAGE_APT_CONF.items():
        (rootfs / "etc" / rel).write_text(text)
    _carry_apt(rootfs)
    _carry_ca(rootfs)
    _refresh_lists(rootfs)
    _chroot_apt(rootfs, ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PREBAKED_PACKAGES],
                ["systemctl", "disable", *BAKED_DISABLED_SERVICES], what="pre-baking packages into the base image")
    policy.unlink()


def _finish_image(rootfs: Path) -> None:
    _prebake(rootfs)
    # Each node's host key arrives in its user-data.
    for key in (rootfs / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (rootfs / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
    (rootfs / "etc/ssh/sshd_config.d/10-deployer.conf").write_text(
        "# Keys only, as on a cloud image.\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUseDNS no\n"
    )
    (rootfs / "etc/cloud/cloud.cfg.d/90-deployer-local.cfg").write_text(CLOUD_CFG)
    # Every clone must get its own machine-id and a cloud-init that has never run.
    (rootfs / "etc/machine-id").write_text("")
    (rootfs / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    shutil.rmtree(rootfs / "var/lib/cloud", ignore_errors=True)
    for unit in MASKED_UNITS:
        link = rootfs / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    subprocess.run(["chroot", str(rootfs), "apt-get", "clean"], check=False)
    (rootfs / ".deployer-image-ok").write_text(_image_stamp())


def image_current() -> bool:
    """The cached image exists and was built from today's packages, apt settings and host sources."""
    stamp = base_rootfs() / ".deployer-image-ok"
    return stamp.exists() and stamp.read_text() == _image_stamp()


def _image_stamp() -> str:
    """What the image was built from: packages, apt settings and the host's sources."""
    return IMAGE_STAMP + _host_apt_digest()


# -- what the nodes take over from the host ------------------------------------------
def _host_pip_config() -> dict[str, str]:
    """`pip config list` of the host, as key -> value (env-derived keys included)."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], text=True, capture_output=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    conf: dict[str, str] = {}
    for line in out.splitlines():
        if "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.removeprefix(":env:")
        if key.startswith("."):
            key = "global" + key
        value = value.strip().strip("'\"")
        section, _, option = key.partition(".")
        if section == "global" and option != "constraint":  # constraint re-added below when the file exists
            conf[option] = value
        elif option == "constraint":
            conf["constraint"] = value
    return conf


def host_carry() -> tuple[str, list[Path]]:
    """The pip.conf text for the nodes and the host folders it needs (bind-mounted read-only)."""
    conf = _host_pip_config()
    paths: set[Path] = set()
    for option in ("find-links", "extra-index-url", "index-url", "constraint", "cert"):
        for item in conf.get(option, "").split():
            p = Path(item.removeprefix("file://"))
            if item.startswith(("/", "file://")) and p.exists():
                # A PEP 503 index folder links to files beside it (../files): take its parent.
                paths.add(p.parent if p.name == "simple" or not p.is_dir() else p)
    text = "# Carried over from the host by deployer, so nodes reach the same package sources.\n[global]\n"
    text += "".join(f"{k} = {v}\n" for k, v in sorted(conf.items()))
    # The CA bundle is copied into the node at the same path, not mounted.
    ca = Path("/etc/ssl/certs")
    return text, sorted(p for p in paths if p != ca and not str(p).startswith("/etc/ssl"))


def _host_apt_files() -> tuple[list[Path], list[Path]]:
    """The host's Debian package sources (third-party repositories are not for the nodes)
    and its apt proxy settings."""
    src = Path("/etc/apt")
    lists = [src / "sources.list", *sorted((src / "sources.list.d").glob("*"))]
    debian = [p for p in lists if p.is_file() and "debian" in p.read_text() and "nodesource" not in p.name]
    return debian, sorted((src / "apt.conf.d").glob("*proxy*"))


def _carry_apt(rootfs: Path) -> None:
    """Into the image (nodes inherit it): the image's lists are made from these sources."""
    dst = rootfs / "etc/apt"
    debian, proxies = _host_apt_files()
    if debian:
        (dst / "sources.list").write_text("")
        for p in debian:
            target = dst / ("sources.list" if p.name == "sources.list" else f"sources.list.d/{p.name}")
            shutil.copy2(p, target)
    for conf in proxies:
        shutil.copy2(conf, dst / "apt.conf.d" / conf.name)


def _carry_ca(rootfs: Path) -> None:
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.exists():
        shutil.copy2(bundle, rootfs / "etc/ssl/certs/ca-certificates.crt")
    extra = Path("/usr/local/share/ca-certificates")
    if extra.is_dir():
        shutil.copytree(extra, rootfs / "usr/local/share/ca-certificates", dirs_exist_ok=True)


# -- network ------------------------------------------------------------------------
TABLE_PREFIX = "deployer_"


def nft_table(cluster: str) -> str:
    return TABLE_PREFIX + cluster.replace("-", "_")


def network_up(cluster: str, bridge: str, subnet: str, gateway: str, only_master: str | None = None) -> None:
    if sh("ip", "link", "show", bridge, check=False, quiet=True).returncode != 0:
        sh("ip", "link", "add", bridge, "type", "bridge")
    have = sh("ip", "-4", "-o", "addr", "show", "dev", bridge, quiet=True).stdout
    if gateway.split("/")[0] + "/" not in have:
        sh("ip", "addr", "add", gateway, "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    forwarding_on()
    table = nft_table(cluster)
    # Recreated whole on every run, so a re-run converges and never duplicates rules.
    rules = ruleset(cluster, bridge, subnet, only_master)
    sh("nft", "delete", "table", "ip", table, check=False, quiet=True)
    proc = subprocess.run(["nft", "-f", "-"], input=rules, text=True, capture_output=True)
    if proc.returncode != 0:
        raise DriverError(f"[lxc] nft failed: {proc.stderr.strip()}")
    log(f"network {bridge} {gateway} with NAT table {table}")


def ruleset(cluster: str, bridge: str, subnet: str, only_master: str | None = None) -> str:
    """The cluster's nftables table: NAT to the host's networks, forwarding, and with
    `only_master` the rule that keeps the host off the workers.

    Forwarding: the nodes may open connections out; from elsewhere only replies come in
    (the host is no router into the cluster network). The chain's policy stays accept and
    the drop names the bridge: a drop policy in a base chain would drop every forwarded
    packet on this machine, other bridges' and other clusters' too."""
    table = nft_table(cluster)
    return f"""
table ip {table} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {subnet} ip daddr != {subnet} masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname "{bridge}" accept
    oifname "{bridge}" ct state established,related accept
    oifname "{bridge}" drop
  }}{_isolation(bridge, only_master)}
}}
"""


def _isolation(bridge: str, only_master: str | None) -> str:
    """access: via_master — the host may open connections to the master only, as a
    laptop reaches a cloud cluster through the master's floating IP. Replies to
    connections the nodes open (package mirrors on the host) still pass."""
    if not only_master:
        return ""
    return f"""
  chain output {{
    type filter hook output priority filter; policy accept;
    oifname "{bridge}" ip daddr != {only_master} ct state new reject
  }}"""


def network_down(cluster: str, bridge: str) -> None:
    sh("nft", "delete", "table", "ip", nft_table(cluster), check=False, quiet=True)
    sh("ip", "link", "del", bridge, check=False, quiet=True)
    forwarding_restored()
    log(f"network {bridge} removed")


# The nodes reach the host's networks through it: IPv4 forwarding, a host-wide switch.
# Turned on by the first cluster when it was off (the mark says so), and off again by the
# last cluster's `down`; left alone when it was on before (a router, Docker, a VM host).
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
FORWARD_MARK = Path("/var/lib/deployer/ip_forward-was-off")


def forwarding_on() -> None:
    if IP_FORWARD.read_text().strip() != "1":
        FORWARD_MARK.parent.mkdir(parents=True, exist_ok=True)
        FORWARD_MARK.touch()
        IP_FORWARD.write_text("1\n")


def forwarding_restored() -> None:
    if not FORWARD_MARK.exists():
        return
    proc = sh("nft", "list", "tables", check=False, quiet=True)
    if proc.returncode != 0 or f"ip {TABLE_PREFIX}" in proc.stdout:  # another cluster still needs it (or cannot tell)
        return
    IP_FORWARD.write_text("0\n")
    FORWARD_MARK.unlink(missing_ok=True)


# -- nodes --------------------------------------------------------------------------
def nft_table_exists(cluster: str) -> bool:
    """Whether the cluster's table is there; DriverError when nft cannot tell (any other
    failure than "No such file or directory" must not read as "gone": `down` trusts it)."""
    proc = sh("nft", "list", "table", "ip", nft_table(cluster), check=False, quiet=True)
    if proc.returncode == 0:
        return True
    if "No such file or directory" in proc.stderr:
        return False
    raise DriverError(f"[lxc] cannot tell whether nftables table ip {nft_table(cluster)} exists: "
                      f"`nft list table` failed ({proc.returncode}): {proc.stderr.strip() or 'no message'}")


def containers(cluster: str) -> dict[str, str]:
    """The cluster's containers on this host: name -> "running" | "stopped". Two plain
    `lxc-ls` (5 ms each) rather than one --fancy (20 ms): `status` waits for this. A
    failing `lxc-ls` raises (DriverError): an empty answer would read as "no containers"."""
    every = sh("lxc-ls", "-1", quiet=True).stdout
    running = sh("lxc-ls", "-1", "--running", quiet=True).stdout
    return parse_containers(every, running, cluster)


def parse_containers(every: str, running: str, cluster: str) -> dict[str, str]:
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
    proc = sh("lxc-info", "-n", name, "-s", "-H", check=False, quiet=True)
    return proc.stdout.strip() if proc.returncode == 0 else "ABSENT"


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
        "# Written by deployer (providers/local/lxc.py). A Debian system container with its own systemd.",
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
        # The shared dir: a host bind mount where NFS mounts it on the cloud.
        f"lxc.mount.entry = {_fstab(host_shared)} {_fstab(guest_shared.lstrip('/'))} none bind,create=dir 0 0",
    ]
    if not Path("/sys/kernel/security/apparmor").exists():
        lines.append("lxc.apparmor.profile = unconfined")  # no AppArmor on this host to confine with
    for m in mounts:  # the host's local package folders, read-only
        lines.append(f"lxc.mount.entry = {_fstab(str(m))} {_fstab(str(m).lstrip('/'))} none bind,ro,create=dir 0 0")
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


def _customise(rootfs: Path, pip_conf: str) -> None:
    """What a site's cloud image would already have: the host's resolver and CA (its
    package sources are in the image, whose stamp changes with them)."""
    shutil.copy2("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    _carry_ca(rootfs)
    (rootfs / "etc/pip.conf").write_text(pip_conf)


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


def node_up(name: str, ip: str, gateway: str, bridge: str, shared: str, memory_mb: int, user_data: Path,
            iid: str | None = None, cluster_id: str | None = None) -> None:
    """Create (when absent) and start the node. Returns once the container runs: like a
    cloud server turning ACTIVE, that is not yet a booted node; the deployer waits for
    SSH with the pinned key and for cloud-init before it configures anything."""
    address = ipaddress.IPv4Interface(ip)
    Path(shared.split(":", 1)[0]).mkdir(parents=True, exist_ok=True)
    if node_state(name) == "ABSENT":
        # New, or left half-made by an interrupted run: (re)build it whole.
        node_create(name, ip, gateway, bridge, shared, memory_mb, user_data, iid, cluster_id)
    _refuse_another_clusters(name, cluster_id, "starting")
    if node_state(name) != "RUNNING":
        # A stopped node keeps what cloud-init and Ansible made of it; only start it again.
        sh("lxc-start", "-n", name, "-d", "-l", "WARN", "-o", str(LXC_PATH / name / "lxc.log"))
    log(f"{name} started at {address.ip}")


def node_create(name: str, ip: str, gateway: str, bridge: str, shared: str, memory_mb: int, user_data: Path,
                iid: str | None = None, cluster_id: str | None = None) -> None:
    """The node's container, made whole from the current image and its seed, not started."""
    address = ipaddress.IPv4Interface(ip)
    if not user_data.is_file():
        raise DriverError(f"[lxc] {name}: no user-data at {user_data}; run `deployer up` (it renders it before Terraform)")
    _refuse_another_clusters(name, cluster_id, "rebuilding")  # a half-made one of another cluster included
    ensure_base_image()
    _unmount(name)
    shutil.rmtree(LXC_PATH / name, ignore_errors=True)
    for sub in ("upper", "work", "rootfs"):
        (LXC_PATH / name / sub).mkdir(parents=True)
    pip_conf, mounts = host_carry()
    # Shared: no new version is made, and none removed, until this node's config
    # names the one it stands on.
    with file_lock(image_lock(), shared=True):
        lower = base_rootfs().resolve()
        with _mounted(name, lower):
            _customise(LXC_PATH / name / "rootfs", pip_conf)
            _seed(LXC_PATH / name / "rootfs", name, user_data, iid)
        if cluster_id:
            (LXC_PATH / name / CLUSTER_ID_FILE).write_text(f"{cluster_id}\n")
        _write_config(name, str(address), gateway, bridge, shared, memory_mb, mounts, lower)  # last: marks it made


def node_down(name: str, cluster_id: str | None = None) -> None:
    _refuse_another_clusters(name, cluster_id, "destroying")
    if node_state(name) != "ABSENT":
        sh("lxc-stop", "-n", name, "-k", check=False, quiet=True)
        sh("lxc-destroy", "-n", name, check=False, quiet=True)
    _unmount(name)
    if (LXC_PATH / name).exists():
        shutil.rmtree(LXC_PATH / name)
    log(f"{name} removed")


def cpu_plan(cpus: list[int], nodes: int) -> list[str] | None:
    """Cores of its own for each node (cpuset lists, node i in order), or None when there
    are fewer cores than nodes and they must share them all. Cores left over stay free."""
    if nodes < 1 or len(cpus) < nodes:
        return None
    k = len(cpus) // nodes
    return [",".join(str(c) for c in cpus[i * k:(i + 1) * k]) for i in range(nodes)]


def pin_cpus(names: list[str], cpus: list[int]) -> list[str] | None:
    """Apply cpu_plan to the running nodes (cgroup cpuset, live: no restart); without a
    plan every node gets every core back. Applied on every `up`, so it follows the
    cluster's size and survives a restart. Returns the plan."""
    plan = cpu_plan(cpus, len(names))
    everything = ",".join(map(str, cpus))
    for i, name in enumerate(names):
        if node_state(name) == "RUNNING":
            sh("lxc-cgroup", "-n", name, "cpuset.cpus", plan[i] if plan else everything)
    return plan


def boot_log_hint(name: str) -> str:
    """Where to look when a node does not come up."""
    return f"`lxc-attach -n {name} -- journalctl -b --no-pager` and `lxc-attach -n {name} -- cat /var/log/cloud-init.log`, or {LXC_PATH / name / 'lxc.log'}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployer.providers.local.lxc", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    nu = sub.add_parser("network-up")
    nd = sub.add_parser("network-down")
    for sp in (nu, nd):
        sp.add_argument("--cluster", required=True)
        sp.add_argument("--bridge", required=True)
    nu.add_argument("--subnet", required=True)
    nu.add_argument("--gateway", required=True)
    nu.add_argument("--only-master", help="drop host -> node traffic except to this address (access: via_master)")
    up = sub.add_parser("node-up")
    for flag in ("--name", "--ip", "--gateway", "--bridge", "--shared"):
        up.add_argument(flag, required=True)
    up.add_argument("--memory-mb", type=int, required=True)
    up.add_argument("--user-data", type=Path, required=True)
    up.add_argument("--instance-id", help="the node's identity (Terraform's id of it), seeded as cloud-init's instance-id")
    down = sub.add_parser("node-down")
    down.add_argument("--name", required=True)
    for sp in (up, down):
        sp.add_argument("--cluster-id", help="the cluster's id (state.py): recorded on create; another's container is refused")
    sub.add_parser("base-image")
    a = p.parse_args(argv)
    global VERBOSE
    VERBOSE = True
    try:
        _dispatch(a)
    except DriverError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def _dispatch(a: argparse.Namespace) -> None:
    if a.cmd == "network-up":
        network_up(a.cluster, a.bridge, a.subnet, a.gateway, a.only_master)
    elif a.cmd == "network-down":
        network_down(a.cluster, a.bridge)
    elif a.cmd == "node-up":
        node_up(a.name, a.ip, a.gateway, a.bridge, a.shared, a.memory_mb, a.user_data, a.instance_id, a.cluster_id)
    elif a.cmd == "node-down":
        node_down(a.name, a.cluster_id)
    elif a.cmd == "base-image":
        print(ensure_base_image())


if __name__ == "__main__":
    sys.exit(main())
