"""Baked local images: what `deployer image build --provider local` saves, a node stands on
(`image:` in the spec) and `image list` / `image rm` show and remove.

A baked image is a rootfs beside the base image's versions, IMAGE_ROOT/baked/<name>/rootfs,
with its manifest at image_manifest.MANIFEST_PATH inside. It is made from a stopped
builder container: the base version it stood on, hard-linked (`cp -al`: no bytes copied),
with the builder's own writes (its overlay's upper dir) linked over it, whiteouts applied,
then sealed. Like a base version it is never changed in place after that (every file of
it may be a link into the base version or the builder's writes: the seal unlinks, never
writes into a file), and it goes only by `image rm`, refused while a container stands on it.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from ...image_manifest import MANIFEST_PATH, Manifest, parse
from .host import LXC_PATH, DriverError, file_lock, sh
from .image import IMAGE_ROOT

BAKED_ROOT = IMAGE_ROOT / "baked"
NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
OPAQUE = "trusted.overlay.opaque"

# What the seal removes: nothing of one machine or one cluster stays in an image
# (cloud-init's state so it runs again, the machine id so each node gets its own, host and
# user keys, logs, package lists and caches, the builder's credentials and proxy).
SEAL_TREES = ["var/lib/cloud", "var/log/journal", "var/cache/apt/archives", "root/.ssh", "root/.cache",
              "root/.config/pip", "tmp", "var/tmp"]
SEAL_FILES = ["etc/machine-id", "var/lib/dbus/machine-id", "etc/munge/munge.key", "etc/pip.conf",
              "etc/apt/apt.conf.d/01deployer-package-cache", "var/lib/systemd/random-seed", "etc/resolv.conf"]
SEAL_GLOBS = ["etc/ssh/ssh_host_*", "etc/ssh/sshd_config.d/deployer-host-certificate.conf",
              "var/lib/apt/lists/*", "var/cache/apt/*.bin", "home/*/.ssh",
              "home/*/.config/pip", "home/*/.cache", "var/lib/apt/periodic/*"]


def rootfs(name: str) -> Path:
    return BAKED_ROOT / name / "rootfs"


def lookup(name: str) -> Manifest | None:
    """The baked image's manifest; None when no such image."""
    path = rootfs(name) / MANIFEST_PATH.lstrip("/")
    try:
        return parse(path.read_text())
    except OSError:
        return None


def images() -> list[Manifest]:
    """Every baked image on this machine, oldest first."""
    found = [m for d in sorted(BAKED_ROOT.glob("*")) if d.is_dir() and (m := lookup(d.name)) is not None]
    return sorted(found, key=lambda m: m.created_at)


def users(name: str) -> list[str]:
    """The containers that stand on the image (their config names its rootfs as the lower layer)."""
    lower = f"overlay:{rootfs(name)}:"
    return sorted(c.parent.name for c in LXC_PATH.glob("*/config") if lower in c.read_text(errors="replace"))


def remove(name: str) -> None:
    with file_lock(BAKED_ROOT / ".lock"):
        shutil.rmtree(BAKED_ROOT / name)


