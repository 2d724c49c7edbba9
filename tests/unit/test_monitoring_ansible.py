"""The monitoring roles: syntax, argument specs, and the scrape configuration they render.

The Prometheus configuration is rendered by Ansible itself (the template module, on
this machine, over a sample inventory), then checked with promtool when it is there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # Ansible renders the roles (a playbook run each)

REPO = Path(__file__).resolve().parents[2]
ROLES_DIR = REPO / "ansible" / "roles"
ROLES = ["node_exporter", "prometheus", "pushgateway", "grafana", "dcgm_exporter"]
BIN = Path(sys.executable).parent
ANSIBLE_PLAYBOOK = str(BIN / "ansible-playbook") if (BIN / "ansible-playbook").exists() else shutil.which("ansible-playbook")
PROMTOOL = shutil.which("promtool")
needs_ansible = pytest.mark.skipif(ANSIBLE_PLAYBOOK is None, reason="ansible-playbook not installed (pip install ansible-core)")

# Role defaults that are not in meta/argument_specs.yml, and why.
UNSPECIFIED = {"grafana_admin_password"}  # the spec check would print it on failure


def inventory(tmp: Path, *, gpu_hosts=("demo-worker-2",), nodes=3, ip_base="10.77.0.") -> Path:
    hosts = {}
    for i in range(nodes):
        name = "demo-master" if i == 0 else f"demo-worker-{i}"
        hosts[name] = {"ansible_host": f"{ip_base}{10 + i}", "ansible_user": "deployer", "private_ip": f"{ip_base}{10 + i}",
                       "node_role": "master" if i == 0 else "worker", "node_index": i,
                       "gpus": 1 if name in gpu_hosts else 0}
    inv = {"all": {
        "vars": {"deployer_cluster_name": "demo", "deployer_provider": "local", "deployer_grafana_installable": False,
                 "deployer_shared_storage": "host_bind", "deployer_host_package_sources": True, "deployer_ssh_user": "deployer",
                 "deployer_shared_dir": "/shared", "deployer_cluster_cidr": f"{ip_base}0/24",
                 "deployer_monitoring_enabled": True, "deployer_monitoring_expose": False,
                 "deployer_monitoring_allowed_cidrs": [], "deployer_monitoring_retention": "15d",
                 "deployer_grafana_enabled": True, "deployer_secrets_dir": str(tmp / "secrets"),
                 "deployer_repo_dir": str(REPO)},
        "hosts": hosts,
        "children": {"master": {"hosts": {"demo-master": {}}},
                     "workers": {"hosts": {h: {} for h in hosts if h != "demo-master"}},
                     "gpu": {"hosts": {h: {} for h in gpu_hosts if h in hosts}}},
    }}
    path = tmp / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def run_playbook(play: list, inv: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    pb = tmp / "play.yml"
    pb.write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROLES_DIR), "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(inv), str(pb), *args], capture_output=True, text=True, env=env)


def render_prometheus_config(tmp: Path, inv: Path, extra_vars: dict | None = None) -> Path:
    """monitoring/prometheus/prometheus.yml.j2 through Ansible's template module, as the role does."""
    out = tmp / "prometheus.yml"
    play = [{
        "name": "render prometheus.yml", "hosts": "master", "gather_facts": False,
        "vars_files": [str(ROLES_DIR / "prometheus" / "defaults" / "main.yml")],
        "tasks": [{"ansible.builtin.template": {"src": "{{ prometheus_config_template }}", "dest": str(out),
                                                "mode": "0644"}}],
    }]
    ev = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **(extra_vars or {})}
    r = run_playbook(play, inv, tmp, "-e", json.dumps(ev))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


@needs_ansible
def test_playbook_with_the_monitoring_roles_passes_syntax_check(tmp_path):
    # The monitoring plays of ansible/site.yml: exporters on every node, DCGM on GPU nodes,
    # the master's stack (the other roles belong to other plays).
    site = yaml.safe_load((REPO / "ansible" / "site.yml").read_text())
    def roles(play):  # listed, or included where they apply
        listed = [r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])]
        return listed + [t["ansible.builtin.include_role"]["name"] for t in play.get("tasks", []) if "ansible.builtin.include_role" in t]

    plays = [p for p in site if any(r in ROLES for r in roles(p))]
    assert len(plays) == 3
    r = run_playbook(plays, inventory(tmp_path), tmp_path, "--syntax-check")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("role", ROLES)
def test_role_layout(role):
    d = ROLES_DIR / role
    for f in ("defaults/main.yml", "tasks/main.yml", "handlers/main.yml", "meta/main.yml", "meta/argument_specs.yml"):
        assert (d / f).is_file(), f"{role}/{f}"
    assert yaml.safe_load((d / "meta/main.yml").read_text())["galaxy_info"]["role_name"] == role


