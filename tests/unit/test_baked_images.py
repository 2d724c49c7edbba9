"""Baked images without machines: the manifest (format, Glance properties, the fit of a
node and of a flavor), the roles' filters that read it, the local image's merge and seal,
the spec's `image:`, and `image rm` refused while a container stands on the image."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from deployer import image_manifest
from deployer.errors import PreflightError, UsageError
from deployer.image_manifest import Manifest
from deployer.paths import ansible_dir

ROOT = Path(__file__).resolve().parents[2]


def manifest(**kw: object) -> Manifest:
    base: dict[str, object] = dict(name="baked-cpu-1", provider="local", gpu=False, roles_hash=image_manifest.roles_hash(),
                                   deployer_version="0.1.0", created_at="2026-11-27T10:00:00+00:00", base="debian bookworm v1",
                                   kernel="6.1.0", torch="torch==2.13.0", openmpi="4.1.4-3", slurm="22.05.8-4",
                                   jupyterlab="jupyterlab==4.6.6")
    base.update(kw)
    return Manifest(**base)  # type: ignore[arg-type]


def test_manifest_is_one_line_of_json_and_reads_back():
    m = manifest()
    text = m.to_json()
    assert "\n" not in text  # the common role reads it on one line beside dpkg's list
    assert image_manifest.parse(text) == m
    assert image_manifest.parse("") is None and image_manifest.parse("{}") is None
    with pytest.raises(ValueError, match="not JSON"):
        image_manifest.parse("{oops")
    with pytest.raises(ValueError, match="format"):
        image_manifest.parse(json.dumps({**json.loads(text), "format": 99}))


def test_manifest_as_glance_properties_round_trips():
    m = manifest(provider="openstack", gpu=True, driver_branch=550, driver_version="550.127.05", cuda="12.6",
                 torch="torch==2.7.1+cu126")
    props = m.as_properties()
    assert all(isinstance(v, str) and k.startswith("deployer_") for k, v in props.items())
    assert props["deployer_driver_branch"] == "550" and props["deployer_gpu"] == "true"
    # The cloud adds its own properties (os_hash_algo, ...): they are left alone.
    assert Manifest.from_properties({**props, "os_distro": "debian", "hw_machine_type": "q35"}) == m
    assert Manifest.from_properties({"os_distro": "debian"}) is None


def test_roles_hash_follows_the_installing_roles_only():
    h = image_manifest.roles_hash()
    assert len(h) == 16 and h == image_manifest.roles_hash()
    assert "ssh_mesh" not in image_manifest.INSTALLING_ROLES  # configuration-only roles never stale a bake
    assert "health" in image_manifest.INSTALLING_ROLES  # bake.yml installs its program and units


def test_roles_hash_changes_with_the_play_that_bakes_and_the_driver_choice(tmp_path, monkeypatch):
    import shutil

    for role in image_manifest.INSTALLING_ROLES:
        shutil.copytree(ROOT / "ansible/roles" / role, tmp_path / "ansible/roles" / role)
    for name in image_manifest.BAKE_INPUTS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.setattr(image_manifest, "assets_root", lambda: tmp_path)
    assert image_manifest.roles_hash() == image_manifest.roles_hash()
    for name in ("ansible/bake.yml", "deployer/gpu_facts.py", "ansible/roles/health/tasks/main.yml"):
        before = image_manifest.roles_hash()
        with (tmp_path / name).open("a") as f:
            f.write("\n# changed\n")
        assert image_manifest.roles_hash() != before, name


def test_a_node_keeps_its_image_or_says_why_in_one_line():
    current = image_manifest.roles_hash()
    cpu = manifest()
    assert image_manifest.unfit(None, roles=current, gpus=0, driver_branch=None) is None
    assert image_manifest.unfit(cpu, roles=current, gpus=0, driver_branch=None) is None
    older = image_manifest.unfit(manifest(roles_hash="0" * 16), roles=current, gpus=0, driver_branch=None)
    assert older and "older roles" in older and "image build" in older and "\n" not in older
    no_driver = image_manifest.unfit(cpu, roles=current, gpus=2, driver_branch=None)
    assert no_driver and "no GPU driver" in no_driver
    gpu = manifest(gpu=True, driver_branch=550, driver_version="550.127.05")
    assert image_manifest.unfit(gpu, roles=current, gpus=1, driver_branch=550) is None
    assert image_manifest.unfit(gpu, roles=current, gpus=1, driver_branch=None) is None
    other = image_manifest.unfit(gpu, roles=current, gpus=1, driver_branch=580)
    assert other and "branch 550" in other and "580" in other


def test_torch_build_is_kept_only_when_it_is_the_choice():
    m = manifest(torch="torch==2.13.0")
    assert image_manifest.torch_unfit(m, "torch==2.13.0") is None
    why = image_manifest.torch_unfit(m, "torch==2.7.1+cu118")
    assert why and "torch==2.13.0" in why and "torch==2.7.1+cu118" in why


def test_flavor_fit_names_a_gpu_bake_on_a_cpu_flavor_and_the_reverse():
    gpu = manifest(gpu=True, driver_branch=550, driver_version="550.127.05")
    assert image_manifest.flavor_unfit(gpu, 1, "g1.large") is None
    assert "no GPU" in (image_manifest.flavor_unfit(gpu, 0, "m1.large") or "")
    assert "--gpu" in (image_manifest.flavor_unfit(manifest(), 4, "g4.xlarge") or "")
    assert image_manifest.flavor_unfit(manifest(), 0, "m1.large") is None


def test_a_vgpu_bake_fits_vgpu_flavors_only_and_the_reverse():
    vgpu = manifest(provider="openstack", gpu=True, driver_branch=550, gpu_virtualization="vgpu")
    whole = manifest(provider="openstack", gpu=True, driver_branch=550, gpu_virtualization="pass-through")
    assert "vGPU guest's driver" in (image_manifest.flavor_unfit(vgpu, 1, "g1.large", "passthrough") or "")
    assert "whole GPU's driver" in (image_manifest.flavor_unfit(whole, 1, "g1.vgpu", "vgpu") or "")
    assert image_manifest.flavor_unfit(vgpu, 1, "g1.vgpu", "vgpu") is None
    assert image_manifest.flavor_unfit(whole, 1, "g1.large", "passthrough") is None
    assert image_manifest.flavor_unfit(whole, 1, "g1.large", None) is None  # the flavor does not say: not refused
    assert image_manifest.flavor_unfit(manifest(provider="openstack", gpu=True), 1, "g1.vgpu", "vgpu") is None  # older bake
    # recorded from the bake's report, round-tripped through Glance's properties
    made = image_manifest.new("b", "openstack", gpu=True, base="u", versions={"gpu_virtualization": "vgpu"}, at="t")
    assert made.gpu_virtualization == "vgpu"
    assert Manifest.from_properties(made.as_properties()) == made
    assert image_manifest.new("b", "openstack", gpu=False, base="u", versions={}, at="t").gpu_virtualization is None


def test_the_roles_filters_read_the_manifest_line(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "ansible/filter_plugins"))
    sys.modules.pop("deployer_image", None)
    import deployer_image  # type: ignore[import-not-found]

    f = deployer_image.FilterModule().filters()
    m = manifest()
    data = f["deployer_image_manifest"](m.to_json())
    assert data["torch"] == "torch==2.13.0"
    assert f["deployer_image_manifest"]("") == {}
    assert f["deployer_image_unfit"](data, image_manifest.roles_hash(), 0, None) == ""
    assert f["deployer_image_unfit"]({}, image_manifest.roles_hash(), 0, None) == ""
    assert "older roles" in f["deployer_image_unfit"](data, "f" * 16, "0", "None")
    assert f["deployer_image_torch_unfit"](data, "torch==2.13.0") == ""


def test_group_vars_split_the_manifest_from_the_package_list():
    import importlib.util

    text = (ROOT / "ansible/group_vars/all.yml").read_text()
    assert "deployer_dpkg_packages" in text and "deployer_dpkg_tagged('image')" in text
    loaded = importlib.util.spec_from_file_location("deployer_image_filters", ROOT / "ansible/filter_plugins/deployer_image.py")
    assert loaded and loaded.loader
    filters = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(filters)
    lines = ["bash", "openmpi-bin", '@@image {"version": 1}', "@@slurm-configured"]
    assert filters.dpkg_packages(lines) == ["bash", "openmpi-bin"]
    assert filters.dpkg_tagged(lines, "image") == '{"version": 1}'
    assert filters.dpkg_tagged(["bash", "@@image "], "image") == filters.dpkg_tagged(["@@image"], "image") == ""
    assert filters.dpkg_tagged(["bash"], "image") == "" and filters.dpkg_packages(None) == []
    common = (ROOT / "ansible/roles/common/tasks/main.yml").read_text()
    assert "@@image" in common and image_manifest.MANIFEST_PATH in common


def test_spec_takes_a_baked_image_name():
    from deployer.spec import build_spec

    assert build_spec(None, image="baked-cpu-20261127-100000").image == "baked-cpu-20261127-100000"
    with pytest.raises(UsageError):
        build_spec(None, image="Not A Name!")


def test_builder_spec_is_a_one_node_cluster_of_its_own():
    from deployer.image_build import BUILDER_MEMORY_MB, builder_spec
    from deployer.spec import ClusterSpec

    spec = ClusterSpec.model_validate({"name": "lab", "nodes": 8, "image": "baked-x", "scheduler": "slurm",
                                       "local": {"subnet": "10.90.0.0/24"}})
    b = builder_spec(spec, gpu=False)
    assert b.nodes == 1 and b.name.startswith("bake-") and b.image is None and b.ttl
    assert "subnet" not in b.local.model_fields_set and b.local.memory_mb >= BUILDER_MEMORY_MB


def _whiteout(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))


@pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts (device nodes) and trusted.* xattrs need root")
def test_merge_applies_the_upper_dir_as_overlayfs_does(tmp_path):
    from deployer.providers.local import baked

    lower, upper, dest = tmp_path / "lower", tmp_path / "upper", tmp_path / "dest"
    (lower / "etc/ssh").mkdir(parents=True)
    (lower / "etc/kept").write_text("lower")
    (lower / "etc/changed").write_text("lower")
    (lower / "etc/ssh/gone").write_text("lower")
    (lower / "opaque").mkdir()
    (lower / "opaque/hidden").write_text("lower")
    (upper / "etc/ssh").mkdir(parents=True)
    (upper / "etc/changed").write_text("upper")
    _whiteout(upper / "etc/ssh/gone")
    (upper / "opaque").mkdir()
    os.setxattr(upper / "opaque", baked.OPAQUE, b"y")
    (upper / "opaque/new").write_text("upper")
    (upper / "opt/deployer/venv").mkdir(parents=True)
    (upper / "opt/deployer/venv/python").write_text("py")
    baked.merge(lower, upper, dest)
    assert (dest / "etc/kept").read_text() == "lower" and (dest / "etc/changed").read_text() == "upper"
    assert not (dest / "etc/ssh/gone").exists() and (dest / "etc/ssh").is_dir()
    assert sorted(p.name for p in (dest / "opaque").iterdir()) == ["new"]
    assert (dest / "opt/deployer/venv/python").read_text() == "py"
    assert (lower / "etc/changed").read_text() == "lower"  # the base version is never written


def test_seal_unlinks_and_never_writes_into_a_linked_file(tmp_path):
    from deployer.providers.local import baked

    base, root = tmp_path / "base", tmp_path / "root"
    for rel, text in {"etc/machine-id": "abc\n", "etc/ssh/ssh_host_ed25519_key": "k", "var/log/syslog": "log",
                      "var/lib/apt/lists/x_Packages": "p", "home/deployer/.ssh/authorized_keys": "k",
                      "var/lib/cloud/instance/boot-finished": "", "etc/munge/munge.key": "m",
                      "root/.config/pip/pip.conf": "secret", "etc/keep": "kept"}.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    os.system(f"cp -al {base} {root}")
    baked.seal(root)
    assert (root / "etc/machine-id").read_text() == ""
    assert (base / "etc/machine-id").read_text() == "abc\n"  # a link into the base: unlinked, not truncated
    for gone in ("etc/ssh/ssh_host_ed25519_key", "var/log/syslog", "var/lib/apt/lists/x_Packages", "home/deployer/.ssh",
                 "var/lib/cloud", "etc/munge/munge.key", "root/.config/pip"):
        assert not (root / gone).exists(), gone
    assert (root / "etc/keep").read_text() == "kept" and (root / "var/log").is_dir()


def _lxc_config(lxc: Path, node: str, lower: Path) -> None:
    (lxc / node).mkdir(parents=True)
    (lxc / node / "config").write_text(f"lxc.rootfs.path = overlay:{lower}:{lxc / node / 'upper'}\n")


def test_image_rm_is_refused_while_a_container_stands_on_it(tmp_path, monkeypatch):
    from deployer import image_build
    from deployer.providers.local import baked

    monkeypatch.setattr(baked, "BAKED_ROOT", tmp_path / "baked")
    monkeypatch.setattr(baked, "LXC_PATH", tmp_path / "lxc")
    m = manifest(name="baked-a")
    target = baked.rootfs("baked-a") / image_manifest.MANIFEST_PATH.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_text(m.to_json())
    _lxc_config(tmp_path / "lxc", "lab-master", baked.rootfs("baked-a"))
    assert [i.name for i in baked.images()] == ["baked-a"]
    with pytest.raises(UsageError, match="in use by container lab-master") as e:
        image_build.remove("local", "baked-a")
    assert "\n" not in str(e.value)
    assert baked.rootfs("baked-a").exists()
    (tmp_path / "lxc/lab-master/config").unlink()
    image_build.remove("local", "baked-a")
    assert not (tmp_path / "baked/baked-a").exists()
    with pytest.raises(UsageError, match="no baked image"):
        image_build.remove("local", "baked-a")


def test_up_preflight_refuses_a_missing_or_unfit_image_before_anything_is_made(monkeypatch):
    from deployer import lifecycle
    from deployer.providers import local
    from deployer.providers.local import baked
    from deployer.spec import ClusterSpec

    assert local is not None
    lifecycle.check_image(ClusterSpec(name="lab"), None)  # no image: nothing to check
    monkeypatch.setattr(baked, "lookup", lambda name: None)
    with pytest.raises(PreflightError, match="no such baked image"):
        lifecycle.check_image(ClusterSpec(name="lab", image="baked-x"), None)
    monkeypatch.setattr(baked, "lookup", lambda name: manifest(name=name, gpu=True, driver_branch=550))
    with pytest.raises(PreflightError, match="GPU bake"):
        lifecycle.check_image(ClusterSpec(name="lab", image="baked-x"), None)


def test_glance_store_reads_the_flavor_the_preflight_learnt():
    from deployer.providers.openstack.images import GlanceImages
    from deployer.providers.openstack.preflight import PreflightResult
    from deployer.spec import ClusterSpec

    fields = PreflightResult.__dataclass_fields__
    assert "gpus_per_node" in fields and "flavor" in fields
    assert GlanceImages().flavor_gpus(ClusterSpec(name="lab"), None) == (0, "m1.large")
    # enable_gpu on a flavor that asks for no GPU: the preflight assumes 1 per node, the bake's fit does not
    assumed = PreflightResult(cloud="c", project_id="p", flavor="m1.large", vcpus=4, ram_mb=8192, flavor_gpus=0,
                              gpus_per_node=1, image_id="i", existing_nodes=[], warnings=[])
    assert GlanceImages().flavor_gpus(ClusterSpec(name="lab"), assumed) == (0, "m1.large")
    gpu_bake = manifest(name="baked-gpu-1", provider="openstack", gpu=True, driver_branch=550)
    assert "asks for no GPU" in (image_manifest.flavor_unfit(gpu_bake, *GlanceImages().flavor_gpus(
        ClusterSpec(name="lab"), assumed)) or "")


def test_a_gpu_bake_needs_enable_gpu_and_the_branch_it_has(monkeypatch):
    """A GPU bake with enable_gpu off, or a driver branch pinned other than the bake's, is
    refused before anything is made: its nodes would either not use the GPUs, or keep the
    image's driver (the role keeps a working one) and reinstall the rest for nothing."""
    from deployer import lifecycle
    from deployer.providers.openstack import images
    from deployer.spec import ClusterSpec

    monkeypatch.setattr(images.GlanceImages, "lookup",
                        lambda self, name: manifest(name=name, provider="openstack", gpu=True, driver_branch=550))
    monkeypatch.setattr(images.GlanceImages, "flavor_gpus", lambda self, spec, checked: (1, "g1.large"))

    def spec(**openstack: object) -> ClusterSpec:
        return ClusterSpec.model_validate({"name": "lab", "provider": "openstack", "image": "baked-gpu-1",
                                           "openstack": {"flavor": "g1.large", **openstack}})

    with pytest.raises(PreflightError, match="enable_gpu is false"):
        lifecycle.check_image(spec(), None)
    with pytest.raises(PreflightError, match="driver branch 550 and openstack.nvidia_driver_branch is 580"):
        lifecycle.check_image(spec(enable_gpu=True, nvidia_driver_branch=580), None)
    lifecycle.check_image(spec(enable_gpu=True, nvidia_driver_branch=550), None)
    lifecycle.check_image(spec(enable_gpu=True), None)
    # the flavor's word, as the preflight records it in the spec, against how the bake's GPU came
    monkeypatch.setattr(images.GlanceImages, "lookup", lambda self, name: manifest(
        name=name, provider="openstack", gpu=True, driver_branch=550, gpu_virtualization="pass-through"))
    with pytest.raises(PreflightError, match="whole GPU's driver and flavor g1.large gives a vGPU"):
        lifecycle.check_image(spec(enable_gpu=True, gpu_virtualization="vgpu"), None)
    lifecycle.check_image(spec(enable_gpu=True, gpu_virtualization="passthrough"), None)


