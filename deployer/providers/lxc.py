"""The LXC node driver: what Terraform's local-exec provisioners call.

    python -m deployer.providers.lxc network-up  --cluster C --bridge B --subnet S --gateway G/P [--only-master IP]
    python -m deployer.providers.lxc network-down --cluster C --bridge B
    python -m deployer.providers.lxc node-up --name N --ip IP/P --gateway G --bridge B \
        --shared HOST:GUEST --memory-mb M --user-data FILE [--instance-id ID]
    python -m deployer.providers.lxc node-down --name N
    python -m deployer.providers.lxc base-image

Each node is a Debian system container (its own systemd, sshd, hostname, static IP)
cloned from a base image built once with debootstrap. It boots as a cloud VM does:
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
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import OperationFailed
from ..nodes import node_name_pattern

IMAGE_ROOT = Path(os.environ.get("DEPLOYER_IMAGE_DIR", "/var/lib/deployer/images"))
LXC_PATH = Path("/var/lib/lxc")
SUITE = "bookworm"
MIRROR = os.environ.get("DEPLOYER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What a cloud image has and Ansible needs: systemd, sshd, sudo, python3 (+apt bindings).
BASE_PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "sudo", "python3", "python3-apt",
    "iproute2", "iputils-ping", "ca-certificates", "procps", "less", "netbase",
]
# Pre-baked, as a site's golden image would be: the packages the common, mpi and
# training_runtime roles install on every node. The roles still install them (and do
# on OpenStack); here they only find them present, so N nodes do not unpack the same
# packages N times on the host's few cores. Nothing that starts a service is baked
# (monitoring: false must deploy no exporter).
PREBAKED_PACKAGES = [
    "openssh-client", "rsync", "iperf3", "curl", "psmisc", "pciutils", "python3-venv",
    "python3-packaging", "openmpi-bin",
    # The cloud's boot path: the node's user-data arrives as a NoCloud seed.
    "cloud-init",
]
IMAGE_STAMP = json.dumps({"suite": SUITE, "packages": BASE_PACKAGES + PREBAKED_PACKAGES})
# What the minimal image needs for cloud-init to finish without errors: a datasource
# list (NoCloud only; no metadata-service probing), no network configuration (the
# driver owns eth0) and a locale that exists without locale-gen.
CLOUD_CFG = """\
# Written by deployer (providers/lxc.py): the local image boots through NoCloud.
datasource_list: [ NoCloud, None ]
network:
  config: disabled
