"""The local clusters' training environment: downloaded once per machine, installed once
per machine, hard-linked into each cluster.

PyPI's torch for Linux x86_64 is the CUDA build: torch and its nvidia-* wheels are ~2.6 GB
to download and ~5.5 GB installed (it runs on CPUs, which is what a researcher's own
machine gets). Made per cluster, a local `up` would spend minutes and the disk GBs on it.
So, on the host:

- the wheels are downloaded once into the machine's wheelhouse (`make deps`, or the first
  `up`), for the nodes' Python, not the host's; the nodes also reach it read-only, as a pip
  find-links folder (image.host_carry), so a role that installs something finds it there;
- the environment is installed once, by the base image's own Python in a throwaway overlay
  of the image, at the path the nodes see (`<shared_dir>/venv`), and kept under ENV_ROOT;
- each cluster's `<shared>/venv` is a hard-linked copy of it (`cp -al`: under a second,
  no bytes copied). The training_runtime role finds every requirement present.

The files are shared by every local cluster made from the same environment. pip replaces a
file (a new inode) and never writes into one, so an upgrade in one cluster does not reach
another; the files stay root's, so the cluster user cannot write into a shared one either
(the role gives the user the directories, which are each cluster's own).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from ... import gpu_runtime, paths
from .host import CACHE_ROOT as CACHE_ROOT
from .host import WHEELHOUSE as WHEELHOUSE  # re-exported: runtime_env.WHEELHOUSE in the tests
from .host import DriverError, file_lock

ENV_ROOT = CACHE_ROOT / "envs"
# The nodes' Python: Debian bookworm's (image.SUITE), and glibc 2.36 for the wheels' tags.
NODE_PYTHON = "3.11"
NODE_GLIBC_MINOR = 36


@dataclass(frozen=True)
class Runtime:
    """What a local cluster's environment holds, and where its nodes see it."""

    requirements: tuple[str, ...]
    venv: str  # the path inside the nodes, e.g. /shared/venv

    @property
    def key(self) -> str:
        from .image import IMAGE_STAMP

        # A new image (packages, so its Python) or a new set makes a new environment; a
        # refresh of the image's package lists does not.
        text = json.dumps({"image": IMAGE_STAMP, "reqs": self.requirements, "venv": self.venv, "arch": platform.machine()})
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def dir(self) -> Path:
        return ENV_ROOT / self.key


def role_defaults() -> dict[str, object]:
    """The training_runtime role's defaults: the packages it installs beside torch."""
    data = yaml.safe_load((paths.ansible_dir() / "roles/training_runtime/defaults/main.yml").read_text())
    assert isinstance(data, dict)
    return data


def runtime_for(shared_dir: str, torch: str | None = None) -> Runtime:
    """The environment the training_runtime role would install on a local (GPU-less)
    cluster: gpu_runtime's choice for no GPUs (PyPI's build of that release: local nodes
    take the host's package sources, not the CPU wheel index) and the role's extras."""
    choice = gpu_runtime.cpu_choice(torch)
    extras = role_defaults()["training_runtime_extra_packages"]
    assert isinstance(extras, list)
    reqs = (choice.requirement, *([choice.torchvision] if choice.torchvision else []), *map(str, extras))
    return Runtime(requirements=reqs, venv=f"{shared_dir.rstrip('/')}/venv")


# -- the wheelhouse -------------------------------------------------------------------
def _fetched_stamp(reqs: tuple[str, ...]) -> Path:
    return WHEELHOUSE / f".fetched-{hashlib.sha256(' '.join(reqs).encode()).hexdigest()[:16]}"


def _platform_args() -> list[str]:
    """Every manylinux tag the nodes' glibc takes: pip does not widen a --platform given."""
    arch = platform.machine()
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(NODE_GLIBC_MINOR, 4, -1)]
    tags += [f"manylinux{old}_{arch}" for old in ("2014", "2010", "1")]
    return [arg for tag in tags for arg in ("--platform", tag)]


def fetched(reqs: tuple[str, ...]) -> bool:
    return _fetched_stamp(reqs).exists()


