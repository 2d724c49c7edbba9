"""A baked image's manifest: what `deployer image build` installed into it, and whether a
cluster can keep it.

The manifest is one JSON object, the same on both providers: a file in the image
(MANIFEST_PATH, one line, so a role reads it with the package list in one round trip) and,
on OpenStack, the Glance image's properties (as_properties: Glance properties are strings).
The roles read it and skip what the image has in the right version; anything else installs
as without an image, and `fit` says why in one line (docs/openstack.md, "Baked images").

What "the right version" is: the roles that installed it (roles_hash: a change to any file
of the installing roles makes every older bake stale, and `up` warns), the driver branch
the cluster asks for, and the torch build it gets (chosen from the drivers and GPUs as
without an image: the image's build is kept only when it is that choice).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from . import __version__
from .paths import assets_root

MANIFEST_PATH = "/etc/deployer/image.json"
# The training environment of a bake: on the image's own disk, so every node has it at
# once; `<shared_dir>/venv` links to it (the paths users and the benchmarks know).
IMAGE_VENV = "/opt/deployer/venv"
# The roles whose installing part a bake runs (ansible/bake.yml), and what they read.
INSTALLING_ROLES = ("common", "mpi", "slurm", "node_exporter", "prometheus", "pushgateway", "nvidia_driver",
                    "dcgm_exporter", "training_runtime", "jupyterlab", "health")
# Glance property keys carry this prefix, so a manifest's keys never meet the cloud's own
# (os_distro, hw_*): image_props_to_manifest reads them back.
PROPERTY_PREFIX = "deployer_"
FORMAT = 1


@dataclass(frozen=True)
class Manifest:
    """What one bake holds. None: not in this image (a CPU bake has no driver)."""

    name: str
    provider: str  # local | openstack
    gpu: bool  # baked with --gpu: the driver (and DCGM) are in it
    roles_hash: str
    deployer_version: str
    created_at: str  # UTC, ISO 8601
    base: str  # the image it was baked from
    kernel: str | None = None
    driver_branch: int | None = None
    driver_version: str | None = None
    cuda: str | None = None  # the torch build's CUDA (None: a CPU build)
    torch: str | None = None  # what pip installed: torch==2.13.0 or torch==2.13.0+cu126
    openmpi: str | None = None
    slurm: str | None = None
    jupyterlab: str | None = None
    # How the builder's GPU came (the driver role's nvidia_driver_virtualization: none |
    # pass-through | vgpu): a vGPU guest's driver is the host's licensed one, never a whole
    # GPU's, so an image fits flavors of its own kind only.
    gpu_virtualization: str | None = None
    venv: str = IMAGE_VENV
    format: int = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)  # one line: the common role reads it with dpkg's list

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """A manifest from its JSON or Glance properties; ValueError names what is wrong."""
        known = {f.name for f in fields(cls)}
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"manifest format {data.get('format')!r}, this deployer reads {FORMAT}")
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as e:
            raise ValueError(f"not a deployer image manifest: {e}") from None

    def as_properties(self) -> dict[str, str]:
        """Glance image properties: strings, prefixed; None left out."""
        return {PROPERTY_PREFIX + k: json.dumps(v) if not isinstance(v, str) else v
                for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_properties(cls, props: dict[str, Any]) -> Manifest | None:
        """The manifest of a Glance image's properties; None when it carries none."""
        own = {k.removeprefix(PROPERTY_PREFIX): v for k, v in props.items() if k.startswith(PROPERTY_PREFIX)}
        if "roles_hash" not in own:
            return None
        str_fields = {f.name for f in fields(cls) if f.type in ("str", "str | None")}
        data = {k: (v if k in str_fields or not isinstance(v, str) else json.loads(v)) for k, v in own.items()}
        return cls.from_dict(data)

    def describe(self) -> str:
        parts = [f"torch {self.torch}" if self.torch else "no torch"]
        parts.append(f"driver {self.driver_version or self.driver_branch}" if self.gpu else "no GPU driver")
        parts += [f"Open MPI {self.openmpi}"] if self.openmpi else []
        parts += [f"Slurm {self.slurm}"] if self.slurm else []
        return ", ".join(parts)


# Besides the roles: the play that bakes, the torch matrix, and the driver's package choice
# (gpu_facts: branches, kernel headers, Fabric Manager), each deciding what an image holds.
BAKE_INPUTS = ("ansible/bake.yml", "deployer/gpu_runtime.yaml", "deployer/gpu_facts.py")


