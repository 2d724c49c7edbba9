"""The local nodes' Debian base image: built once with debootstrap, pre-baked with what the
roles install, its package lists refreshed once for all nodes, kept in versions that
containers stand on as overlays; and what the nodes take over from the host (package
sources, pip configuration, CA certificates)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .host import LXC_PATH, WHEELHOUSE, DriverError, file_lock, log, sh

IMAGE_ROOT = Path(os.environ.get("DEPLOYER_IMAGE_DIR", "/var/lib/deployer/images"))
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
    """Of what _carry_apt puts into the image: a change to it makes a new image (so does
    taking credentials out of it: an image made before that is made again)."""
    files, auth = _apt_carried()
    text = "\n".join(f"{Path(rel).name}\n{t}" for rel, t in files.items())
    if auth:
        text += f"\n{APT_AUTH_FILE}\n{auth}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# cloud-init in the local image runs in two of its four stages. Each stage is a Python
# process of its own (~0.45 s of CPU to start), and eight nodes boot at once on the
# host's two cores, so at N = 8 boot time is CPU time (scripts/bench_boot.py, side by
# side: 2.5 s of CPU per node with four stages and every stock module, 1.2 s with this;
# eight nodes all booted in 10.4 s against 5.2 s). The local stage exists to write network
# configuration before networking starts: here the driver owns eth0 (network config
# disabled), so the init stage finds the NoCloud seed by itself. The modules the
# user-data needs (deployer/pipeline/boot.py) all run in init, set_passwords included (so sshd
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
# Written by deployer (providers/local/image.py): the local image boots through NoCloud.
datasource_list: [ NoCloud, None ]
network:
  config: disabled
cloud_init_modules: [{", ".join(CLOUD_INIT_MODULES)}]
cloud_config_modules: []
cloud_final_modules: [{", ".join(CLOUD_FINAL_MODULES)}]
"""
IMAGE_STAMP = json.dumps({"suite": SUITE, "packages": BASE_PACKAGES + PREBAKED_PACKAGES, "apt": IMAGE_APT_CONF,
                          "disabled": BAKED_DISABLED_SERVICES, "masked": MASKED_UNITS, "cloud_cfg": CLOUD_CFG})

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
    carry_ca(rootfs)
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
        "# Keys only, as on a cloud image.\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nUseDNS no\n"
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


# A URL's user:password@ (or user@: a token alone).
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s\"']+)@")


@dataclass(frozen=True)
class PipCarry:
    """The host's pip configuration as a node gets it (docs/architecture.md, "Security model")."""

    public: str  # /etc/pip.conf, 0644: every option, with no credentials in any URL
    private: str  # root's own pip.conf, 0600 (the cluster user gets a copy): the options that had them, whole; "" when none
    mounts: list[Path]  # the host folders it names, bind-mounted read-only


def _pip_secret(option: str, item: str) -> str | None:
    """`item` without the user:password@ it carries, or None when it carries none. A URL's
    userinfo; pip's `proxy` may also be written without a scheme ([user:passwd@]host:port)."""
    if "://" in item:
        cleaned = _URL_USERINFO.sub(r"\g<scheme>", item)
        return cleaned if cleaned != item else None
    if option == "proxy" and "@" in item:
        return item.rsplit("@", 1)[1]
    return None


def host_carry() -> PipCarry:
    """The host's pip configuration, split so no node user but root and the cluster user
    reads a credential in it, and the host folders it needs."""
    conf = _host_pip_config()
    if WHEELHOUSE.is_dir():  # the machine's wheels (torch), so a node's pip takes them from here
        conf["find-links"] = " ".join([*conf.get("find-links", "").split(), str(WHEELHOUSE)])
    paths: set[Path] = set()
    for option in ("find-links", "extra-index-url", "index-url", "constraint", "cert"):
        for item in conf.get(option, "").split():
            p = Path(item.removeprefix("file://"))
            if item.startswith(("/", "file://")) and p.exists():
                # A PEP 503 index folder links to files beside it (../files): take its parent.
                paths.add(p.parent if p.name == "simple" or not p.is_dir() else p)
    public: dict[str, str] = {}
    private: dict[str, str] = {}
    for option, value in sorted(conf.items()):
        items = value.split()
        cleaned = [_pip_secret(option, item) for item in items]
        if any(c is not None for c in cleaned):
            private[option] = value
            value = " ".join(c if c is not None else item for c, item in zip(cleaned, items, strict=True))
        public[option] = value
    header = "# Carried over from the host by deployer, so nodes reach the same package sources.\n"
    text = header + "# Credentials are not here: root's own pip.conf and the cluster user's hold them.\n" * bool(private)
    text += "[global]\n" + "".join(f"{k} = {v}\n" for k, v in public.items())
    secret = "".join(f"{k} = {v}\n" for k, v in private.items())
    if secret:
        secret = header + "# The options that carry credentials (/etc/pip.conf has them without).\n[global]\n" + secret
    # The CA bundle is copied into the node at the same path, not mounted.
    ca = Path("/etc/ssl/certs")
    return PipCarry(text, secret, sorted(p for p in paths if p != ca and not str(p).startswith("/etc/ssl")))