locale: C.UTF-8
"""


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
    proc = subprocess.run(list(args), text=True, capture_output=True)
    if check and proc.returncode != 0:
        raise DriverError(f"[lxc] {shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    if not quiet and proc.stderr.strip() and proc.returncode != 0:
        log(proc.stderr.strip())
    return proc


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # waits: parallel node-ups share one image build
        yield


# -- base image -------------------------------------------------------------------
def base_rootfs() -> Path:
    return IMAGE_ROOT / SUITE / "rootfs"


def ensure_base_image() -> Path:
    """Build the Debian base rootfs once (about a minute), then reuse it for every node."""
    rootfs = base_rootfs()
    with file_lock(IMAGE_ROOT / f"{SUITE}.lock"):
        if image_current():
            return rootfs
        staging = Path(tempfile.mkdtemp(prefix=f"{SUITE}-", dir=IMAGE_ROOT))
        try:
            log(f"building the {SUITE} base image with debootstrap (once; cached in {IMAGE_ROOT})")
            proc = subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(staging / "rootfs"), MIRROR],
                text=True, capture_output=True,
            )
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
                raise DriverError(f"[lxc] debootstrap failed:\n{tail}")
            _finish_image(staging / "rootfs")
            if rootfs.exists():
                shutil.rmtree(rootfs.parent)
            rootfs.parent.mkdir(parents=True, exist_ok=True)
            (staging / "rootfs").rename(rootfs)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return rootfs


def _prebake(rootfs: Path) -> None:
    """apt-get install PREBAKED_PACKAGES in the chroot (debootstrap's --include cannot
    order -dev packages' configuration), with services kept from starting."""
    policy = rootfs / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")  # invoke-rc.d: start nothing in the chroot
    policy.chmod(0o755)
    shutil.copy2("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PREBAKED_PACKAGES]):
        proc = subprocess.run(["chroot", str(rootfs), *cmd], text=True, capture_output=True, env=env)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
            raise DriverError(f"[lxc] pre-baking packages into the base image failed:\n{tail}")
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
    # Containers cannot set the clock or load modules; silence the units that try.
    for unit in ("systemd-timesyncd.service", "systemd-modules-load.service"):
        link = rootfs / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    subprocess.run(["chroot", str(rootfs), "apt-get", "clean"], check=False)
    (rootfs / ".deployer-image-ok").write_text(IMAGE_STAMP)


def image_current() -> bool:
    """The cached image exists and was built from today's package lists."""
    stamp = base_rootfs() / ".deployer-image-ok"
    return stamp.exists() and stamp.read_text() == IMAGE_STAMP


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


def _carry_apt(rootfs: Path) -> None:
    """Debian package sources of the host (third-party repositories are not for the nodes)."""
    dst = rootfs / "etc/apt"
    src = Path("/etc/apt")
    lists = [src / "sources.list", *sorted((src / "sources.list.d").glob("*"))]
    debian = [p for p in lists if p.is_file() and "debian" in p.read_text() and "nodesource" not in p.name]
    if debian:
        (dst / "sources.list").write_text("")
        for p in debian:
            target = dst / ("sources.list" if p.name == "sources.list" else f"sources.list.d/{p.name}")
            shutil.copy2(p, target)
    for conf in (src / "apt.conf.d").glob("*proxy*"):
        shutil.copy2(conf, dst / "apt.conf.d" / conf.name)


def _carry_ca(rootfs: Path) -> None:
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.exists():
        shutil.copy2(bundle, rootfs / "etc/ssl/certs/ca-certificates.crt")
    extra = Path("/usr/local/share/ca-certificates")
    if extra.is_dir():
        shutil.copytree(extra, rootfs / "usr/local/share/ca-certificates", dirs_exist_ok=True)


# -- network ------------------------------------------------------------------------
def nft_table(cluster: str) -> str:
    return "deployer_" + cluster.replace("-", "_")


def network_up(cluster: str, bridge: str, subnet: str, gateway: str, only_master: str | None = None) -> None:
    if sh("ip", "link", "show", bridge, check=False, quiet=True).returncode != 0:
        sh("ip", "link", "add", bridge, "type", "bridge")
    have = sh("ip", "-4", "-o", "addr", "show", "dev", bridge, quiet=True).stdout
    if gateway.split("/")[0] + "/" not in have:
        sh("ip", "addr", "add", gateway, "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
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
    `only_master` the rule that keeps the host off the workers."""
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
    log(f"network {bridge} removed")


# -- nodes --------------------------------------------------------------------------
def nft_table_exists(cluster: str) -> bool:
    return sh("nft", "list", "table", "ip", nft_table(cluster), check=False, quiet=True).returncode == 0


def containers(cluster: str) -> dict[str, str]:
    """The cluster's containers on this host: name -> "running" | "stopped". Two plain
    `lxc-ls` (5 ms each) rather than one --fancy (20 ms): `status` waits for this."""
    every = sh("lxc-ls", "-1", check=False, quiet=True).stdout
    running = sh("lxc-ls", "-1", "--running", check=False, quiet=True).stdout
    return parse_containers(every, running, cluster)


def parse_containers(every: str, running: str, cluster: str) -> dict[str, str]:
    """`lxc-ls -1` and `lxc-ls -1 --running` -> the cluster's nodes and their state."""
    own = re.compile(node_name_pattern(cluster))
    up = set(running.split())
    return {name: ("running" if name in up else "stopped") for name in every.split() if own.match(name)}


def instance_id(name: str) -> str | None:
    """The id the driver gave the container when it made it (its cloud-init instance-id)."""
    try:
        text = (LXC_PATH / name / "rootfs/var/lib/cloud/seed/nocloud/meta-data").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("instance-id:"):
            return line.split(":", 1)[1].strip()
    return None


def node_state(name: str) -> str:
    proc = sh("lxc-info", "-n", name, "-s", "-H", check=False, quiet=True)
    return proc.stdout.strip() if proc.returncode == 0 else "ABSENT"


def _memory_key() -> str:
    return "lxc.cgroup2.memory.max" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "lxc.cgroup.memory.limit_in_bytes"


def stable_mac(ip: str) -> str:
    """02:d5:<the four bytes of the address>: locally administered, unique per address."""
    octets = ipaddress.IPv4Interface(ip).ip.packed
    return "02:d5:" + ":".join(f"{b:02x}" for b in octets)


def _write_config(name: str, ip: str, gateway: str, bridge: str, shared: str, memory_mb: int, mounts: list[Path]) -> None:
    host_shared, guest_shared = shared.split(":", 1)
    lines = [
        "# Written by deployer (providers/lxc.py). A Debian system container with its own systemd.",
        "lxc.include = /usr/share/lxc/config/common.conf",
        "lxc.arch = linux64",
        f"lxc.rootfs.path = dir:{LXC_PATH / name / 'rootfs'}",
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
        f"lxc.mount.entry = {host_shared} {guest_shared.lstrip('/')} none bind,create=dir 0 0",
    ]
    if not Path("/sys/kernel/security/apparmor").exists():
        lines.append("lxc.apparmor.profile = unconfined")  # no AppArmor on this host to confine with
    for m in mounts:  # the host's local package folders, read-only
        lines.append(f"lxc.mount.entry = {m} {str(m).lstrip('/')} none bind,ro,create=dir 0 0")
    (LXC_PATH / name / "config").write_text("\n".join(lines) + "\n")


def _customise(rootfs: Path, pip_conf: str) -> None:
    """What a site's cloud image would already have: the host's package sources and CA."""
    shutil.copy2("/etc/resolv.conf", rootfs / "etc/resolv.conf")
    _carry_apt(rootfs)
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
            iid: str | None = None) -> None:
    """Create (when absent) and start the node. Returns once the container runs: like a
    cloud server turning ACTIVE, that is not yet a booted node; the deployer waits for
    SSH with the pinned key and for cloud-init before it configures anything."""
    address = ipaddress.IPv4Interface(ip)
    Path(shared.split(":", 1)[0]).mkdir(parents=True, exist_ok=True)
    rootfs = LXC_PATH / name / "rootfs"
    if node_state(name) == "ABSENT":
        # New, or left half-made by an interrupted run: (re)build it whole.
        if not user_data.is_file():
            raise DriverError(f"[lxc] {name}: no user-data at {user_data}; run `deployer up` (it renders it before Terraform)")
        base = ensure_base_image()
        shutil.rmtree(LXC_PATH / name, ignore_errors=True)
        (LXC_PATH / name).mkdir(parents=True)
        tmp = LXC_PATH / name / "rootfs.partial"
        sh("cp", "-a", "--reflink=auto", str(base), str(tmp))
        tmp.rename(rootfs)
        pip_conf, mounts = host_carry()
        _customise(rootfs, pip_conf)
        _seed(rootfs, name, user_data, iid)
        _write_config(name, str(address), gateway, bridge, shared, memory_mb, mounts)  # last: marks it made
    if node_state(name) != "RUNNING":
        # A stopped node keeps what cloud-init and Ansible made of it; only start it again.
        sh("lxc-start", "-n", name, "-d", "-l", "WARN", "-o", str(LXC_PATH / name / "lxc.log"))
    log(f"{name} started at {address.ip}")


def node_down(name: str) -> None:
    if node_state(name) != "ABSENT":
        sh("lxc-stop", "-n", name, "-k", check=False, quiet=True)
        sh("lxc-destroy", "-n", name, check=False, quiet=True)
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
    p = argparse.ArgumentParser(prog="python -m deployer.providers.lxc", description=__doc__.splitlines()[0])
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
    down.add_argument("--state-dir", help=argparse.SUPPRESS)  # passed by clusters made before the boot contract
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
        node_up(a.name, a.ip, a.gateway, a.bridge, a.shared, a.memory_mb, a.user_data, a.instance_id)
    elif a.cmd == "node-down":
        node_down(a.name)
    elif a.cmd == "base-image":
        print(ensure_base_image())


if __name__ == "__main__":
    sys.exit(main())
