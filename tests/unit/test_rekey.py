"""The bootstrap host key opens the first connection only (deployer/pipeline/rekey.py).

The key records are plain files; the rotation runs against a real sshd on 127.0.0.1 that
serves the bootstrap key as a node's does after cloud-init (root: it swaps the key file the
sshd reads and tells the sshd by its pid file, as `systemctl reload ssh` does on a node).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import textwrap
import time

import pytest

from deployer.errors import OperationFailed
from deployer.pipeline import boot, rekey
from deployer.spec import ClusterSpec
from deployer.state import ClusterState

from ..clusters import typed

SSHD = "/usr/sbin/sshd"
ONE = {"name": "c", "nodes": [{"name": "c-master", "private_ip": "127.0.0.1", "id": "server-1"}]}


@pytest.fixture
def state(tmp_path):
    st = ClusterState(tmp_path / "state", "c")
    st.create()
    boot.write_user_data(ClusterSpec(name="c", nodes=1), st)
    return st


def _lines(state) -> list[str]:
    return [ln for ln in state.known_hosts.read_text().splitlines() if not ln.startswith("#")]


def test_before_rotation_the_bootstrap_key_is_pinned(state):
    cluster = typed(ONE)
    boot.write_access(state, cluster)
    assert _lines(state) == [f"c-master,127.0.0.1 {boot.host_key(state, 'c-master').public}"]
    assert boot.needs_rotation(state, cluster.master)


def test_half_rotated_both_keys_are_accepted_and_rotated_only_the_new_one(state):
    cluster = typed(ONE)
    bootstrap = boot.host_key(state, "c-master").public
    boot.write_pinned(state, cluster.master, "ssh-ed25519 NEWKEY", pending=True)
    boot.write_access(state, cluster)
    assert [ln.split(" ", 1)[1] for ln in _lines(state)] == [bootstrap, "ssh-ed25519 NEWKEY"]
    boot.write_pinned(state, cluster.master, "ssh-ed25519 NEWKEY")
    boot.write_access(state, cluster)
    assert [ln.split(" ", 1)[1] for ln in _lines(state)] == ["ssh-ed25519 NEWKEY"]
    assert not boot.needs_rotation(state, cluster.master)


def test_a_server_made_anew_under_the_name_is_known_by_its_bootstrap_key_again(state):
    boot.write_pinned(state, typed(ONE).master, "ssh-ed25519 OLDSERVERS")
    remade = typed({**ONE, "nodes": [{**ONE["nodes"][0], "id": "server-2"}]})
    boot.write_access(state, remade)
    assert [ln.split(" ", 1)[1] for ln in _lines(state)] == [boot.host_key(state, "c-master").public]
    assert boot.needs_rotation(state, remade.master)


def test_scale_in_forgets_the_pinned_keys_too(state):
    two = {"name": "c", "nodes": [ONE["nodes"][0], {"name": "c-worker-1", "private_ip": "127.0.0.2", "id": "s2"}]}
    boot.write_user_data(ClusterSpec(name="c", nodes=2), state)
    boot.write_pinned(state, typed(two).nodes[1], "ssh-ed25519 W")
    boot.prune(state, typed(ONE))
    assert not list(state.host_keys_dir.glob("c-worker-1*"))


# ------------------------------------------------------------------ against a real sshd


class Sshd:
    def __init__(self, tmp, host_key_file, authorized):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.pidfile = tmp / f"sshd-{self.port}.pid"
        self.dropins = tmp / f"sshd-{self.port}.d"  # as a node's /etc/ssh/sshd_config.d
        self.dropins.mkdir()
        config = tmp / f"sshd-{self.port}.conf"
        config.write_text(textwrap.dedent(f"""\
            Include {self.dropins}/*.conf
            ListenAddress 127.0.0.1
            Port {self.port}
            HostKey {host_key_file}
            AuthorizedKeysFile {authorized}
            PidFile {self.pidfile}
            StrictModes no
            UsePAM no
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            PermitRootLogin prohibit-password
            LogLevel ERROR
        """))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.skip(f"sshd would not start here: {self.proc.stderr.read().decode()[-300:]}")
            time.sleep(0.1)

    def answers(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def served_key(self) -> str:
        for _ in range(50):  # the port is closed while sshd re-executes after a reload
            if self.answers():
                break
            time.sleep(0.1)
        out = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(self.port), "127.0.0.1"],
                             capture_output=True, text=True, timeout=30).stdout
        return " ".join(next(ln for ln in out.splitlines() if not ln.startswith("#")).split()[1:3])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def node(state, tmp_path, monkeypatch):
    """A 'node': an sshd serving a copy of the bootstrap key, as cloud-init installs it from
    user-data; the deployer reaches it through the cluster's own ssh_config and known_hosts."""
    if os.getuid() != 0 or not (os.path.exists(SSHD) and shutil.which("ssh-keyscan")):
        pytest.skip("needs root and OpenSSH's sshd (make test runs as root; apt-get install openssh-server)")
    live = tmp_path / "node" / "ssh_host_ed25519_key"
    live.parent.mkdir()
    shutil.copy(boot.host_key(state, "c-master").private_path, live)
    shutil.copy(boot.host_key(state, "c-master").private_path.with_suffix(".pub"), live.with_suffix(".pub"))
    sshd = Sshd(tmp_path, live, state.ssh_public_key)
    me = pwd.getpwuid(os.getuid()).pw_name
    # The node's sshd listens on its own port, and the cluster's known_hosts names it by node name.
    monkeypatch.setattr(rekey, "ssh_argv", lambda st, n: ["ssh", "-p", str(sshd.port), "-o", f"User={me}",
                                                         "-o", f"HostKeyAlias={n.name}", "-F", str(st.ssh_config), n.name])
    monkeypatch.setattr(rekey, "KEY", str(live))
    monkeypatch.setattr(rekey, "SSHD_DROPIN", str(sshd.dropins / "deployer-host-certificate.conf"))
    monkeypatch.setattr(rekey, "RELOAD", f'kill -HUP "$(cat {sshd.pidfile})"')
    monkeypatch.setattr(rekey, "AS_ROOT", [])
    cluster = typed(ONE)
    boot.write_access(state, cluster)
    yield sshd, cluster, live
    sshd.stop()


def _ssh(state, sshd, known_hosts) -> subprocess.CompletedProcess:
    """One login; tried again while the sshd is re-executing after a reload (port closed)."""
    for _ in range(50):
        p = _ssh_once(state, sshd, known_hosts)
        if "Connection refused" not in p.stderr:
            return p
        time.sleep(0.1)
    return p


def _ssh_once(state, sshd, known_hosts) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-p", str(sshd.port), "-o", f"UserKnownHostsFile={known_hosts}", "-o", "HostKeyAlias=c-master",
                           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-i", str(state.ssh_private_key),
                           "-o", "IdentitiesOnly=yes", "127.0.0.1", "true"], capture_output=True, text=True, timeout=30)


def test_the_node_gets_a_key_of_its_own_and_the_user_datas_key_poses_as_it_no_more(state, node, tmp_path):
    sshd, cluster, live = node
    bootstrap = boot.host_key(state, "c-master")
    leaked = tmp_path / "from-user-data"  # what any process on the VM reads from the metadata service
    shutil.copy(bootstrap.private_path, leaked)
    old_public = bootstrap.public

    assert rekey.rotate(state, cluster) == ["c-master"]

    served = sshd.served_key()
    assert served != old_public
    assert [ln.split(" ", 1)[1] for ln in _lines(state)] == [served]
    assert not bootstrap.private_path.exists()  # the next server of that name gets a new one
    assert not live.with_name(live.name + ".next").exists()
    assert _ssh(state, sshd, state.known_hosts).returncode == 0
    # An impostor serving the key from user-data is refused by the cluster's known_hosts.
    impostor = Sshd(tmp_path, leaked, state.ssh_public_key)
    try:
        refused = _ssh(state, impostor, state.known_hosts)
    finally:
        impostor.stop()
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
    # Done once: the next `up` finds nothing to rotate and connects to nothing.
    assert rekey.rotate(state, cluster) == []


def _ca_known_hosts(state, tmp_path):
    """What ssh_mesh writes on every node: the cluster's host CA, no node's key."""
    path = tmp_path / "ssh_known_hosts"
    path.write_text(f"@cert-authority c-master,127.0.0.1 {boot.ensure_host_ca(state)}\n")
    return path


def test_the_new_key_is_certified_by_the_clusters_host_ca_and_the_ca_alone_lets_nodes_in(state, node, tmp_path):
    sshd, cluster, live = node
    bootstrap = boot.host_key(state, "c-master")
    leaked = tmp_path / "from-user-data"
    shutil.copy(bootstrap.private_path, leaked)
    ca_only = _ca_known_hosts(state, tmp_path)
    # The bootstrap key has no certificate: a node trusting only the CA refuses it.
    assert _ssh(state, sshd, ca_only).returncode == 255

    assert rekey.rotate(state, cluster) == ["c-master"]

    cert = live.with_name(live.name + "-cert.pub").read_text()
    listed = subprocess.run(["ssh-keygen", "-L", "-f", "-"], input=cert, capture_output=True, text=True, check=True).stdout
    assert "host certificate" in listed and "c-master" in listed and "127.0.0.1" in listed
    assert boot.read_cert(state, cluster.master) == " ".join(cert.split()[:2])
    assert _ssh(state, sshd, ca_only).returncode == 0
    assert rekey.certify(state, cluster) == []  # certified with its key: nothing more to do
    impostor = Sshd(tmp_path, leaked, state.ssh_public_key)
    try:
        refused = _ssh(state, impostor, ca_only)
    finally:
        impostor.stop()
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr


def test_a_node_rotated_before_the_ca_gets_a_certificate_for_the_key_it_keeps(state, node, tmp_path):
    sshd, cluster, live = node
    assert rekey.rotate(state, cluster) == ["c-master"]
    served = sshd.served_key()
    boot.cert_path(state, "c-master").unlink()  # as a cluster rotated by a deployer without the CA
    (sshd.dropins / "deployer-host-certificate.conf").unlink()
    live.with_name(live.name + "-cert.pub").unlink()
    os.kill(int(sshd.pidfile.read_text()), 1)  # SIGHUP: sshd reads its configuration again
    ca_only = _ca_known_hosts(state, tmp_path)
    assert _ssh(state, sshd, ca_only).returncode == 255
    assert boot.needs_certificate(state, cluster.master)

    assert rekey.certify(state, cluster) == ["c-master"]

    assert sshd.served_key() == served and not boot.needs_certificate(state, cluster.master)
    assert _ssh(state, sshd, ca_only).returncode == 0


def test_a_node_that_cannot_make_a_key_is_named_and_keeps_its_bootstrap_key(state, node, monkeypatch):
    sshd, cluster, live = node
    monkeypatch.setattr(rekey, "KEY", "/nonexistent/dir/key")
    with pytest.raises(OperationFailed, match=r"c-master: could not make a new host key .*`deployer up` again retries"):
        rekey.rotate(state, cluster)
    assert [ln.split(" ", 1)[1] for ln in _lines(state)] == [sshd.served_key()]
    assert boot.needs_rotation(state, cluster.master)


def test_interrupted_after_the_swap_the_node_is_still_reached_and_the_next_up_finishes(state, node, monkeypatch):
    sshd, cluster, live = node
    real_root = rekey._root

    def swapped_then_interrupted(st, n, script, what, tries=1):
        out = real_root(st, n, script, what, tries)
        if what.startswith("swap"):
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(rekey, "_root", swapped_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        rekey.rotate(state, cluster)
    assert _ssh(state, sshd, state.known_hosts).returncode == 0  # the pending key is accepted beside the old
    monkeypatch.setattr(rekey, "_root", real_root)
    assert rekey.rotate(state, cluster) == ["c-master"]
    assert [ln.split(" ", 1)[1] for ln in _lines(state)] == [sshd.served_key()]
