"""`deployer image build | list | rm`: baked images (docs/openstack.md, "Baked images").

`image build` is `up`'s own stages on a one-node cluster of its own, the builder:
preflight -> begin -> prepare -> provision -> wait_for_nodes (lifecycle.py), then
ansible/bake.yml (the installing part of the roles, into the node's own disk), the seal,
and the provider's save (local: a new image beside the base image's versions; OpenStack:
Nova's createImage into Glance, waited for until active), with the manifest
(image_manifest.py). The builder is destroyed whatever happens: a failure, Ctrl-C, `kill`.
"""

from __future__ import annotations

import secrets
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import image_manifest, lifecycle, ui
from .cluster import Cluster
from .errors import OperationFailed, PreflightError, UsageError
from .image_manifest import Manifest
from .pipeline import inventory
from .providers import get_images
from .remote import ssh_argv, stream
from .spec import ClusterSpec
from .state import ClusterState

if TYPE_CHECKING:
    from .tools.ansible import PlayResult

BUILDER_MEMORY_MB = 3072  # pip unpacks torch's GB of wheels: more than a node's default
BUILDER_TTL = "3h"  # should every cleanup fail, `deployer gc` still finds the builder
RUNTIME_TAG = "runtime"  # ansible/bake.yml's training-environment play
# The seal on the builder itself, before it is saved: what belongs to this one machine or
# to the builder's throwaway cluster goes (cloud-init's state and logs, so it runs again on
# every node made from the image; the machine id; host keys; the cluster user's and root's
# keys; logs; package lists and caches; the package's own munge key; the builder's proxy
# and pip credentials). The local save seals the copy again on the host (baked.seal):
# nothing here is trusted to have run once the user's key is gone.
SEAL_SCRIPT = r"""set -u
systemctl stop prometheus-node-exporter munge slurmd slurmctld 2>/dev/null || true
cloud-init clean --logs --machine-id --seed 2>/dev/null || cloud-init clean --logs 2>/dev/null || rm -rf /var/lib/cloud
truncate -s 0 /etc/machine-id; rm -f /var/lib/dbus/machine-id
rm -f /etc/ssh/ssh_host_* /etc/ssh/sshd_config.d/deployer-host-certificate.conf
rm -f /etc/munge/munge.key /etc/apt/apt.conf.d/01deployer-package-cache /etc/pip.conf
rm -rf /var/lib/apt/lists/* /var/lib/apt/periodic/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb
rm -rf /root/.ssh /root/.cache /root/.config/pip
rm -rf /home/*/.cache /home/*/.config/pip
find /var/log -type f -delete
mkdir -p /var/lib/apt/lists/partial; touch -d @0 /var/lib/apt/lists  # read as old: the first apt task fetches them
sync
rm -rf /home/*/.ssh
"""


def build(spec: ClusterSpec, state_root: Path, *, gpu: bool, name: str | None = None, setup: bool = True) -> dict[str, Any]:
    """Bake an image from `spec`'s provider and base image; its manifest and where it is.
    `setup` False (--no-setup): the builder is saved as it booted, nothing installed or
    sealed, for a cloud whose servers do not boot (the test cloud's fake driver); its
    manifest names nothing, so a node of it installs everything, as from its base image."""
    store = get_images(spec.provider, spec.openstack.cloud)
    if gpu and spec.provider == "local":
        raise UsageError("--gpu: local containers have no GPU or kernel of their own; bake a GPU image with "
                         "--provider openstack on a GPU flavor")
    at = datetime.now(UTC)
    image_name = name or f"baked-{'gpu' if gpu else 'cpu'}-{at:%Y%m%d-%H%M%S}"
    if store.lookup(image_name) is not None:
        raise UsageError(f"image {image_name} exists: `deployer image rm {image_name}` first, or another name")
    builder = builder_spec(spec, gpu=gpu)
    state = ClusterState(state_root, builder.name)
    run = lifecycle.preflight(builder, state, [], check_level=None)
    if gpu:
        gpus, flavor = store.flavor_gpus(builder, run.checked)
        if gpus == 0:
            raise PreflightError(f"--gpu: flavor {flavor} asks for no GPU in its extra specs (pci_passthrough:alias, "
                                 f"resources:VGPU/PGPU): the driver cannot be installed and checked on it; set "
                                 f"openstack.flavor to a GPU flavor")
    ui.step(f"image build: a builder node ({builder.name}) from {store.base(spec)}; it is deleted whatever happens")
    try:
        with state.lock("image build"):
            lifecycle.begin(run, ttl_given=True)
            lifecycle.prepare(run)
            cluster = lifecycle.provision(run)
            inv = inventory.write(cluster, builder, state)
            versions: dict[str, str | None] = {}
            if setup:
                lifecycle.wait_for_nodes(run, cluster, list(cluster.names))
                versions = bake(run, inv, gpu=gpu)
            manifest = image_manifest.new(image_name, spec.provider, gpu=gpu and setup, base=store.base(spec),
                                          versions=versions, at=at.isoformat(timespec="seconds"))
            if setup:
                with run.times.stage("seal"):
                    seal(state, cluster, manifest)
            with run.times.stage("save"):
                ui.step(f"image build: saving {image_name}")
                where = store.save(state, cluster, image_name, manifest)
            took = run.times.write(run.run_dir)
    finally:
        ui.step(f"image build: deleting the builder {builder.name}")
        lifecycle.down(state)
    ui.ok(f"image {image_name}: {manifest.describe()} ({took['total_s']:.0f}s); `up --image {image_name}` or "
          f"`image: {image_name}` in the spec")
    return {"name": image_name, "where": where, "manifest": manifest_dict(manifest), "seconds": took["total_s"]}


