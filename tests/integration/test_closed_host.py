"""The host is no router into the cluster network: a connection from another network of
this machine to a node is dropped, while the nodes still open connections out. Real
packets: a network namespace stands for that other network (a VM, a container, a
neighbour routed through this host)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

NS, HOST_END, NS_END = "dplt-outside", "dplt-h", "dplt-n"
HOST_IP, NS_IP = "10.250.77.1", "10.250.77.2"


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


@pytest.fixture
def outside():
    _sh("ip", "netns", "del", NS, check=False)
    _sh("ip", "link", "del", HOST_END, check=False)
    _sh("ip", "netns", "add", NS)
    try:
        _sh("ip", "link", "add", HOST_END, "type", "veth", "peer", "name", NS_END)
        _sh("ip", "link", "set", NS_END, "netns", NS)
        _sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", HOST_END)
        _sh("ip", "link", "set", HOST_END, "up")
        for cmd in (["ip", "addr", "add", f"{NS_IP}/30", "dev", NS_END], ["ip", "link", "set", NS_END, "up"],
                    ["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "default", "via", HOST_IP]):
            _sh("ip", "netns", "exec", NS, *cmd)
        yield
    finally:
        _sh("ip", "netns", "del", NS, check=False)
        _sh("ip", "link", "del", HOST_END, check=False)


def _connect(where: list[str], ip: str, port: int) -> int:
    probe = f"import socket; socket.create_connection(({ip!r}, {port}), timeout=3)"
    return subprocess.run([*where, sys.executable, "-c", probe], capture_output=True).returncode


def test_other_networks_cannot_open_connections_into_the_cluster(local_cluster, outside):
    master = local_cluster.cluster_output().master
    in_ns = ["ip", "netns", "exec", NS]
    assert _connect([], master.private_ip, 22) == 0  # the master's sshd answers the host
    # The master may open a connection out to that network (forwarded, new): allowed, and
    # its replies come back through the host: forwarding works both ways.
    listener = subprocess.Popen([*in_ns, sys.executable, "-c",
                                 f"import socket; s = socket.create_server(({NS_IP!r}, 8765)); s.settimeout(60); s.accept()"])
    try:
        time.sleep(1)
        p = local_cluster.deployer("ssh", "master", "--", "timeout", "5", "bash", "-c", f"'</dev/tcp/{NS_IP}/8765'", timeout=60)
        assert p.returncode == 0, p.stderr
        assert listener.wait(timeout=30) == 0  # it was that listener that answered
    finally:
        listener.kill()
    # From that network to the master's sshd (forwarded, new): dropped.
    assert _connect(in_ns, master.private_ip, 22) != 0


def test_the_cluster_key_logs_in_from_the_cluster_network_only(local_cluster):
    # The mesh key pair is on every node; authorised with from="<cluster network>", a copy
    # taken from a worker is no login elsewhere. From the master: to a worker over the
    # cluster network it works; to itself over loopback (outside that network) it does not.
    worker = local_cluster.cluster_output().workers[0].private_ip
    ok = local_cluster.deployer("ssh", "master", "--", "ssh", "-o", "BatchMode=yes", worker, "true", timeout=60)
    assert ok.returncode == 0, ok.stderr
    refused = local_cluster.deployer("ssh", "master", "--", "ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                                     "-o", "UserKnownHostsFile=/dev/null", "127.0.0.1", "true", timeout=60)
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stderr
    keys = local_cluster.deployer("ssh", "master", "--", "cat", ".ssh/authorized_keys", timeout=60).stdout
    assert [line for line in keys.splitlines() if line.endswith("-mesh")] == [
        line for line in keys.splitlines() if line.startswith(f'from="{local_cluster.cluster_output().cluster_cidr}" ')]
