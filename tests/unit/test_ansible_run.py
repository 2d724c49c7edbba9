"""deployer.tools.ansible.run_playbook through ansible-runner for real, on this machine
(connection: local), with a two-task play: what it counts, what it logs, and a failure
as one line naming the host and the task. The cluster's own site.yml runs in the
integration tier."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

import deployer.tools.ansible
from deployer.errors import OperationFailed
from deployer.tools.ansible import run_playbook


def _play(tmp_path, tasks):
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"here": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    run_dir = tmp_path / "state" / "runs" / "1-up"
    run_dir.mkdir(parents=True)
    return tmp_path / "hosts.yml", run_dir


def test_counts_ok_and_changed_per_host_and_keeps_every_event(tmp_path):
    inv, run_dir = _play(tmp_path, [
        {"name": "Say hello", "ansible.builtin.debug": {"msg": "hello"}},
        {"name": "Change something", "ansible.builtin.command": "true", "changed_when": True},
    ])
    result = run_playbook(inv, run_dir, playbook=str(tmp_path / "play.yml"))
    assert result.ok == {"here": 2} and result.total_changed == 1 and result.failures == []
    events = [json.loads(line) for line in (run_dir / "ansible-events.jsonl").read_text().splitlines()]
    assert {"playbook_on_start", "runner_on_ok", "playbook_on_stats"} <= {e["event"] for e in events}


def test_a_failed_task_is_one_line_naming_host_and_task(tmp_path):
    inv, run_dir = _play(tmp_path, [{"name": "Break on purpose", "ansible.builtin.fail": {"msg": "no  such\\nthing"}}])
    with pytest.raises(OperationFailed, match=r"configuration failed: here: Break on purpose: no such\\nthing"):
        run_playbook(inv, run_dir, playbook=str(tmp_path / "play.yml"))


def test_set_stats_reach_the_deployer(tmp_path):
    # site.yml's last play hands each node's byte counter over this way.
    inv, run_dir = _play(tmp_path, [
        {"name": "Hand over", "ansible.builtin.set_stats": {
            "data": {"bytes_from_outside": "{{ {inventory_hostname: 'counter text'} }}"}, "per_host": False, "aggregate": True}},
    ])
    result = run_playbook(inv, run_dir, playbook=str(tmp_path / "play.yml"))
    assert result.stats == {"bytes_from_outside": {"here": "counter text"}}


def test_skip_tags_leave_the_tagged_tasks_out(tmp_path):
    # How tests/vm/test_bake.py runs ansible/bake.yml without its training environment.
    inv, run_dir = _play(tmp_path, [
        {"name": "Kept", "ansible.builtin.command": "true", "changed_when": True},
        {"name": "Left out", "ansible.builtin.fail": {"msg": "ran"}, "tags": ["runtime"]},
    ])
    result = run_playbook(inv, run_dir, playbook=str(tmp_path / "play.yml"), skip_tags=["runtime"])
    assert result.total_changed == 1 and result.failures == []


def test_host_key_checking_stays_on_under_ansible_runner(tmp_path):
    # ansible-runner turns it off unless told; then Mitogen's ssh ignores known_hosts
    # (tests/integration/test_boot.py proves the refusal on a live cluster).
    inv, run_dir = _play(tmp_path, [
        {"name": "Read the setting", "ansible.builtin.set_stats": {
            "data": {"checking": "{{ lookup('ansible.builtin.config', 'HOST_KEY_CHECKING') }}"}, "per_host": False}},
    ])
    assert run_playbook(inv, run_dir, playbook=str(tmp_path / "play.yml")).stats == {"checking": True}


def _filter_imports(tmp_path, monkeypatch, warm: str) -> set[str]:
    """Process ids that imported the filter plugins while a 3-task play templated a filter
    in each task (a probe plugin beside the cluster's own records its importer)."""

    adir = tmp_path / "ansible"
    shutil.copytree(deployer.tools.ansible.ansible_dir(), adir)
    record = tmp_path / "imports"
    (adir / "filter_plugins" / "zz_probe.py").write_text(
        "import os\n"
        f"with open({str(record)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n\n\n"
        "class FilterModule:\n    def filters(self):\n        return {}\n")
    monkeypatch.setattr(deployer.tools.ansible, "ansible_dir", lambda: adir)
    monkeypatch.setenv("DEPLOYER_WARM_JINJA", warm)
    inv, run_dir = _play(tmp_path, [{"name": f"Filter {i}", "ansible.builtin.debug": {"msg": "{{ 'yes' | bool }}"}} for i in range(3)])
    run_playbook(inv, run_dir, playbook=str(tmp_path / "play.yml"))
    return set(record.read_text().split())


def test_filter_plugins_load_once_in_the_controller_not_in_every_worker(tmp_path, monkeypatch):
    # Ansible forks a worker per task per node; loaded in the controller first, they are inherited.
    assert len(_filter_imports(tmp_path / "warm", monkeypatch, "1")) == 1
    # Switched off, every worker that templates a filter loads them again: what the callback saves.
    assert len(_filter_imports(tmp_path / "cold", monkeypatch, "0")) >= 3


def test_no_secret_from_the_environment_reaches_the_runs_logs(tmp_path, monkeypatch):
    # ansible-runner writes the play's environment to artifacts/<id>/command; an openrc
    # file's OS_PASSWORD or a token in the controller's environment must not go with it.
    marker = f"secret-{tmp_path.name}-do-not-write"
    monkeypatch.setenv("OS_PASSWORD", marker)
    monkeypatch.setenv("GITHUB_TOKEN", marker)
    inv, run_dir = _play(tmp_path, [{"name": "Run", "ansible.builtin.command": "true"}])
    run_playbook(inv, run_dir, playbook=str(tmp_path / "play.yml"))
    written = [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in written)  # the file that used to carry it
    assert [p for p in written if marker.encode() in p.read_bytes()] == []
    assert os.environ["OS_PASSWORD"] == marker  # the deployer's own environment is given back


INTERRUPTED_PLAY = """
import signal, sys
from pathlib import Path
from deployer.tools.ansible import run_playbook
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    run_playbook(Path(sys.argv[1]), Path(sys.argv[2]), playbook=sys.argv[3])
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""


def test_ctrl_c_stops_ansible_playbook_and_what_it_started(tmp_path):
    # ansible-runner runs ansible-playbook under a pty of its own (a session of its own):
    # a Ctrl-C raised inside the runner left it, and the task, running after the deployer
    # had exited and released the cluster's lock.
    marker = f"deployer-task-{tmp_path.name}"
    inv, run_dir = _play(tmp_path, [{"name": "Work a long time", "ansible.builtin.shell": f"exec -a {marker} sleep 120",
                                     "args": {"executable": "/bin/bash"}}])
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_PLAY, str(inv), str(run_dir), str(tmp_path / "play.yml")])
    deadline = time.monotonic() + 60
    while not _running(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running(marker), "the task never started"
    proc.send_signal(signal.SIGINT)
    began = time.monotonic()
    assert proc.wait(timeout=30) == 130
    assert time.monotonic() - began < 10
    time.sleep(0.5)
    left = _running(marker) + _running(str(tmp_path / "play.yml"))
    assert left == [], subprocess.run(
        ["ps", "-o", "pid,ppid,pgid,sid,stat,cmd", "-p", ",".join(left)], capture_output=True, text=True
    ).stdout


def _running(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