def write_private(path: Path, text: str) -> None:
    """`text` at `path`, 0600 from its first byte (never a moment readable by others), a
    folder made for it 0700."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # it was there before, with another mode
        f.write(text)


HOST_APT = Path("/etc/apt")
# Where the credentials taken out of the carried apt files go: apt reads auth.conf.d as
# root (before its download methods drop to _apt), for sources and proxies alike.
APT_AUTH_FILE = "auth.conf.d/90-deployer-host.conf"
_APT_URL = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*)://(?P<user>[^/@\s\"':]*)(?::(?P<password>[^/@\s\"']*))?@"
    r"(?P<host>[^/\s\"']+)(?P<path>/[^\s\"']*)?"
)


def _host_apt_files() -> tuple[list[Path], list[Path]]:
    """The host's Debian package sources (third-party repositories are not for the nodes)
    and its apt proxy settings."""
    lists = [HOST_APT / "sources.list", *sorted((HOST_APT / "sources.list.d").glob("*"))]
    debian = [p for p in lists if p.is_file() and "debian" in p.read_text() and "nodesource" not in p.name]
    return debian, sorted((HOST_APT / "apt.conf.d").glob("*proxy*"))


def _netrc_token(value: str) -> str:
    """A URL's user or password as an auth.conf token (one word: kept encoded if it has a space)."""
    plain = urllib.parse.unquote(value)
    return value if not plain or any(c.isspace() for c in plain) else plain


def _apt_credentials_out(text: str, auth: list[str]) -> str:
    """`text` with each URL's user:password@ taken out, its entry added to `auth` (apt_auth.conf(5))."""

    def out(m: re.Match[str]) -> str:
        machine = f"{m['scheme']}://{m['host']}{(m['path'] or '').rstrip('/')}"
        entry = f"machine {machine} login {_netrc_token(m['user'])}"
        if m["password"] is not None:
            entry += f" password {_netrc_token(m['password'])}"
        if entry + "\n" not in auth:
            auth.append(entry + "\n")
        return f"{m['scheme']}://{m['host']}{m['path'] or ''}"

    return _APT_URL.sub(out, text)


def _apt_carried() -> tuple[dict[str, str], str]:
    """What _carry_apt puts into the image's /etc/apt: path (under it) -> text, every URL in it
    without a user:password@, and the auth.conf.d text those went into ("" when none)."""
    debian, proxies = _host_apt_files()
    auth: list[str] = []
    files = {("sources.list" if p.name == "sources.list" else f"sources.list.d/{p.name}"): _apt_credentials_out(p.read_text(), auth)
             for p in debian}
    files.update({f"apt.conf.d/{p.name}": _apt_credentials_out(p.read_text(), auth) for p in proxies})
    return files, "".join(auth)


def _carry_apt(rootfs: Path) -> None:
    """Into the image (nodes inherit it): the image's lists are made from these sources. What
    every user reads (sources, apt.conf.d) holds no credential: they are in auth.conf.d, 0600."""
    dst = rootfs / "etc/apt"
    files, auth = _apt_carried()
    if any(rel.startswith("sources.list") for rel in files):
        (dst / "sources.list").write_text("")
    for rel, text in files.items():
        (dst / rel).write_text(text)
        (dst / rel).chmod(0o644)
    if auth:
        write_private(dst / APT_AUTH_FILE, "# The credentials of the host's apt sources and proxies, carried by deployer.\n" + auth)


def carry_ca(rootfs: Path) -> None:
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.exists():
        shutil.copy2(bundle, rootfs / "etc/ssl/certs/ca-certificates.crt")
    extra = Path("/usr/local/share/ca-certificates")
    if extra.is_dir():
        shutil.copytree(extra, rootfs / "usr/local/share/ca-certificates", dirs_exist_ok=True)


# -- network ------------------------------------------------------------------------