def test_a_baked_image_replaces_openstack_image_for_the_nodes():
    from deployer.providers.openstack.preflight import with_baked_image
    from deployer.spec import ClusterSpec

    assert with_baked_image(ClusterSpec(name="lab")).image == "Ubuntu 22.04"
    assert with_baked_image(ClusterSpec(name="lab", provider="openstack", image="baked-gpu-1")).image == "baked-gpu-1"


def test_sealed_lists_read_as_stale_so_apt_fetches_them(tmp_path):
    from deployer.providers.local import baked

    (tmp_path / "var/lib/apt/lists").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "var/lib/apt/lists/deb.debian.org_Packages").write_text("p")
    baked.seal(tmp_path)
    lists = tmp_path / "var/lib/apt/lists"
    assert [p.name for p in lists.iterdir()] == ["partial"] and lists.stat().st_mtime == 0


class _Times:
    def stage(self, name: str):
        import contextlib

        return contextlib.nullcontext()

    def write(self, run_dir: Path) -> dict[str, float]:
        return {"total_s": 1.0}


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_the_builder_is_deleted_whatever_happens(tmp_path, monkeypatch, stop):
    """A failed bake and a Ctrl-C (KeyboardInterrupt, what signals.py makes of SIGINT,
    SIGTERM and SIGHUP) both end in `down` of the builder, and then go on as they were."""
    from types import SimpleNamespace

    from deployer import image_build, lifecycle
    from deployer.providers.local import baked
    from deployer.spec import ClusterSpec

    monkeypatch.setattr(baked, "lookup", lambda name: None)
    downs: list[str] = []
    run = SimpleNamespace(times=_Times(), run_dir=tmp_path, checked=None)
    monkeypatch.setattr(lifecycle, "preflight", lambda spec, state, replace, check_level=None: run)
    monkeypatch.setattr(lifecycle, "begin", lambda run, ttl_given: None)
    monkeypatch.setattr(lifecycle, "prepare", lambda run: None)
    monkeypatch.setattr(lifecycle, "provision", lambda run: SimpleNamespace(names=("b-master",)))
    monkeypatch.setattr(image_build.inventory, "write", lambda cluster, spec, state: tmp_path / "hosts.yml")
    monkeypatch.setattr(lifecycle, "wait_for_nodes", lambda run, cluster, names: None)

    def bake(run: object, inv: Path, gpu: bool) -> dict[str, str | None]:
        raise stop("stopped in the bake")

    monkeypatch.setattr(image_build, "bake", bake)
    monkeypatch.setattr(lifecycle, "down", lambda state: downs.append(state.name) or True)
    with pytest.raises(stop):
        image_build.build(ClusterSpec(name="lab"), tmp_path, gpu=False)
    assert len(downs) == 1 and downs[0].startswith("bake-")