@pytest.mark.parametrize("role", ROLES)
def test_defaults_are_prefixed_and_specified(role):
    d = ROLES_DIR / role
    defaults = yaml.safe_load((d / "defaults/main.yml").read_text())
    spec = yaml.safe_load((d / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for name in defaults:
        assert name.startswith(role + "_"), f"{role}: default {name} is not prefixed with the role name"
        if name not in UNSPECIFIED:
            assert name in spec, f"{role}: {name} is not in meta/argument_specs.yml"
    for name, opt in spec.items():
        assert opt.get("description"), f"{role}: {name} has no description"
        if "default" in opt and name in defaults:
            assert opt["default"] == defaults[name], f"{role}: {name} default differs from defaults/main.yml"


@pytest.mark.parametrize("role", ROLES)
def test_tasks_use_fully_qualified_modules_not_shell(role):
    for f in (ROLES_DIR / role).glob("*/*.yml"):
        if f.parent.name not in ("tasks", "handlers"):
            continue
        for task in yaml.safe_load(f.read_text()) or []:
            modules = [k for k in task if k.startswith("ansible.builtin.")]
            assert len(modules) == 1, f"{f.name}: {task.get('name')}: use ansible.builtin.* modules"
            assert modules[0] not in ("ansible.builtin.shell", "ansible.builtin.raw"), f"{f.name}: {task.get('name')}"


def test_listen_addresses_default_to_the_cluster_network():
    for role, var in (("node_exporter", "node_exporter_listen_address"), ("prometheus", "prometheus_listen_address"),
                      ("pushgateway", "pushgateway_listen_address"), ("dcgm_exporter", "dcgm_exporter_listen_address")):
        assert yaml.safe_load((ROLES_DIR / role / "defaults/main.yml").read_text())[var] == "{{ private_ip }}"
    grafana = yaml.safe_load((ROLES_DIR / "grafana" / "defaults/main.yml").read_text())["grafana_listen_address"]
    assert "private_ip" in grafana and "deployer_monitoring_expose" in grafana


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    """prometheus.yml rendered for a GPU cluster (one GPU worker) and a CPU cluster.

    The rules are copied next to it first, as the role installs them before the config,
    so that promtool resolves rule_files.
    """
    if ANSIBLE_PLAYBOOK is None:
        pytest.skip("ansible-playbook not installed (pip install ansible-core)")
    out = {}
    for name, gpu_hosts in (("gpu", ("demo-worker-2",)), ("cpu", ())):
        tmp = tmp_path_factory.mktemp(name)
        rules = tmp / "rules"
        rules.mkdir()
        for f in (REPO / "monitoring/prometheus/rules").glob("*.yml"):
            shutil.copy(f, rules)
        out[name] = render_prometheus_config(tmp, inventory(tmp, gpu_hosts=gpu_hosts), {"prometheus_rules_dir": str(rules)})
    return out


def test_rendered_scrape_config_covers_the_inventory(rendered):
    cfg = yaml.safe_load(rendered["gpu"].read_text())
    assert cfg["global"]["external_labels"] == {"cluster": "demo"}
    assert cfg["rule_files"] == [str(rendered["gpu"].parent / "rules" / "*.yml")]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"prometheus", "node", "pushgateway", "dcgm"}

    def targets(job):
        return {sc["labels"]["instance"]: sc["targets"] for sc in jobs[job]["static_configs"]}

    assert targets("node") == {"demo-master": ["10.77.0.10:9100"], "demo-worker-1": ["10.77.0.11:9100"],
                               "demo-worker-2": ["10.77.0.12:9100"]}
    assert targets("prometheus") == {"demo-master": ["10.77.0.10:9090"]}
    assert targets("pushgateway") == {"demo-master": ["10.77.0.10:9091"]}
    # Behind the deployer's login; a pushed series is job="deployer_bench" whatever it claims.
    assert jobs["pushgateway"]["honor_labels"] is False
    assert jobs["pushgateway"]["basic_auth"] == {"username": "deployer", "password_file": "/etc/prometheus/pushgateway.password"}
    assert targets("dcgm") == {"demo-worker-2": ["10.77.0.12:9400"]}
    roles = {sc["labels"]["instance"]: sc["labels"]["node_role"] for sc in jobs["node"]["static_configs"]}
    assert roles == {"demo-master": "master", "demo-worker-1": "worker", "demo-worker-2": "worker"}


def test_cpu_cluster_has_no_dcgm_job(rendered):
    cfg = yaml.safe_load(rendered["cpu"].read_text())
    assert "dcgm" not in {j["job_name"] for j in cfg["scrape_configs"]}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")
@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_promtool_check_config_on_rendered_config(rendered, kind):
    r = subprocess.run([PROMTOOL, "check", "config", str(rendered[kind])], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr
    assert "6 rules found" in r.stdout + r.stderr, "the rule files were checked too"


@needs_ansible
@pytest.mark.parametrize("expose", [False, True], ids=["private", "exposed"])
def test_grafana_config_and_generated_password(tmp_path, expose):
    """grafana.ini and the unit drop-in as the role renders them (OpenStack settings); the
    admin password is generated once on the controller, 0600, and reused."""
    inv = inventory(tmp_path)
    out = tmp_path / "out"
    play = [{
        "hosts": "master", "gather_facts": False,
        "vars_files": [str(ROLES_DIR / "grafana" / "defaults" / "main.yml")],
        "tasks": [
            {"ansible.builtin.file": {"path": str(out), "state": "directory", "mode": "0700"}},
            {"ansible.builtin.template": {"src": str(ROLES_DIR / "grafana/templates/grafana.ini.j2"),
                                          "dest": str(out / "grafana.ini"), "mode": "0600"}, "no_log": True},
            {"ansible.builtin.template": {"src": str(ROLES_DIR / "grafana/templates/grafana-server.deployer.conf.j2"),
                                          "dest": str(out / "deployer.conf"), "mode": "0644"}},
        ],
    }]
    ev = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
          "deployer_provider": "openstack", "deployer_grafana_installable": True, "deployer_monitoring_expose": expose}
    secret = tmp_path / "secrets" / "grafana_admin_password"
    passwords = []
    for _ in range(1 if expose else 2):  # a second run must reuse the password, not make a new one
        r = run_playbook(play, inv, tmp_path, "-e", json.dumps(ev))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        passwords.append(secret.read_text().strip())
    password = passwords[0]
    assert set(passwords) == {password} and len(password) == 32 and password.isalnum()
    assert secret.stat().st_mode & 0o777 == 0o600
    assert password not in r.stdout + r.stderr, "the password must not reach Ansible's output"
    ini = (out / "grafana.ini").read_text()
    assert f'admin_password = """{password}"""' in ini
    assert "[auth.anonymous]\nenabled = false" in ini
    assert f"http_addr = {'0.0.0.0' if expose else '10.77.0.10'}" in ini
    # Exposed, it serves HTTPS only (the deployer's certificate); through the tunnel, HTTP.
    tls = "protocol = https\ncert_file = /etc/grafana/deployer-tls.crt\ncert_key = /etc/grafana/deployer-tls.key"
    assert (tls in ini) is expose and ("protocol" in ini) is expose
    assert (out / "deployer.conf").read_text().strip().endswith("Environment=DEPLOYER_PROMETHEUS_URL=http://10.77.0.10:9090")


@needs_ansible
def test_dcgm_exporter_unit_publishes_on_the_private_address_only(tmp_path):
    inv = inventory(tmp_path, gpu_hosts=("demo-worker-2",))
    out = tmp_path / "dcgm-exporter.service"
    play = [{"hosts": "demo-worker-2", "gather_facts": False,
             "vars_files": [str(ROLES_DIR / "dcgm_exporter" / "defaults" / "main.yml")],
             "tasks": [{"ansible.builtin.template": {"src": str(ROLES_DIR / "dcgm_exporter/templates/dcgm-exporter.service.j2"),
                                                     "dest": str(out), "mode": "0644"}}]}]
    r = run_playbook(play, inv, tmp_path, "-e", json.dumps({"ansible_connection": "local",
                                                             "ansible_python_interpreter": sys.executable}))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    unit = out.read_text()
    (execstart,) = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    assert "--publish 10.77.0.12:9400:9400" in execstart and "--gpus all" in execstart
    assert execstart.rstrip().endswith("-ubuntu22.04"), "no collectors flag by default"
    assert "ExecStop=" in unit and "Requires=docker.service" in unit


@pytest.mark.parametrize(("storage", "mountstats"), [("nfs", True), ("host_bind", False)])
def test_node_exporter_reads_nfs_client_counters_where_the_shared_dir_is_nfs(tmp_path, storage, mountstats):
    if ANSIBLE_PLAYBOOK is None:
        pytest.skip("ansible-playbook not installed (pip install ansible-core)")
    inv = inventory(tmp_path, gpu_hosts=())
    out = tmp_path / "prometheus-node-exporter"
    play = [{"hosts": "demo-worker-1", "gather_facts": False,
             "vars_files": [str(ROLES_DIR / "node_exporter" / "defaults" / "main.yml")],
             "tasks": [{"ansible.builtin.template": {
                 "src": str(ROLES_DIR / "node_exporter/templates/prometheus-node-exporter.default.j2"),
                 "dest": str(out), "mode": "0644"}}]}]
    r = run_playbook(play, inv, tmp_path, "-e", json.dumps({"ansible_connection": "local", "deployer_shared_storage": storage,
                                                             "ansible_python_interpreter": sys.executable}))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (args,) = [ln for ln in out.read_text().splitlines() if ln.startswith("ARGS=")]
    assert ("--collector.mountstats" in args.removeprefix("ARGS=").strip("\"").split()) is mountstats, args