def roles_hash() -> str:
    """Of every file of the installing roles and the other bake inputs: what a bake is stale against."""
    root = assets_root()
    h = hashlib.sha256()
    for role in INSTALLING_ROLES:
        for f in sorted((root / "ansible/roles" / role).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    for name in BAKE_INPUTS:
        h.update(name.encode())
        h.update((root / name).read_bytes() if (root / name).exists() else b"")
    return h.hexdigest()[:16]


def parse(text: str) -> Manifest | None:
    """The manifest file's text; None for an image with none (empty or `{}`)."""
    text = text.strip()
    if not text or text == "{}":
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{MANIFEST_PATH} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{MANIFEST_PATH} holds no JSON object")
    return Manifest.from_dict(data)


def unfit(manifest: Manifest | None, *, roles: str, gpus: int, driver_branch: int | None) -> str | None:
    """Why a node with this image installs as without one (one line), or None: it keeps
    what the image holds. The torch build is checked where it is chosen (torch_unfit)."""
    if manifest is None:
        return None
    if manifest.roles_hash != roles:
        return (f"image {manifest.name} was baked by older roles (hash {manifest.roles_hash}, these are {roles}): "
                f"installing as without it; `deployer image build` bakes a current one")
    if gpus > 0 and not manifest.gpu:
        return f"image {manifest.name} has no GPU driver (a CPU bake) and this node has {gpus} GPU(s): installing the driver"
    if gpus > 0 and driver_branch is not None and manifest.driver_branch != driver_branch:
        return (f"image {manifest.name} has driver branch {manifest.driver_branch}, the cluster asks for {driver_branch} "
                f"(openstack.nvidia_driver_branch): bake one with it (the driver role keeps a working driver, as without a bake)")
    return None


def torch_unfit(manifest: Manifest | None, requirement: str) -> str | None:
    """Why the image's training environment is not the cluster's (one line), or None."""
    if manifest is None:
        return None
    if manifest.torch != requirement:
        return (f"image {manifest.name} has {manifest.torch or 'no torch'}, the cluster's drivers and GPUs get "
                f"{requirement}: installing it into the shared environment as without the image")
    return None


def flavor_unfit(manifest: Manifest, flavor_gpus: int, flavor: str, attached: str | None = None) -> str | None:
    """The preflight's question (nothing made yet): can nodes of this flavor run this bake?
    `attached`: how the flavor gives its GPUs (vgpu | passthrough; None: not known)."""
    if manifest.gpu and flavor_gpus == 0:
        return (f"image {manifest.name} is a GPU bake (driver {manifest.driver_version or manifest.driver_branch}) and "
                f"flavor {flavor} asks for no GPU in its extra specs: bake one without --gpu, or pick a GPU flavor")
    if not manifest.gpu and flavor_gpus > 0:
        return (f"image {manifest.name} has no GPU driver and flavor {flavor} has {flavor_gpus} GPU(s): "
                f"bake one with `deployer image build --gpu`, or leave image: out")
    baked_vgpu = {"vgpu": True, "pass-through": False, "none": False}.get(manifest.gpu_virtualization or "")
    flavor_vgpu = {"vgpu": True, "passthrough": False}.get(attached or "")
    if manifest.gpu and baked_vgpu is not None and flavor_vgpu is not None and baked_vgpu != flavor_vgpu:
        kind = {True: "an NVIDIA vGPU guest's", False: "a whole GPU's"}
        return (f"image {manifest.name} was baked with {kind[baked_vgpu]} driver and flavor {flavor} gives "
                f"{'a vGPU (resources:VGPU)' if flavor_vgpu else 'whole GPUs'}: a vGPU guest needs the driver of the "
                f"host's vGPU manager, a whole GPU a datacenter driver; bake on a flavor of this kind")
    return None


def new(name: str, provider: str, *, gpu: bool, base: str, versions: dict[str, str | None], at: str) -> Manifest:
    """The manifest of a bake from what the builder reported (ansible/bake.yml's last play)."""
    branch = versions.get("driver_branch")
    return Manifest(
        name=name, provider=provider, gpu=gpu, roles_hash=roles_hash(), deployer_version=__version__, created_at=at,
        base=base, kernel=versions.get("kernel"), driver_branch=int(branch) if branch else None,
        driver_version=versions.get("driver_version"), cuda=versions.get("cuda"), torch=versions.get("torch"),
        openmpi=versions.get("openmpi"), slurm=versions.get("slurm"), jupyterlab=versions.get("jupyterlab"),
        gpu_virtualization=versions.get("gpu_virtualization") if gpu else None,
    )