def test_a_gpu_bake_is_refused_locally_before_anything_is_made(tmp_path):
    from deployer import image_build
    from deployer.spec import ClusterSpec

    with pytest.raises(UsageError, match="--gpu"):
        image_build.build(ClusterSpec(name="lab"), tmp_path, gpu=True)
    assert list(tmp_path.iterdir()) == []


def test_the_baked_remount_unit_is_the_one_site_yml_writes():
    """The bake enables site.yml's unit in the image; the same text, so a node of the
    image finds it unchanged (no rewrite, no daemon-reload) when the shared dir is the same."""
    import yaml

    def unit(plays: list[dict], play_name_part: str) -> str:
        for play in plays:
            if play_name_part in play["name"]:
                return next(t["ansible.builtin.copy"]["content"] for t in play["tasks"]
                            if t.get("ansible.builtin.copy", {}).get("dest") == "/etc/systemd/system/deployer-shared-nosuid.service")
        raise AssertionError(play_name_part)

    site = yaml.safe_load((ROOT / "ansible/site.yml").read_text())
    bake = yaml.safe_load((ROOT / "ansible/bake.yml").read_text())
    assert unit(site, "Shared storage") == unit(bake, "remount unit")


def test_baked_node_exporter_waits_for_its_roles_flags():
    text = (ROOT / "ansible/roles/node_exporter/tasks/install.yml").read_text()
    assert "ConditionPathExists=/etc/default/prometheus-node-exporter" in text
    assert "path: /etc/default/prometheus-node-exporter\n    state: absent" in text


