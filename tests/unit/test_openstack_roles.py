"""The OpenStack-only roles (nfs_server, nfs_client, nvidia_driver) without a cloud.

NVIDIA drivers never run on this machine, and kernel NFS only on the emulated VMs of
tests/vm (`make vm-tests`), so these check what can be checked in seconds: playbook
syntax, ansible-lint's production profile when it is installed, defaults against
meta/argument_specs.yml, the templates rendered by Ansible itself, and nvidia_driver's
skip paths run for real (check mode) on this machine, which has no NVIDIA device.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import needs

pytestmark = pytest.mark.slow  # Ansible renders the roles (a playbook run each)

ROOT = Path(__file__).resolve().parents[2]
ROLES_DIR = ROOT / "ansible" / "roles"
ROLES = ("nfs_server", "nfs_client", "nvidia_driver")
BIN = Path(sys.executable).parent

PLAY = """\
---
- name: NFS server on the master
  hosts: master
  become: true
  roles:
    - nfs_server

- name: NFS client on the workers
  hosts: workers
  become: true
  roles:
    - nfs_client

- name: NVIDIA driver on GPU nodes
  hosts: gpu
  become: true
  roles:
    - nvidia_driver
"""


def inventory(connection: str = "ssh", **group_vars) -> dict:
    """The shape deployer/pipeline/inventory.py renders (only the keys these roles read)."""
    return {
        "all": {
            "vars": {
                "deployer_cluster_name": "horovod",
                "deployer_cluster_id": "0123456789ab",
                "deployer_provider": "openstack",
                "deployer_grafana_installable": True,
                "deployer_shared_storage": "nfs",
                "deployer_host_package_sources": False,
                "deployer_ssh_user": "ubuntu",
                "deployer_shared_dir": "/shared",
                "deployer_cluster_cidr": "192.168.77.0/24",
                "deployer_shared_device": "/dev/disk/by-id/virtio-0123456789abcdef0123",
                "deployer_enable_gpu": True,
                "deployer_nvidia_driver_install": True,
                "deployer_monitoring_enabled": True,
                "ansible_connection": connection,
                "ansible_python_interpreter": sys.executable,
                **group_vars,
            },
            "hosts": {
                "horovod-master": {
                    "ansible_host": "127.0.0.1",
                    "private_ip": "192.168.77.10",
                    "node_role": "master",
                    "node_index": 0,
                    "gpus": 1,
                },
                "horovod-worker-1": {
                    "ansible_host": "127.0.0.1",
                    "private_ip": "192.168.77.11",
                    "node_role": "worker",
                    "node_index": 1,
                    "gpus": 1,
                },
            },
            "children": {
                "master": {"hosts": {"horovod-master": {}}},
                "workers": {"hosts": {"horovod-worker-1": {}}},
                "gpu": {"hosts": {"horovod-master": {}, "horovod-worker-1": {}}},
            },
        }
    }


def tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        needs.missing(f"{name} is not installed")
    return found


def ansible_env(tmp_path: Path) -> dict[str, str]:
    import os

    return {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROLES_DIR),
        "ANSIBLE_FILTER_PLUGINS": str(ROLES_DIR.parent / "filter_plugins"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
    }


def run_playbook(tmp_path: Path, play: str, inv: dict, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "play.yml").write_text(play)
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    return subprocess.run(
        [tool("ansible-playbook"), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"), *args],
        capture_output=True,
        text=True,
        env=ansible_env(tmp_path),
        timeout=300,
        check=False,
    )


def test_syntax_check(tmp_path):
    r = run_playbook(tmp_path, PLAY, inventory(), "--syntax-check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_site_yml_syntax_check(tmp_path):
    r = subprocess.run(
        [tool("ansible-playbook"), "-i", "localhost,", str(ROOT / "ansible" / "site.yml"), "--syntax-check"],
        capture_output=True,
        text=True,
        env=ansible_env(tmp_path),
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ansible_lint_production_profile(tmp_path):
    lint = tool("ansible-lint")
    r = subprocess.run(
        [lint, "--offline", "--profile", "production", "--nocolor", *(f"roles/{role}" for role in ROLES)],
        cwd=ROOT / "ansible",
        capture_output=True,
        text=True,
        env=ansible_env(tmp_path),
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("role", ROLES)
def test_role_layout_and_argument_specs(role):
    d = ROLES_DIR / role
    for part in ("defaults/main.yml", "tasks/main.yml", "handlers/main.yml", "meta/main.yml", "meta/argument_specs.yml"):
        assert (d / part).is_file(), f"{role}: {part} missing"
    defaults = yaml.safe_load((d / "defaults" / "main.yml").read_text())
    options = yaml.safe_load((d / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for key in defaults:
        assert key.startswith(f"{role}_"), f"{role}: default {key} is not role-prefixed"
        assert key in options, f"{role}: default {key} is not in meta/argument_specs.yml"
        assert options[key].get("description"), f"{role}: {key} has no description"
    # Defaults are commented (geerlingguy style): a comment line before every default.
    lines = (d / "defaults" / "main.yml").read_text().splitlines()
    for key in defaults:
        i = next(n for n, line in enumerate(lines) if line.startswith(f"{key}:"))
        block = lines[:i]
        while block and (block[-1].startswith(f"{role}_") or block[-1].startswith("  ")):
            block.pop()  # a default may share the comment of the one before it
        assert block and block[-1].startswith("#"), f"{role}: {key} has no comment"


def test_roles_use_no_collection_outside_ansible_core():
    for role in ROLES:
        for path in (ROLES_DIR / role).rglob("*.yml"):
            for line in path.read_text().splitlines():
                stripped = line.strip()
                if stripped.endswith(":") and "." in stripped and not stripped.startswith("#"):
                    module = stripped[:-1].lstrip("- ")
                    if module.count(".") == 2 and " " not in module:
                        assert module.startswith("ansible.builtin."), f"{path}: {module} is not in ansible-core"


def test_no_shell_module():
    for role in ROLES:
        for path in (ROLES_DIR / role).rglob("*.yml"):
            text = path.read_text()
            assert "ansible.builtin.shell" not in text and "\n  shell:" not in text, path


RENDER = """\
---
- name: Render the roles' templates as the roles would
  hosts: localhost
  gather_facts: false
  vars_files:
    - {roles}/nfs_server/defaults/main.yml
    - {roles}/nfs_client/defaults/main.yml
  vars:
    nfs_server_volume: /dev/disk/by-id/virtio-0123456789abcdef0123
    nfs_server_volume_fstype: ext4
  tasks:
    - name: Render
      ansible.builtin.template:
        src: "{{{{ item.src }}}}"
        dest: "{out}/{{{{ item.dest }}}}"
        mode: "0644"
      loop:
        - {{src: "{roles}/nfs_server/templates/volume.mount.j2", dest: server.mount}}
        - {{src: "{roles}/nfs_server/templates/deployer.exports.j2", dest: deployer.exports}}
        - {{src: "{roles}/nfs_client/templates/nfs.mount.j2", dest: client.mount}}
    - name: Unit names
      ansible.builtin.copy:
        content: "{{{{ {{'server': nfs_server_mount_unit, 'client': nfs_client_mount_unit}} | to_json }}}}"
        dest: "{out}/units.json"
        mode: "0644"