def builder_spec(spec: ClusterSpec, *, gpu: bool) -> ClusterSpec:
    """The builder's own one-node cluster: the spec's provider, base image and settings, a
    name of its own, an expiry, room for torch; nothing of the spec's cluster."""
    data = spec.model_dump(mode="json", exclude={"name", "nodes", "image", "ttl", "scheduler"})
    data["local"].pop("subnet", None)  # a free one is found (the spec's may be the running cluster's)
    data["local"]["memory_mb"] = max(spec.local.memory_mb, BUILDER_MEMORY_MB)
    data["local"]["access"] = "direct"
    data["openstack"]["enable_gpu"] = gpu
    data["openstack"]["auto_teardown"] = False
    data["openstack"]["floating_ip"] = None
    return ClusterSpec.model_validate({**data, "name": f"bake-{secrets.token_hex(3)}", "nodes": 1, "ttl": BUILDER_TTL})


def bake(run: lifecycle.UpRun, inv: Path, *, gpu: bool) -> dict[str, str | None]:
    """ansible/bake.yml on the builder; the versions it reports, for the manifest."""
    ui.step("image build: the installing part of the roles (ansible/bake.yml)")
    with run.times.stage("ansible"):
        play = bake_play(inv, run.run_dir, gpu=gpu)
    versions = play.stats.get("image_versions")
    if not isinstance(versions, dict):
        raise OperationFailed("image build: the bake reported no versions (ansible/bake.yml's last play)",
                              log=run.run_dir / "ansible-events.jsonl")
    return {str(k): (str(v) if v is not None else None) for k, v in versions.items()}


def bake_play(inv: Path, run_dir: Path, *, gpu: bool, runtime: bool = True) -> PlayResult:
    """ansible/bake.yml with the variables `image build` gives it. runtime False leaves out
    its last play (tag RUNTIME_TAG: the training environment, JupyterLab and the versions
    report), for a builder that cannot install torch in reasonable time (an emulated VM)."""
    from .tools.ansible import run_playbook

    return run_playbook(inv, run_dir, playbook="bake.yml",
                        extravars={"deployer_bake_gpu": gpu, "deployer_image_venv": image_manifest.IMAGE_VENV},
                        skip_tags=None if runtime else [RUNTIME_TAG])


def seal(state: ClusterState, cluster: Cluster, manifest: Manifest) -> None:
    """The manifest into the builder's disk (image_manifest.MANIFEST_PATH), then SEAL_SCRIPT,
    as root: the last thing that reaches it over SSH.

    The file is what a node's common role reads (with the package list, one round trip):
    without it a node of the image installs everything again. On OpenStack the snapshot
    carries the disk as it is, so the file must be on it before the save (Glance's
    properties are for `image list` and the preflight; no node reads them)."""
    argv = [*ssh_argv(state, cluster.master), "sudo bash -c " + shlex.quote(manifest_script(manifest) + SEAL_SCRIPT)]
    rc, out, err = stream(argv, timeout=300)
    if rc != 0:
        raise OperationFailed(f"image build: sealing the builder failed ({rc}): {(err or out).strip()[-300:]}")


def manifest_script(manifest: Manifest, path: str = image_manifest.MANIFEST_PATH) -> str:
    """Shell that writes `manifest` where the roles read it, root's and readable by all."""
    return (f"install -d -m 0755 {shlex.quote(str(Path(path).parent))} && "
            f"printf '%s\\n' {shlex.quote(manifest.to_json())} > {shlex.quote(path)} && chmod 0644 {shlex.quote(path)} "
            f"|| exit 1\n")


def manifest_dict(m: Manifest) -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads(m.to_json())
    return data


def listing(provider: str, cloud: str | None = None) -> list[dict[str, Any]]:
    """Every baked image of the provider, with what stands on it and whether the roles changed since."""
    store = get_images(provider, cloud)
    current = image_manifest.roles_hash()
    return [{**manifest_dict(m), "users": store.users(m.name), "current": m.roles_hash == current}
            for m in store.images()]


def remove(provider: str, name: str, cloud: str | None = None) -> None:
    """`image rm`: refused (exit 2, one line) while anything stands on the image."""
    store = get_images(provider, cloud)
    if store.lookup(name) is None:
        raise UsageError(f"no baked image {name!r} (`deployer image list --provider {provider}`)")
    users = store.users(name)
    if users:
        raise UsageError(f"image {name} is in use by {', '.join(users)}: `deployer down` that cluster (or "
                         f"`up --image` another and replace its nodes) first")
    store.remove(name)
    ui.ok(f"image {name} removed")