def test_up_warns_when_the_image_is_older_than_the_roles(monkeypatch):
    from deployer import lifecycle, ui
    from deployer.providers.local import baked
    from deployer.spec import ClusterSpec

    said: list[str] = []
    monkeypatch.setattr(ui, "warn", said.append)
    monkeypatch.setattr(baked, "lookup", lambda name: manifest(name=name, roles_hash="0" * 16))
    lifecycle.check_image(ClusterSpec(name="lab", image="baked-old"), None)
    assert len(said) == 1 and "older than the roles" in said[0] and "image build" in said[0]
    said.clear()
    monkeypatch.setattr(baked, "lookup", lambda name: manifest(name=name))
    lifecycle.check_image(ClusterSpec(name="lab", image="baked-new"), None)
    assert said == []


def test_bake_play_leaves_out_only_the_training_environment_when_asked(monkeypatch, tmp_path):
    from deployer import image_build
    from deployer.tools import ansible

    calls = []
    monkeypatch.setattr(ansible, "run_playbook", lambda *a, **kw: calls.append((a, kw)))
    image_build.bake_play(tmp_path / "hosts.yml", tmp_path, gpu=False)
    image_build.bake_play(tmp_path / "hosts.yml", tmp_path, gpu=True, runtime=False)
    assert [kw["playbook"] for _, kw in calls] == ["bake.yml", "bake.yml"]
    assert [kw["skip_tags"] for _, kw in calls] == [None, [image_build.RUNTIME_TAG]]
    assert calls[1][1]["extravars"] == {"deployer_bake_gpu": True, "deployer_image_venv": image_manifest.IMAGE_VENV}
    # The tag is on the training environment's play alone, the one that reports the versions.
    plays = yaml.safe_load((ansible_dir() / "bake.yml").read_text())
    tagged = [p for p in plays if image_build.RUNTIME_TAG in p.get("tags", [])]
    assert len(tagged) == 1 and "training environment" in tagged[0]["name"]
    assert any("set_stats" in str(t) for t in tagged[0]["tasks"])
    assert not any(image_build.RUNTIME_TAG in str(t.get("tags", "")) for p in plays for t in p["tasks"])