"""


@pytest.mark.parametrize(
    ("shared_dir", "unit"),
    [("/shared", "shared.mount"), ("/mnt/team-data", "mnt-team\\x2ddata.mount")],
)
def test_templates_render(tmp_path, shared_dir, unit):
    out = tmp_path / "out"
    out.mkdir()
    inv = inventory(connection="local", deployer_shared_dir=shared_dir)
    inv["all"]["hosts"]["localhost"] = {"private_ip": "127.0.0.1"}
    play = RENDER.format(roles=ROLES_DIR, out=out)
    r = run_playbook(tmp_path, play, inv)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((out / "units.json").read_text()) == {"server": unit, "client": unit}
    exports = (out / "deployer.exports").read_text()
    assert f"{shared_dir} 192.168.77.0/24(rw,sync,no_subtree_check,root_squash)" in exports
    server = (out / "server.mount").read_text()
    assert f"Where={shared_dir}\n" in server and "What=/dev/disk/by-id/virtio-0123456789abcdef0123\n" in server
    client = (out / "client.mount").read_text()
    assert f"What=192.168.77.10:{shared_dir}\n" in client and "Type=nfs\n" in client


def test_nvidia_driver_skips_cleanly_without_a_gpu(tmp_path):
    """Runs for real on this machine (check mode, connection local): no NVIDIA device."""
    if shutil.which("lspci") is None:
        needs.missing("lspci (pciutils) is not installed here")
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("this machine has an NVIDIA driver")
    inv = inventory(connection="local")
    del inv["all"]["hosts"]["horovod-worker-1"]
    inv["all"]["children"] = {"gpu": {"hosts": {"horovod-master": {}}}}
    play = "---\n- name: NVIDIA driver\n  hosts: gpu\n  gather_facts: false\n  roles:\n    - nvidia_driver\n"
    r = run_playbook(tmp_path, play, inv, "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "lspci shows no NVIDIA device" in r.stdout and "failed=0" in r.stdout
    r = run_playbook(tmp_path, play, inv, "--check", "-e", "deployer_nvidia_driver_install=false")
    assert r.returncode == 0 and "nvidia_driver_install is false" in r.stdout, r.stdout + r.stderr


# ---- the teardown timer on every supported image's Python ------------------------------------------

# The Python 3 of each image docs/openstack.md supports ("Images"): the teardown venv is
# made with the image's own python3.
IMAGE_PYTHONS = {"Ubuntu 22.04": "3.10", "Debian 12": "3.11", "Ubuntu 24.04": "3.12"}
TEARDOWN_SCRIPT = ROOT / "deployer" / "providers" / "openstack" / "teardown.py"


@pytest.mark.parametrize(("image", "python"), sorted(IMAGE_PYTHONS.items()))
def test_the_teardown_pins_install_on_each_images_python(image, python, tmp_path):
    """pip resolves the role's pins, dependencies and all, for that Python (wheels only,
    as for a node with no compiler): openstacksdk 4.22 needed 3.11 and failed on 22.04."""
    pins = yaml.safe_load((ROLES_DIR / "teardown_timer/defaults/main.yml").read_text())["teardown_timer_packages"]
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
                        "--python-version", python, "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                        "-d", str(tmp_path), *pins], capture_output=True, text=True, timeout=600)
    if r.returncode and ("Could not fetch" in r.stdout + r.stderr or "NewConnectionError" in r.stdout + r.stderr):
        pytest.skip("PyPI unreachable")
    assert r.returncode == 0, f"{image} (Python {python}) cannot install {pins}:\n{r.stderr[-2000:]}"


def test_the_teardown_script_runs_on_the_oldest_images_python():
    """vermin reads the script for the lowest Python its syntax and standard library need
    (datetime.UTC, used before, is 3.11)."""
    vermin = shutil.which("vermin", path=str(BIN))
    oldest = min(IMAGE_PYTHONS.values(), key=lambda v: tuple(map(int, v.split("."))))
    r = subprocess.run([vermin, "--no-tips", "--violations", f"--target={oldest}-", "--eval-annotations",
                        str(TEARDOWN_SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
