"""The jupyterlab role as Ansible renders it: loopback only, password as a hash, the
training environment as the kernel, a login-shell environment, Prometheus's scrape job.

The role runs for real on the local cluster (tests/integration/test_notebook.py); here
its templates go through Ansible's own template module on this machine.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import yaml

from tests.role_checks import assert_layout_and_defaults
from tests.unit.test_monitoring_ansible import ANSIBLE_PLAYBOOK, REPO, ROLES_DIR, inventory, render_prometheus_config, run_playbook

pytestmark = pytest.mark.slow  # Ansible renders the roles (a playbook run each)

ROLE = ROLES_DIR / "jupyterlab"
needs_ansible = pytest.mark.skipif(ANSIBLE_PLAYBOOK is None, reason="ansible-playbook not installed (pip install ansible-core)")
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def test_role_layout_and_every_default_specified():
    spec = assert_layout_and_defaults(ROLE, "jupyterlab_", {"jupyterlab_password"})  # its check would print it
    assert "jupyterlab_password" not in spec


def test_secret_bearing_tasks_are_no_log():
    tasks = yaml.safe_load((ROLE / "tasks/jupyterlab.yml").read_text())
    for task in tasks:
        text = json.dumps(task)
        if "jupyterlab_password" in text or "jupyterlab_hash.stdout" in text or task.get("register") == "jupyterlab_hash":
            assert task.get("no_log") is True, task["name"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    if ANSIBLE_PLAYBOOK is None:
        pytest.skip("ansible-playbook not installed (pip install ansible-core)")
    tmp = tmp_path_factory.mktemp("jupyterlab")
    out = tmp / "out"
    out.mkdir()
    tpl = ROLE / "templates"
    play = [{
        "hosts": "master", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults/main.yml")],
        "vars": {"jupyterlab_hashed_password": "argon2:$argon2id$v=19$m=10240,t=10,p=8$c2FsdA$aGFzaA"},
        "tasks": [
            {"ansible.builtin.template": {
                "src": str(tpl / "jupyterlab.service.j2"), "dest": str(out / "jupyterlab.service"), "mode": "0644",
            }},
            {"ansible.builtin.template": {
                "src": str(tpl / "deployer-jupyterlab.json.j2"), "dest": str(out / "config.json"), "mode": "0600",
            }},
            {"ansible.builtin.template": {"src": str(tpl / "kernel.json.j2"), "dest": str(out / "kernel.json"), "mode": "0644"}},
        ],
    }]
    r = run_playbook(play, inventory(tmp), tmp, "-e", json.dumps(LOCAL))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_the_unit_binds_the_loopback_on_the_command_line(rendered):
    unit = (rendered / "jupyterlab.service").read_text()
    (exec_start,) = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    # Flags outrank every config file, the user's ~/.jupyter included.
    assert "--ServerApp.ip=127.0.0.1" in exec_start and "--ServerApp.port=8888" in exec_start
    assert "--ServerApp.port_retries=0" in exec_start, "a taken port must fail, not move where the tunnel does not go"
    # A login shell: /etc/profile.d/deployer-env.sh gives the same PATH as `deployer ssh`.
    assert exec_start.startswith(
        "ExecStart=/bin/bash -lc 'exec /shared/venv/bin/jupyter lab --config=/etc/jupyter/deployer-jupyterlab.json"
    )
    assert "User=deployer" in unit and "WorkingDirectory=/shared" in unit and "RequiresMountsFor=/shared" in unit


def test_the_config_holds_a_hash_and_no_token(rendered):
    cfg = json.loads((rendered / "config.json").read_text())
    assert cfg["PasswordIdentityProvider"]["hashed_password"].startswith("argon2:")
    assert cfg["IdentityProvider"]["token"] == "", "password login only: no token in URLs or logs"
    assert cfg["ServerApp"]["root_dir"] == "/shared"
    assert "ip" not in cfg["ServerApp"] and "port" not in cfg["ServerApp"], "address and port live on the command line"
    assert cfg["LabApp"]["news_url"] is None


def test_the_default_kernel_is_the_training_environment(rendered):
    kernel = json.loads((rendered / "kernel.json").read_text())
    assert kernel["argv"][:3] == ["/shared/venv/bin/python", "-m", "ipykernel_launcher"]
    assert "{connection_file}" in kernel["argv"]


@needs_ansible
@pytest.mark.parametrize("address", ["0.0.0.0", "10.77.0.10"])
def test_the_role_refuses_a_non_loopback_address(tmp_path, address):
    play = [{"hosts": "master", "gather_facts": False, "roles": ["jupyterlab"]}]
    r = run_playbook(play, inventory(tmp_path), tmp_path, "-e", json.dumps({**LOCAL, "jupyterlab_address": address}))
    assert r.returncode != 0
    assert "jupyterlab_address" in r.stdout and "Validating arguments against arg spec" in r.stdout
    assert not (tmp_path / "secrets").exists(), "refused before anything ran (no password generated)"


@pytest.mark.parametrize("enabled", [True, False])
def test_prometheus_scrapes_jupyterlab_on_the_masters_loopback_when_on(tmp_path, enabled):
    if ANSIBLE_PLAYBOOK is None:
        pytest.skip("ansible-playbook not installed (pip install ansible-core)")
    rules = tmp_path / "rules"
    rules.mkdir()
    for f in (REPO / "monitoring/prometheus/rules").glob("*.yml"):
        shutil.copy(f, rules)
    out = render_prometheus_config(tmp_path, inventory(tmp_path), {"prometheus_rules_dir": str(rules), "deployer_jupyter_enabled": enabled})
    jobs = {j["job_name"]: j for j in yaml.safe_load(out.read_text())["scrape_configs"]}
    if not enabled:
        assert "jupyterlab" not in jobs
        return
    (sc,) = jobs["jupyterlab"]["static_configs"]
    assert sc == {"targets": ["127.0.0.1:8888"], "labels": {"instance": "demo-master"}}