def save(builder: str, name: str, manifest: Manifest) -> Path:
    """The stopped builder container as the baked image `name`, sealed, with its manifest."""
    if not NAME.match(name):
        raise DriverError(f"[lxc] image name {name!r}: use lower-case letters, digits, '.' and '-'")
    config = (LXC_PATH / builder / "config").read_text()
    m = re.search(r"^lxc\.rootfs\.path = overlay:(.+):(.+)$", config, re.M)
    if m is None:
        raise DriverError(f"[lxc] {builder} is not an overlay node: no image can be made of it")
    lower, upper = Path(m.group(1)), Path(m.group(2))
    sh("lxc-stop", "-n", builder, "-t", "30", check=False, quiet=True)
    BAKED_ROOT.mkdir(parents=True, exist_ok=True)
    with file_lock(BAKED_ROOT / ".lock"):
        final = BAKED_ROOT / name
        if final.exists():
            raise DriverError(f"[lxc] image {name} exists already: `deployer image rm {name}` first, or another name")
        staging = BAKED_ROOT / f".staging-{name}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.mkdir()
            merge(lower, upper, staging / "rootfs")
            seal(staging / "rootfs")
            # The seal wrote the same file on the builder (image_build.seal); written here
            # too because a --no-setup bake is never sealed, and `image list` reads it.
            target = staging / "rootfs" / MANIFEST_PATH.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(manifest.to_json() + "\n")
            staging.rename(final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final / "rootfs"


def merge(lower: Path, upper: Path, dest: Path) -> None:
    """`lower` with the overlay's `upper` over it, at `dest`, as hard links: what the
    container saw, without copying its bytes. Whiteouts (0/0 character devices) delete,
    opaque directories hide the lower's content (the kernel's overlayfs documentation)."""
    sh("cp", "-al", str(lower), str(dest))
    for top, dirs, files in os.walk(upper):
        rel = Path(top).relative_to(upper)
        here = dest / rel
        try:
            opaque = os.getxattr(top, OPAQUE) == b"y"
        except OSError:
            opaque = False
        if opaque and rel != Path("."):
            shutil.rmtree(here, ignore_errors=True)
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            here.unlink()
        here.mkdir(exist_ok=True)
        st = os.lstat(top)
        os.chown(here, st.st_uid, st.st_gid)
        os.chmod(here, stat.S_IMODE(st.st_mode))
        for d in list(dirs):
            src = Path(top) / d
            if src.is_symlink():  # a link to a directory: placed as a link, never walked
                dirs.remove(d)
                files.append(d)
        for f in files:
            src, dst = Path(top) / f, here / f
            if dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst)
            else:
                dst.unlink(missing_ok=True)
            st = os.lstat(src)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                continue  # a whiteout: the file is gone
            os.link(src, dst, follow_symlinks=False)
        for d in dirs:  # directories only the upper has get made by the walk; stale lower files in the way go
            dst = here / d
            if dst.exists() and not dst.is_dir():
                dst.unlink()


def seal(root: Path) -> None:
    """What belongs to the builder goes (SEAL_*): removed, never written into (every file
    may be a link into the base version)."""
    for rel in SEAL_TREES:
        shutil.rmtree(root / rel, ignore_errors=True)
    for rel in ("tmp", "var/tmp"):
        (root / rel).mkdir(mode=0o1777, exist_ok=True)
        os.chmod(root / rel, 0o1777)
    for rel in SEAL_FILES:
        (root / rel).unlink(missing_ok=True)
    for pattern in SEAL_GLOBS:
        for p in root.glob(pattern):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for log in (root / "var/log").rglob("*"):
        if log.is_file() or log.is_symlink():
            log.unlink()
    # An empty machine-id: systemd makes a new one at each node's first boot.
    (root / "etc/machine-id").write_text("")
    stale_lists(root)


def stale_lists(root: Path) -> None:
    """Empty package lists that read as old: apt's cache_valid_time (the roles' apt tasks)
    goes by the stamp, else the lists folder's time, so the first role that installs
    something on a node of the image fetches the lists instead of finding none."""
    lists = root / "var/lib/apt/lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    os.utime(lists, (0, 0))


def lower_for(image: str | None) -> Path | None:
    """The rootfs a node of `image:` stands on; None: the base image. Raises when named and absent."""
    if not image:
        return None
    if lookup(image) is None:
        raise DriverError(f"[lxc] no baked image {image!r} on this machine (`deployer image list`)")
    return rootfs(image)


class LocalImages:
    """The local provider's ImageStore (providers/base.py)."""

    provider = "local"

    def images(self) -> list[Manifest]:
        return images()

    def lookup(self, name: str) -> Manifest | None:
        return lookup(name)

    def users(self, name: str) -> list[str]:
        return [f"container {c}" for c in users(name)]

    def remove(self, name: str) -> None:
        remove(name)

    def save(self, state: object, cluster: object, name: str, manifest: Manifest) -> str:
        from ...cluster import Cluster

        assert isinstance(cluster, Cluster)
        return str(save(cluster.master.name, name, manifest))

    def flavor_gpus(self, spec: object, checked: object) -> tuple[int, str]:
        return 0, "local containers"  # no GPU reaches a container here

    def base(self, spec: object) -> str:
        from .image import SUITE, base_rootfs

        return f"debian {SUITE} {base_rootfs().resolve().parent.name}"