def fetch(reqs: tuple[str, ...]) -> None:
    """Download the wheels for the nodes' Python into the wheelhouse, once per machine
    (pip keeps a file already there)."""
    with file_lock(CACHE_ROOT / "wheels.lock"):
        if fetched(reqs):
            return
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--progress-bar", "off", "--dest", str(WHEELHOUSE),
               "--only-binary", ":all:", "--python-version", NODE_PYTHON,
               *_platform_args(), *reqs]
        proc = subprocess.run(cmd, text=True, capture_output=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
            raise DriverError(f"downloading the training environment's wheels ({' '.join(reqs)}) into {WHEELHOUSE} "
                              f"failed; check the host's pip configuration (pip config list):\n{tail}")
        _fetched_stamp(reqs).touch()


# -- the environment ------------------------------------------------------------------
def ready(rt: Runtime) -> bool:
    return (rt.dir / ".ok").exists()


def ensure(rt: Runtime, base_rootfs: Path) -> Path:
    """The prepared environment for `rt` (built once per machine), its path on the host."""
    fetch(rt.requirements)
    ENV_ROOT.mkdir(parents=True, exist_ok=True)
    with file_lock(ENV_ROOT / f"{rt.key}.lock"):
        if not ready(rt):
            staging = Path(tempfile.mkdtemp(prefix=f".staging-{rt.key}-", dir=ENV_ROOT))
            try:
                _build(rt, base_rootfs, staging)
                shutil.rmtree(rt.dir, ignore_errors=True)
                rt.dir.mkdir()
                (staging / "shared" / "venv").rename(rt.dir / "venv")
                (rt.dir / "requirements.txt").write_text("\n".join(rt.requirements) + "\n")
                (rt.dir / ".ok").write_text(rt.venv + "\n")
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            _remove_others(rt)
    return rt.dir / "venv"


def _build(rt: Runtime, base_rootfs: Path, staging: Path) -> None:
    """`python3 -m venv` and `pip install` as a node would run them, in a private mount
    namespace: an overlay of the base image (the image itself is never written), the
    environment's folder at the nodes' path, the wheelhouse read-only. The namespace and
    its mounts end with the process, Ctrl-C included."""
    root, upper, work, shared = (staging / d for d in ("root", "upper", "work", "shared"))
    for d in (root, upper, work, shared):
        d.mkdir()
    shared_dir = str(Path(rt.venv).parent)
    q = shlex.quote
    reqs = " ".join(map(q, rt.requirements))
    script = f"""set -e
mount -t overlay overlay -o lowerdir={q(str(base_rootfs))},upperdir={q(str(upper))},workdir={q(str(work))} {q(str(root))}
mkdir -p {q(str(root) + shared_dir)} {q(str(root))}/run/deployer-wheels
mount --bind {q(str(shared))} {q(str(root) + shared_dir)}
mount --bind {q(str(WHEELHOUSE))} {q(str(root))}/run/deployer-wheels
mount -o remount,bind,ro {q(str(root))}/run/deployer-wheels
mount -t proc proc {q(str(root))}/proc
mount --bind /dev {q(str(root))}/dev
chroot {q(str(root))} python3 -m venv {q(rt.venv)}
chroot {q(str(root))} env PIP_CONFIG_FILE=/dev/null {q(rt.venv)}/bin/pip install --quiet --no-index \\
  --find-links /run/deployer-wheels {reqs}
# Compiled once here, each cluster's first `import torch` finds its bytecode.
chroot {q(str(root))} {q(rt.venv)}/bin/python -m compileall -q -j 0 {q(rt.venv)}/lib >/dev/null || true
"""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root"}
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          text=True, capture_output=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-10:])
        raise DriverError(f"installing the training environment ({' '.join(rt.requirements)}) failed:\n{tail}")


def _remove_others(keep: Runtime) -> None:
    """Older environments go once a new one is ready: a cluster made from one keeps its
    files through its own hard links."""
    for entry in ENV_ROOT.iterdir():
        if entry.is_dir() and entry.name != keep.key and not entry.name.startswith(".staging-"):
            shutil.rmtree(entry, ignore_errors=True)


def link_into(env: Path, target: Path) -> bool:
    """A cluster's own environment, as hard links to the prepared one. False when the
    cluster has one already (a re-run keeps what the cluster installed)."""
    if target.exists():
        return False
    tmp = target.with_name(f".{target.name}.linking")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run(["cp", "-al", str(env), str(tmp)], text=True, capture_output=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DriverError(f"linking the training environment into {target} failed (the state dir and "
                          f"{CACHE_ROOT} must be on one filesystem; DEPLOYER_CACHE_DIR moves the cache): "
                          f"{proc.stderr.strip()}")
    tmp.rename(target)
    return True


# -- make deps ------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployer.providers.local.runtime_env",
                                description="The local nodes' training environment, kept on this machine.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help=f"download the wheels local nodes install into {WHEELHOUSE} (once per machine)")
    sub.add_parser("requirements", help="print what a local cluster's environment holds, one a line")
    sub.add_parser("wheelhouse", help="print the wheelhouse's path")
    args = p.parse_args(argv)
    rt = runtime_for("/shared")
    if args.cmd == "fetch":
        fetch(rt.requirements)
        print(f"{len(list(WHEELHOUSE.glob('*.whl')))} wheels in {WHEELHOUSE}")
    elif args.cmd == "requirements":
        print("\n".join(rt.requirements))
    else:
        print(WHEELHOUSE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
