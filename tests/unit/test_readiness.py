"""Wait for boot: how one probe's result is read, and how the wait ends.

The ssh texts below were recorded from OpenSSH 9.2 (Debian 12) against a real sshd; the
integration tests run the same path on a live cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest

from deployer.cluster import Cluster, Node
from deployer.errors import OperationFailed
from deployer.pipeline import readiness
from deployer.pipeline.readiness import KeyRefused, NotYet, Probe, classify

MASTER = Node("lab-master", "master", "10.77.0.10", "203.0.113.5")
WORKER = Node("lab-worker-1", "worker", "10.77.0.11", None)

CHANGED = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
The fingerprint for the ED25519 key sent by the remote host is
SHA256:z9kSTmfvLXPab3IumaXBnDRcnMXDd0rM+rkhQ/57/2M.
Offending ED25519 key in /s/ssh/known_hosts:3
Host key for {addr} has changed and you have requested strict checking.
Host key verification failed.
"""
UNKNOWN = "No ED25519 host key is known for {addr} and you have requested strict checking.\nHost key verification failed.\n"
DONE = "status: done\nboot_status_code: enabled-by-generator\ndetail:\nDataSourceNoCloud [seed=/var/lib/cloud/seed/nocloud][dsmode=net]\n"


@pytest.mark.parametrize("text", [CHANGED, UNKNOWN])
def test_a_nodes_own_foreign_key_is_refused_for_good(text):
    with pytest.raises(KeyRefused, match=r"lab-worker-1 serves an SSH host key .*deployer up --replace lab-worker-1"):
        classify(WORKER, Probe(255, "", text.format(addr="10.77.0.11")))
    with pytest.raises(KeyRefused, match="lab-master"):
        classify(MASTER, Probe(255, "", text.format(addr="203.0.113.5")))


def test_the_jump_hosts_key_is_the_masters_problem_not_the_workers():
    # Through the master, the jump's refusal shows in the worker's stderr too; the
    # master's own probe reports it, the worker only waits.
    err = CHANGED.format(addr="203.0.113.5") + "kex_exchange_identification: Connection closed by remote host\n"
    with pytest.raises(NotYet):
        classify(WORKER, Probe(255, "", err))


@pytest.mark.parametrize(
    "err",
    [
        "ssh: connect to host 10.77.0.11 port 22: Connection refused\n",
        "ssh: connect to host 10.77.0.11 port 22: Connection timed out\n",
        "deployer@10.77.0.11: Permission denied (publickey).\n",  # cloud-init has not made the user yet
        "kex_exchange_identification: Connection closed by remote host\nConnection closed by UNKNOWN port 65535\n",
    ],
)
def test_a_booting_node_is_waited_for(err):
    with pytest.raises(NotYet):
        classify(WORKER, Probe(255, "", err))


def test_cloud_init_states():
    assert classify(WORKER, Probe(0, DONE, "")) == "ready"
    assert classify(WORKER, Probe(127, "", "bash: cloud-init: command not found")) == "ready"
    with pytest.raises(NotYet, match="running"):
        classify(WORKER, Probe(0, "status: running\n", ""))
    failed = "status: error\nboot_status_code: enabled-by-generator\ndetail:\n('ssh', KeyError('x'))\n"
    with pytest.raises(OperationFailed, match=r"lab-worker-1: cloud-init finished with status 'error' \(\('ssh', KeyError"):
        classify(WORKER, Probe(1, failed, ""))


def _cluster():
    return Cluster("lab", "openstack", "ubuntu", "/shared", (MASTER, WORKER), access="via_master")


def test_wait_returns_once_every_node_is_ready(monkeypatch):
    answers = {
        "lab-master": [Probe(0, DONE, "")],
        "lab-worker-1": [Probe(255, "", "Connection refused"), Probe(0, "status: running\n", ""), Probe(0, DONE, "")],
    }
    monkeypatch.setattr(readiness, "probe", lambda state, cluster, node, timeout, running=None: answers[node.name].pop(0))
    ready = readiness.wait_for_boot(None, _cluster(), timeout_s=30, hint=lambda n: f"logs of {n}")
    assert set(ready) == {"lab-master", "lab-worker-1"}
    assert answers == {"lab-master": [], "lab-worker-1": []}


def test_a_node_that_never_comes_up_is_named_with_where_to_look(monkeypatch):
    def probe(state, cluster, node, timeout, running=None):
        return Probe(0, DONE, "") if node is MASTER else Probe(255, "", "ssh: connect to host 10.77.0.11 port 22: No route to host")

    monkeypatch.setattr(readiness, "probe", probe)
    with pytest.raises(OperationFailed) as e:
        readiness.wait_for_boot(None, _cluster(), timeout_s=1.5, hint=lambda n: f"`console log {n}`")
    assert "lab-worker-1 did not come up within 2s (last: ssh: connect to host 10.77.0.11 port 22: No route to host)" in str(e.value)
    assert "`console log lab-worker-1`" in str(e.value)


def test_a_refused_key_ends_the_wait_at_once(monkeypatch):
    calls = []

    def probe(state, cluster, node, timeout, running=None):
        calls.append(node.name)
        if node is MASTER:
            return Probe(255, "", CHANGED.format(addr="203.0.113.5"))
        return Probe(255, "", "Connection refused")

    monkeypatch.setattr(readiness, "probe", probe)
    with pytest.raises(KeyRefused, match="lab-master"):
        readiness.wait_for_boot(None, _cluster(), timeout_s=60, hint=str)
    assert calls.count("lab-master") == 1  # never retried


def test_ctrl_c_while_waiting_stops_every_probe_at_once(monkeypatch, tmp_path):
    # A real `ssh … cloud-init status --wait` blocks until cloud-init is done; a stand-in
    # that blocks the same way, and a real interrupt of the main thread while it waits.
    marker = f"deployer-probe-{tmp_path.name}"
    fake_ssh = tmp_path / "ssh"
    fake_ssh.write_text(f"#!/bin/bash\nexec -a {marker} sleep 120\n")
    fake_ssh.chmod(0o755)
    monkeypatch.setattr(readiness, "ssh_argv", lambda state, node: [str(fake_ssh), node.name])
    # Python's own handler, as in a terminal: a test run started as a shell's background
    # job inherits SIGINT ignored, and the interrupt below would never arrive.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # what a Ctrl-C sends
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        readiness.wait_for_boot(None, _cluster(), timeout_s=600, hint=str)
    # Before the fix the pool waited for every probe: up to the whole 600 s deadline.
    assert time.monotonic() - began < 30
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == []
