"""JupyterLab on the local cluster's master, used the way a researcher would: `deployer
notebook`, then a real browser (Debian's Chromium) through the tunnel.

The cluster is the shared one (access: via_master): this machine reaches the master only,
as on OpenStack, so the tunnel takes the cloud's path.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.integration import jupyter_browser as browser
from tests.interrupt import sigint_as_from_a_shell

REPO = Path(__file__).resolve().parents[2]
ARTEFACTS = Path(os.environ.get("DEPLOYER_TEST_ARTEFACTS", REPO / "test-artefacts"))


def _read_json(proc: subprocess.Popen, timeout: float = 90) -> dict:
    """The JSON document `deployer notebook --json` prints once the tunnel is open (it
    then keeps running, so stdout is read line by line in a thread, never to its end)."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    text, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text += lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                raise AssertionError(f"deployer notebook exited {proc.returncode}: {proc.stderr.read()[-2000:]}") from None
            continue
        try:
            return json.loads(text)
        except ValueError:
            continue
    raise AssertionError(f"no JSON from deployer notebook within {timeout}s: {text!r}")


@pytest.fixture(scope="module")
def tunnel(local_cluster):
    proc = subprocess.Popen([sys.executable, "-m", "deployer", "notebook", "--json"], cwd=local_cluster.workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_from_a_shell)
    try:
        yield _read_json(proc), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def password(local_cluster) -> str:
    return (local_cluster.state / "secrets" / "jupyter_password").read_text().strip()


@pytest.fixture(scope="module")
def driver():
    reason = browser.why_no_browser()
    if reason:
        pytest.skip(reason)
    d = browser.make_driver()
    yield d
    d.quit()


def test_the_password_is_a_0600_secret_and_never_in_a_log(local_cluster, password):
    path = local_cluster.state / "secrets" / "jupyter_password"
    assert path.stat().st_mode & 0o777 == 0o600 and len(password) >= 32
    leaks = [p for p in local_cluster.state.rglob("*") if p.is_file() and p.parent.name != "secrets"
             and password.encode() in p.read_bytes()]
    assert leaks == [], f"the password is written in {leaks}"
    assert password not in local_cluster.up_log
    # The master keeps only a hash.
    p = local_cluster.deployer("ssh", "--", "sudo", "grep", "-rl", password, "/etc/jupyter", "/etc/systemd/system", "/shared/venv/etc")
    assert p.returncode == 1 and p.stdout == "", p.stdout + p.stderr


def test_jupyterlab_listens_on_the_masters_loopback_only(local_cluster):
    master_ip = local_cluster.cluster_output().master.private_ip
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((master_ip, 8888), timeout=5).close()
    p = local_cluster.deployer("ssh", "--", "ss", "-Hltn", "sport = :8888")
    listeners = {line.split()[3] for line in p.stdout.splitlines() if line.strip()}
    assert listeners == {"127.0.0.1:8888"}, p.stdout + p.stderr


def test_notebook_prints_the_url_and_where_the_password_is(tunnel, local_cluster, password):
    desc, _ = tunnel
    assert desc["tunnel_open"] is True and desc["url"] == f"http://127.0.0.1:{desc['local_port']}/lab"
    assert desc["password_file"] == str(local_cluster.state / "secrets" / "jupyter_password")
    assert "password" not in desc and password not in json.dumps(desc)


def test_a_taken_local_port_moves_to_the_next_free_one(tunnel, local_cluster):
    desc, _ = tunnel
    p = local_cluster.deployer("notebook", "--print", "--json", "--port", str(desc["local_port"]))
    assert p.returncode == 0, p.stderr
    other = json.loads(p.stdout)
    assert other["local_port"] > desc["local_port"] and other["tunnel_open"] is False
    assert other["notes"] == [f"local port {desc['local_port']} is in use; using {other['local_port']}"]
    assert f"-L 127.0.0.1:{other['local_port']}:127.0.0.1:8888" in other["ssh_command"]


def test_a_wrong_password_stays_on_the_login_page(tunnel, driver):
    desc, _ = tunnel
    driver.delete_all_cookies()
    assert browser.log_in(driver, desc["url"], "not-the-password") is False
    assert "/login" in driver.current_url and "Invalid credentials" in browser.login_message(driver)


def test_a_notebook_cell_runs_mpirun_across_every_node(tunnel, driver, password, local_cluster):
    desc, _ = tunnel
    driver.delete_all_cookies()
    assert browser.log_in(driver, desc["url"], password), f"login failed at {driver.current_url}"
    nodes = local_cluster.cluster_output().names
    code = f"!mpirun -np {len(nodes)} --hostfile /shared/hostfile hostname"
    output = browser.run_in_new_notebook(driver, code, until_text=nodes)
    shot = browser.screenshot(driver, ARTEFACTS / "jupyterlab-mpirun.png")
    assert all(n in output for n in nodes), f"cell output {output!r} (screenshot: {shot})"


def test_ctrl_c_closes_the_tunnel(tunnel):
    desc, proc = tunnel
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", desc["local_port"]), timeout=2).close()
