"""The slurm role as Ansible renders it: slurm.conf, gres.conf and cgroup.conf for a
cluster with a 2-GPU node, from recorded node facts; layout, argument specs and
ansible-lint's production profile.

The role runs for real on a local cluster in tests/integration/test_slurm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.role_checks import assert_layout_and_defaults
from tests.unit.test_monitoring_ansible import ANSIBLE_PLAYBOOK, REPO, ROLES_DIR, inventory, run_playbook
from tests.unit.test_slurm import LXC, VM

pytestmark = pytest.mark.slow  # Ansible renders the role (a playbook run)

ROLE = ROLES_DIR / "slurm"
UNSPECIFIED = {"slurm_munge_key"}  # its check would print it


def test_role_layout_and_every_default_specified():
    spec = assert_layout_and_defaults(ROLE, "slurm_", UNSPECIFIED, described=True)
    assert not UNSPECIFIED & set(spec)


def test_the_munge_key_is_handled_without_logging_it():
    for path in (ROLE / "tasks").glob("*.yml"):
        for task in yaml.safe_load(path.read_text()):
            if "slurm_munge_key" in json.dumps(task):
                assert task.get("no_log") is True, task["name"]


def test_site_yml_runs_slurm_after_jupyterlab():
    plays = yaml.safe_load((REPO / "ansible" / "site.yml").read_text())
    def roles(play):  # listed, or included where they apply
        listed = [r if isinstance(r, str) else r["role"] for r in play.get("roles", [])]
        return listed + [t["ansible.builtin.include_role"]["name"] for t in play.get("tasks", []) if "ansible.builtin.include_role" in t]

    roles = [r for p in plays for r in roles(p)]
    # health between them: slurm.conf names its program, which slurmd runs as it starts
    assert roles.index("slurm") == roles.index("health") + 1 == roles.index("jupyterlab") + 2


def test_ansible_lint_production_profile():
    lint = REPO / ".venv" / "bin" / "ansible-lint"
    exe = str(lint) if lint.exists() else str(__import__("shutil").which("ansible-lint") or "")
    if not exe:
        pytest.skip("ansible-lint is not installed")
    r = subprocess.run([exe, "--offline", "--profile", "production", "--nocolor", "roles/slurm"],
                       cwd=REPO / "ansible", capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, str]:
    """The three files for demo-master (CPU, the recorded local node) and demo-worker-1 (2 GPUs)."""
    if ANSIBLE_PLAYBOOK is None:
        pytest.skip("ansible-playbook not installed (pip install ansible-core)")
    tmp = tmp_path_factory.mktemp("slurm")
    inv_path = inventory(tmp, gpu_hosts=("demo-worker-1",), nodes=2)
    inv = yaml.safe_load(inv_path.read_text())
    inv["all"]["hosts"]["demo-worker-1"]["gpus"] = 2
    inv["all"]["vars"]["deployer_scheduler"] = "slurm"
    inv_path.write_text(yaml.safe_dump(inv))
    out = tmp / "out"
    out.mkdir()
    play = [{
        "hosts": "master", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults/main.yml")],
        "tasks": [{"ansible.builtin.template": {"src": str(ROLE / "templates" / f"{f}.j2"), "dest": str(out / f), "mode": "0644"}}
                  for f in ("slurm.conf", "gres.conf", "cgroup.conf")],
    }]
    ev = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
          "slurm_facts": {"demo-master": VM | {"gpu_devices": []}, "demo-worker-1": VM}}
    r = run_playbook(play, inv_path, tmp, "-e", json.dumps(ev))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {f.name: f.read_text() for f in out.iterdir()}


def test_slurm_conf_for_a_2_gpu_node(rendered):
    conf = rendered["slurm.conf"]
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert [n.split()[0] for n in nodes] == ["NodeName=demo-master", "NodeName=demo-worker-1"]
    assert nodes[1].endswith(" Gres=gpu:2") and "Gres" not in nodes[0]
    assert "NodeAddr=10.77.0.11 " in nodes[1]
    assert "GresTypes=gpu" in conf.splitlines()
    assert "SlurmctldHost=demo-master(10.77.0.10)" in conf
    assert "MpiDefault=pmix" in conf and "ReturnToService=2" in conf
    assert "PartitionName=batch Nodes=ALL Default=YES" in conf
    # deployer's health program as slurmd's, at the spec's interval (5 min by default), on
    # drained nodes too (so it can resume the ones it drained)
    assert "HealthCheckProgram=/usr/local/sbin/deployer-health" in conf.splitlines()
    assert "HealthCheckInterval=300" in conf.splitlines() and "HealthCheckNodeState=ANY" in conf.splitlines()
    # A cloud VM with cgroup v2 and Slurm 22.05: cgroup tracking and confinement.
    assert "ProctrackType=proctrack/cgroup" in conf and "TaskPlugin=task/cgroup,task/affinity" in conf
    assert "TopologyPlugin" not in conf, "no placement known: no topology"


def test_gres_conf_names_the_gpu_nodes_device_files(rendered):
    lines = [line for line in rendered["gres.conf"].splitlines() if line and not line.startswith("#")]
    assert lines == ["NodeName=demo-worker-1 Name=gpu File=/dev/nvidia[0-1]"]


def test_cgroup_conf_confines_devices(rendered):
    assert "ConstrainDevices=yes" in rendered["cgroup.conf"].splitlines()


def test_the_local_node_facts_render_a_cpu_only_conf(tmp_path):
    if ANSIBLE_PLAYBOOK is None:
        pytest.skip("ansible-playbook not installed (pip install ansible-core)")
    inv_path = inventory(tmp_path, gpu_hosts=(), nodes=2)
    play = [{"hosts": "master", "gather_facts": False, "vars_files": [str(ROLE / "defaults/main.yml")],
             "tasks": [{"ansible.builtin.template": {
                 "src": str(ROLE / "templates/slurm.conf.j2"), "dest": str(tmp_path / "slurm.conf"), "mode": "0644",
             }}]}]
    ev = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
          "slurm_facts": {"demo-master": LXC, "demo-worker-1": LXC},
          # a local cluster is one host: one switch under the top one (slurm.topology_conf)
          "deployer_slurm_topology": "SwitchName=host1 Nodes=demo-master,demo-worker-1\nSwitchName=cloud Switches=host1\n",
          "deployer_health_enabled": False}  # `health: false`: slurmd runs no program
    r = run_playbook(play, inv_path, tmp_path, "-e", json.dumps(ev))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    conf = (tmp_path / "slurm.conf").read_text()
    assert "GresTypes" not in conf and "HealthCheck" not in conf
    assert "TopologyPlugin=topology/tree" in conf.splitlines()
    from deployer import slurm

    assert "ProctrackType=proctrack/cgroup" in conf and "TaskPlugin=task/cgroup\n" in conf
    assert f"CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory={slurm.memory_mb(LXC)}" in conf
