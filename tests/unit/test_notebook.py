"""deployer.notebook and `deployer notebook`: port choice, what is shown (and what never
is), the readiness check through the tunnel, and the CLI's refusals."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deployer import notebook
from deployer.errors import OperationFailed

DEPLOYER = [sys.executable, "-m", "deployer"]


@pytest.fixture
def held_port():
    """A port on 127.0.0.1 that something listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_a_taken_local_port_moves_to_the_next_free_one(held_port):
    chosen = notebook.choose_port(held_port)
    assert chosen > held_port
    with socket.socket() as s:
        s.bind(("127.0.0.1", chosen))  # really free


def test_a_free_local_port_is_kept():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert notebook.choose_port(port) == port


def test_describe_names_the_password_file_not_the_password(tmp_path):
    (tmp_path / notebook.PASSWORD_FILE).write_text("s3cret\n")
    d = notebook.describe(local_port=8889, requested_port=8888, secrets_dir=tmp_path,
                          ssh_base_cmd=["ssh", "-F", "cfg", "deployer@lab-master"])
    assert d["url"] == "http://127.0.0.1:8889/lab"
    assert d["password_file"] == str(tmp_path / notebook.PASSWORD_FILE)
    assert "password" not in d and "s3cret" not in json.dumps(d) and "s3cret" not in "\n".join(notebook.render(d))
    assert d["notes"] == ["local port 8888 is in use; using 8889"]
    # The tunnel by hand: this machine's 127.0.0.1:8889 to the master's own loopback.
    assert "-L 127.0.0.1:8889:127.0.0.1:8888" in d["ssh_command"] and d["ssh_command"].endswith("deployer@lab-master")
    assert any(line.startswith("Tunnel by hand:") for line in notebook.render(d))


def test_the_password_is_shown_only_when_asked(tmp_path):
    (tmp_path / notebook.PASSWORD_FILE).write_text("s3cret\n")
    d = notebook.describe(local_port=8888, requested_port=8888, secrets_dir=tmp_path, tunnel_open=True,
                          password=notebook.read_password(tmp_path))
    assert d["password"] == "s3cret" and d["notes"] == []
    lines = notebook.render(d)
    assert "Password     s3cret" in lines and not any(line.startswith("Tunnel by hand") for line in lines)


def test_a_missing_password_file_says_to_run_up(tmp_path):
    with pytest.raises(OperationFailed, match="deployer up"):
        notebook.read_password(tmp_path)


class _Login(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(self.status if self.path.startswith("/login") else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def _serve(status: int):
    handler = type("H", (_Login,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_ready_when_the_login_page_answers():
    server = _serve(200)
    try:
        notebook.wait_ready(server.server_address[1], timeout=5)
    finally:
        server.shutdown()


def test_not_ready_names_the_service_to_look_at():
    server = _serve(502)
    try:
        with pytest.raises(OperationFailed, match=r"HTTP 502.*systemctl status jupyterlab"):
            notebook.wait_ready(server.server_address[1], timeout=1.5)
    finally:
        server.shutdown()


def _fake_cluster(tmp_path, *, jupyter: bool):
    st = tmp_path / ".deployer" / "lab"
    st.mkdir(parents=True)
    (st / "spec.json").write_text(json.dumps({"version": 1, "spec": {"name": "lab", "nodes": 1, "jupyter": jupyter}}))
    (st / "cluster.json").write_text(json.dumps({
        "version": 1, "name": "lab", "provider": "local", "ssh_user": "deployer", "shared_dir": "/shared",
        "nodes": [{"name": "lab-master", "role": "master", "private_ip": "10.77.0.10", "public_ip": "10.77.0.10", "gpus": 0}],
    }))
    return st


@pytest.mark.parametrize(
    "args, jupyter, fragment",
    [
        (["notebook", "--name", "lab"], False, "jupyter: false"),
        (["notebook", "--name", "ghost"], True, "is not up"),
        (["notebook", "--name", "lab", "--port", "0"], True, "--port"),
        (["notebook", "--name", "lab", "--port", "http"], True, "--port"),
    ],
)
def test_notebook_refusals_are_one_line_exit_2(args, jupyter, fragment, tmp_path):
    st = _fake_cluster(tmp_path, jupyter=jupyter)
    before = sorted(p.name for p in st.iterdir())
    p = subprocess.run([*DEPLOYER, *args], cwd=tmp_path, text=True, capture_output=True, timeout=60)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], p.stderr
    assert sorted(p.name for p in st.iterdir()) == before
