"""deployer.tunnel and deployer.dashboard: the SSH tunnel (against a stand-in ssh that really forwards) and describe()."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import socketserver
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from deployer import credentials, dashboard, tunnel
from deployer.errors import OperationFailed
from deployer.spec import MonitoringSpec

from ..clusters import typed

# Behaves like `ssh -N -L 127.0.0.1:L:H:P ... dest` for the forwarding part: listens on
# each L, relays to H:P, records its argv. FAKE_SSH_MODE=fail exits like a refused login;
# FAKE_SSH_MODE=inuse-once fails the first bind like a port taken in the meantime.
FAKE_SSH = textwrap.dedent('''\
    import json, os, socket, sys, threading
    args = sys.argv[1:]
    log = os.environ["FAKE_SSH_LOG"]
    with open(log, "a") as f:
        f.write(json.dumps(args) + "\\n")
    mode = os.environ.get("FAKE_SSH_MODE", "ok")
    if mode == "fail":
        sys.stderr.write("user@master: Permission denied (publickey).\\n")
        sys.exit(255)
    if mode == "inuse-once" and sum(1 for _ in open(log)) == 1:
        sys.stderr.write("bind [127.0.0.1]:1: Address already in use\\n")
        sys.stderr.write("channel_setup_fwd_listener_tcpip: cannot listen to port: 1\\n")
        sys.exit(255)
    forwards = [args[i + 1] for i, a in enumerate(args) if a == "-L"]
    def relay(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try: s.shutdown(socket.SHUT_RDWR)
                except OSError: pass
    def serve(lsock, host, port):
        while True:
            c, _ = lsock.accept()
            try:
                r = socket.create_connection((host, port))
            except OSError:
                c.close(); continue
            threading.Thread(target=relay, args=(c, r), daemon=True).start()
            threading.Thread(target=relay, args=(r, c), daemon=True).start()
    for spec in forwards:
        bind, lport, host, port = spec.split(":")
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((bind, int(lport))); s.listen()
        threading.Thread(target=serve, args=(s, host, int(port)), daemon=True).start()
    threading.Event().wait()
''')


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    script = tmp_path / "ssh"
    script.write_text(f"#!{sys.executable}\n" + FAKE_SSH)
    script.chmod(0o755)
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    base = [str(script), "-i", "/state/id_ed25519", "-o", "UserKnownHostsFile=/state/known_hosts",
            "-o", "StrictHostKeyChecking=yes", "deployer@10.77.0.10"]

    def calls() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return base, calls


@pytest.fixture
def echo_server():
    class Echo(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(b"pong:" + self.request.recv(100))

    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def ping(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"ping")
        return s.recv(100)


def test_tunnel_command_puts_options_before_the_destination():
    cmd = tunnel.tunnel_command(["ssh", "-i", "k", "user@m"], [(5000, "10.0.0.5", 3000), (5001, "10.0.0.5", 9090)])
    assert cmd[0] == "ssh" and cmd[-1] == "user@m"
    assert cmd[1:3] == ["-i", "k"], "the caller's options come first, so they win"
    assert "-N" in cmd and "ExitOnForwardFailure=yes" in cmd and "BatchMode=yes" in cmd
    assert cmd.count("-L") == 2 and "127.0.0.1:5000:10.0.0.5:3000" in cmd


def test_open_tunnel_forwards_and_stops_ssh(fake_ssh, echo_server):
    base, calls = fake_ssh
    with tunnel.open_tunnel(base, "127.0.0.1", echo_server) as port:
        assert port != echo_server
        assert ping(port) == b"pong:ping"
    (argv,) = calls()
    assert argv[-1] == "deployer@10.77.0.10"
    assert f"127.0.0.1:{port}:127.0.0.1:{echo_server}" in argv
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_open_tunnels_one_ssh_for_all_services(fake_ssh, echo_server):
    base, calls = fake_ssh
    with tunnel.open_tunnels(base, {"a": ("127.0.0.1", echo_server), "b": ("127.0.0.1", echo_server)}) as ports:
        assert set(ports) == {"a", "b"} and ports["a"] != ports["b"]
        assert ping(ports["a"]) == ping(ports["b"]) == b"pong:ping"
    assert len(calls()) == 1


def test_a_preferred_local_port_is_used_or_the_next_free_one(fake_ssh, echo_server):
    base, _ = fake_ssh
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with tunnel.open_tunnels(base, {"nb": ("127.0.0.1", echo_server)}, preferred={"nb": taken}) as ports:
            assert ports["nb"] > taken and ping(ports["nb"]) == b"pong:ping"
    with tunnel.open_tunnels(base, {"nb": ("127.0.0.1", echo_server)}, preferred={"nb": taken}) as ports:
        assert ports["nb"] == taken, "once free, the preferred port itself"


def test_refused_login_is_one_line_with_sshs_reason(fake_ssh, monkeypatch):
    base, _ = fake_ssh
    monkeypatch.setenv("FAKE_SSH_MODE", "fail")
    with pytest.raises(OperationFailed, match="Permission denied"):
        with tunnel.open_tunnel(base, "127.0.0.1", 1, timeout=5):
            pass


def test_a_port_taken_meanwhile_is_retried(fake_ssh, echo_server, monkeypatch):
    base, calls = fake_ssh
    monkeypatch.setenv("FAKE_SSH_MODE", "inuse-once")
    with tunnel.open_tunnel(base, "127.0.0.1", echo_server) as port:
        assert ping(port) == b"pong:ping"
    assert len(calls()) == 2


def test_describe_openstack_with_tunnels(tmp_path):
    d = dashboard.describe("192.168.77.10", grafana=True, secrets_dir=tmp_path,
                           local_ports={"grafana": 41000, "prometheus": 41001, "pushgateway": 41002})
    urls = {e["name"]: e["url"] for e in d["services"]}
    assert urls == {"grafana": "http://127.0.0.1:41000/", "prometheus": "http://127.0.0.1:41001/",
                    "pushgateway": "http://127.0.0.1:41002/"}
    assert d["grafana_login"] == {"user": "admin", "password_file": str(tmp_path / "grafana_admin_password")}
    assert any("password in" in line for line in dashboard.render(d))


def test_describe_print_without_tunnel_gives_a_command(tmp_path):
    d = dashboard.describe("192.168.77.10", grafana=True, secrets_dir=tmp_path,
                           ssh_base_cmd=["ssh", "-i", "k", "ubuntu@203.0.113.7"])
    assert all(e["url"] is None for e in d["services"])
    assert "-L 127.0.0.1:3000:192.168.77.10:3000" in d["ssh_command"]
    assert d["ssh_command"].endswith("ubuntu@203.0.113.7")


def test_describe_local_is_direct_and_says_why_no_grafana(tmp_path):
    local = typed(
        {"name": "d", "grafana_installable": False, "nodes": [{"name": "d-master", "private_ip": "10.77.0.10", "public_ip": "10.77.0.10"}]}
    )
    seen = dashboard.view(local, grafana_wanted=True)
    assert seen == {"grafana": False, "wanted": True, "direct": True, "public_host": None}
    d = dashboard.describe("10.77.0.10", grafana=seen["grafana"], wanted=seen["wanted"], direct=seen["direct"], secrets_dir=tmp_path)
    assert [e["name"] for e in d["services"]] == ["prometheus", "pushgateway"]
    assert d["services"][0]["url"] == "http://10.77.0.10:9090/"
    assert d["grafana_login"] is None and "OpenStack only" in d["notes"][0]
    json.dumps(d)


def test_view_of_a_cloud_cluster():
    cloud = typed({"name": "d", "grafana_installable": True,
                   "nodes": [{"name": "d-master", "private_ip": "192.168.77.10", "public_ip": "203.0.113.7"}]})
    assert dashboard.view(cloud, grafana_wanted=True) == {"grafana": True, "wanted": True, "direct": False, "public_host": None}
    assert dashboard.view(cloud, grafana_wanted=False)["grafana"] is False


def test_an_exposed_cloud_cluster_shows_its_public_address(tmp_path):
    cloud = typed({"name": "d", "grafana_installable": True,
                   "nodes": [{"name": "d-master", "private_ip": "192.168.77.10", "public_ip": "203.0.113.7"}]})
    seen = dashboard.view(cloud, grafana_wanted=True, exposed=True)
    assert seen["public_host"] == "203.0.113.7"
    # What `up` made for it: Grafana's certificate (it serves HTTPS only, then) and the Pushgateway's login.
    monitoring = MonitoringSpec.model_validate({"expose": True, "allowed_cidrs": ["198.51.100.0/24"]})
    credentials.prepare(tmp_path, monitoring, cloud)
    common = dict(grafana=True, secrets_dir=tmp_path, public_host=seen["public_host"])
    printed = dashboard.describe("192.168.77.10", **common)  # --print: no tunnel, the public URL
    by_name = {e["name"]: e for e in printed["services"]}
    assert by_name["grafana"]["url"] == "https://203.0.113.7:3000/"
    assert by_name["prometheus"]["url"] is None and by_name["prometheus"]["public_url"] is None, "never exposed"
    assert by_name["pushgateway"]["public_url"] is None
    assert printed["grafana_tls_sha256"] == credentials.grafana_fingerprint(tmp_path)
    assert any(printed["grafana_tls_sha256"] in n for n in printed["notes"])
    assert printed["pushgateway_login"] == {"user": "deployer", "password_file": str(tmp_path / "pushgateway_password")}
    tunnelled = dashboard.describe("192.168.77.10", local_ports={"grafana": 41000, "prometheus": 41001, "pushgateway": 41002}, **common)
    assert [e["url"] for e in tunnelled["services"]] == [
        "https://127.0.0.1:41000/", "http://127.0.0.1:41001/", "http://127.0.0.1:41002/"]
    assert "(exposed: https://203.0.113.7:3000/)" in dashboard.render(tunnelled)[0]
    # Not exposed, or a local cluster (public == private): no public address.
    assert dashboard.view(cloud, grafana_wanted=True)["public_host"] is None
    local = typed({"name": "d", "nodes": [{"name": "d-master", "private_ip": "10.77.0.10", "public_ip": "10.77.0.10"}]})
    assert dashboard.view(local, grafana_wanted=True, exposed=True)["public_host"] is None


# ------------------------------------------------------------------ against a real sshd

SSHD = "/usr/sbin/sshd"
SSH = shutil.which("ssh")
SSH_KEYGEN = shutil.which("ssh-keygen")


@pytest.fixture
def real_sshd(tmp_path):
    """sshd on 127.0.0.1 (free port), key-only login for the current user, strict host keys."""
    if not (os.path.exists(SSHD) and SSH and SSH_KEYGEN):
        pytest.skip("OpenSSH server/client not installed (apt-get install openssh-server openssh-client)")
    for name in ("hostkey", "id"):
        subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    (tmp_path / "authorized_keys").write_text((tmp_path / "id.pub").read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    user = pwd.getpwuid(os.getuid()).pw_name
    config = tmp_path / "sshd_config"
    config.write_text(textwrap.dedent(f"""\
        ListenAddress 127.0.0.1
        Port {port}
        HostKey {tmp_path / 'hostkey'}
        AuthorizedKeysFile {tmp_path / 'authorized_keys'}
        PidFile {tmp_path / 'sshd.pid'}
        StrictModes no
        UsePAM no
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PermitRootLogin prohibit-password
        AllowTcpForwarding local
        AllowUsers {user}
        LogLevel ERROR
    """))
    if os.getuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not tunnel.accepts(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.skip(f"sshd would not start here: {proc.stderr.read().decode()[-300:]}")
        time.sleep(0.1)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {(tmp_path / 'hostkey.pub').read_text()}")
    yield [SSH, "-p", str(port), "-i", str(tmp_path / "id"), "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
           "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", f"{user}@127.0.0.1"]
    proc.terminate()
    proc.wait(timeout=10)


def test_tunnel_through_real_ssh(real_sshd, echo_server):
    with tunnel.open_tunnel(real_sshd, "127.0.0.1", echo_server) as port:
        assert ping(port) == b"pong:ping"
    assert not tunnel.accepts(port)


def test_real_ssh_with_an_unknown_host_key_fails_cleanly(real_sshd, tmp_path):
    base = [a if not a.startswith("UserKnownHostsFile=") else f"UserKnownHostsFile={tmp_path / 'empty'}" for a in real_sshd]
    with pytest.raises(OperationFailed, match="(?i)host key"):
        with tunnel.open_tunnel(base, "127.0.0.1", 1, timeout=10):
            pass