def test_the_seal_writes_the_manifest_where_the_common_role_reads_it(tmp_path):
    """image_build.seal's first lines, run by bash: the file a node of the image reads
    (an OpenStack snapshot carries the disk only; Glance's properties reach no node)."""
    import subprocess

    from deployer import image_build

    m = manifest(name="baked-cpu-x", torch="torch==2.13.0+cpu")
    path = tmp_path / "etc" / "deployer" / "image.json"
    script = image_build.manifest_script(m, str(path))
    assert subprocess.run(["bash", "-c", script + "echo sealed"], capture_output=True, text=True).stdout == "sealed\n"
    assert image_manifest.parse(path.read_text()) == m
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_text().count("\n") == 1
    # A write that fails stops the seal: no image without its manifest.
    (tmp_path / "a-file").write_text("")  # no directory can be made under it, not even by root
    bad = image_build.manifest_script(m, str(tmp_path / "a-file" / "deployer" / "image.json"))
    failed = subprocess.run(["bash", "-c", bad + "echo sealed"], capture_output=True, text=True)
    assert failed.returncode == 1 and "sealed" not in failed.stdout


def test_the_gpu_bake_plays_bake_no_cluster_settings_and_lose_nothing_to_end_host():
    """The driver role leaves a node with meta: end_host, which ends the rest of its play on
    that node: it is alone in its play (DCGM's tooling is the next one). Of dcgm_exporter
    the bake takes the install part only: a baked unit would start on every node bound to
    the builder's address."""
    import yaml

    plays = yaml.safe_load((ROOT / "ansible/bake.yml").read_text())

    def roles(play: dict) -> list[dict]:
        return [t["ansible.builtin.include_role"] for t in play.get("tasks", []) if "ansible.builtin.include_role" in t]

    driver = [p for p in plays if any(r["name"] == "nvidia_driver" for r in roles(p))]
    assert len(driver) == 1 and [r["name"] for r in roles(driver[0])] == ["nvidia_driver"]
    dcgm = [r for p in plays for r in roles(p) if r["name"] == "dcgm_exporter"]
    assert dcgm and all(r.get("tasks_from") == "install.yml" for r in dcgm)
    install = (ROOT / "ansible/roles/dcgm_exporter/tasks/install.yml").read_text()
    assert "dcgm-exporter.service" not in install and "private_ip" not in install and "listen_address" not in install
    assert plays.index(driver[0]) < next(i for i, p in enumerate(plays) if any(r["name"] == "dcgm_exporter" for r in roles(p)))
