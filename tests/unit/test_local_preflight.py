"""Local provider preflight: refuses, with the fix named, before anything exists."""

import ipaddress
import json
import subprocess

import pytest

from deployer.errors import PreflightError
from deployer.providers.local import network, node
from deployer.providers.local import provider as local
from deployer.records import Origin
from deployer.spec import ClusterSpec
from deployer.state import ClusterState


@pytest.fixture
def healthy(monkeypatch, tmp_path_factory):
    monkeypatch.setattr(local, "CLAIMS_DIR", tmp_path_factory.mktemp("claims"))
    monkeypatch.setattr(node, "containers", lambda name: {})  # no container of the name on this host
    monkeypatch.setattr(network, "nft_table_exists", lambda name: False)  # nor its table
    monkeypatch.setattr(local.os, "geteuid", lambda: 0)
    monkeypatch.setattr(local.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(local, "_mem_available_mb", lambda: 16000)
    monkeypatch.setattr(local, "_host_routes", lambda: [(ipaddress.IPv4Network("192.0.2.0/24"), "eth0")])


def check(tmp_path, **kw):
    spec = ClusterSpec(**kw)
    local.LocalProvider().preflight(spec, ClusterState(tmp_path, spec.name))
    return spec


def test_healthy_host_passes(healthy, tmp_path):
    check(tmp_path, nodes=8)
    assert list(tmp_path.iterdir()) == []
    assert local.claim_holder("demo") == (tmp_path / "demo").resolve()


def test_a_name_another_state_dir_holds_is_refused_naming_it(healthy, tmp_path):
    # Two working directories, one name: the second `up` destroyed the first's cluster.
    first, second = tmp_path / "a" / ".deployer", tmp_path / "b" / ".deployer"
    check(first, name="lab", nodes=2)
    owner = ClusterState(first, "lab")
    owner.create()
    owner.write_origin(Origin(**{"provider": "local", "terraform_env": {}, "cluster_id": "aaaaaaaaaaaa"}))  # the first made its cluster
    with pytest.raises(PreflightError, match=f"'lab' is in use on this machine by the state dir {first.resolve() / 'lab'}"):
        check(second, name="lab", nodes=2)
    assert not (second / "lab").exists()
    check(first, name="lab", nodes=2)  # its own name stays its own
    # Once the first is down (its records gone), the name is free.
    local.LocalProvider().forget(owner, {})
    owner.origin_file.unlink()
    check(second, name="lab", nodes=2)
    assert local.claim_holder("lab") == (second / "lab").resolve()


def test_containers_this_state_dir_did_not_make_are_refused(healthy, monkeypatch, tmp_path):
    monkeypatch.setattr(node, "containers", lambda name: {f"{name}-master": "running"})
    with pytest.raises(PreflightError, match="lab-master of another cluster named 'lab' exist on this machine"):
        check(tmp_path, name="lab", nodes=2)


@pytest.mark.parametrize(("recorded", "refused"), [("bbbbbbbbbbbb", True), ("aaaaaaaaaaaa", False), (None, True)],
                         ids=["another-id", "own-id", "none-recorded"])
def test_a_container_made_by_another_cluster_id_is_refused(healthy, monkeypatch, tmp_path, recorded, refused):
    """A state dir that made its cluster (id aaaa...) finds a container of its node's name
    that another cluster made (the driver records the maker's id beside each container);
    one with no id was not made by this deployer: not ours either."""
    st = ClusterState(tmp_path, "lab")
    st.create()
    st.write_origin(Origin(**{"provider": "local", "terraform_env": {}, "cluster_id": "aaaaaaaaaaaa"}))
    monkeypatch.setattr(node, "containers", lambda name: {f"{name}-master": "running"})
    monkeypatch.setattr(node, "cluster_id_of", lambda name: recorded)
    if refused:
        with pytest.raises(PreflightError, match="node lab-master of another cluster named 'lab'"):
            check(tmp_path, name="lab", nodes=2)
    else:
        check(tmp_path, name="lab", nodes=2)
    seen = local.LocalProvider().observe(st, {}, ["lab-master"])
    assert seen.nodes["lab-master"].state == ("missing" if refused else "running"), "another's container is not this cluster's"
    if not refused:  # a local cluster is one host: this machine, zone local (the cluster record's placement)
        import socket

        m = seen.nodes["lab-master"]
        assert (m.host, m.host_id, m.zone) == (socket.gethostname(), socket.gethostname(), "local")


def test_not_root(healthy, monkeypatch, tmp_path):
    monkeypatch.setattr(local.os, "geteuid", lambda: 1000)
    with pytest.raises(PreflightError, match="run as root"):
        check(tmp_path, nodes=1)


@pytest.mark.parametrize("tool, package", [("lxc-start", "lxc"), ("debootstrap", "debootstrap"), ("nft", "nftables")])
def test_missing_tool_names_the_package(healthy, monkeypatch, tmp_path, tool, package):
    monkeypatch.setattr(local.shutil, "which", lambda t: None if t == tool else f"/usr/bin/{t}")
    with pytest.raises(PreflightError, match=f"apt-get install {package}"):
        check(tmp_path, nodes=1)


def test_too_many_nodes_for_memory_names_the_largest_that_fits(healthy, monkeypatch, tmp_path):
    monkeypatch.setattr(local, "_mem_available_mb", lambda: 1024 + 4 * 1536 + 100)
    check(tmp_path, nodes=4)
    with pytest.raises(PreflightError, match="use --nodes 4 or less"):
        check(tmp_path, nodes=5)


def test_subnet_colliding_with_a_host_route(healthy, monkeypatch, tmp_path):
    monkeypatch.setattr(local, "_host_routes", lambda: [(ipaddress.IPv4Network("10.77.0.0/16"), "eth1")])
    with pytest.raises(PreflightError, match="collides with the host route 10.77.0.0/16 on eth1"):
        check(tmp_path, nodes=2, local={"subnet": "10.77.3.0/24"})
    with pytest.raises(PreflightError, match="no /24 from 10.77.0.0/24 up in 10.77.0.0/16 is free"):
        check(tmp_path, nodes=2)


def test_a_second_cluster_of_default_spec_gets_the_next_free_subnet_and_keeps_it(healthy, monkeypatch, tmp_path):
    routes = [(ipaddress.IPv4Network("10.77.0.0/24"), "dpl-first"), (ipaddress.IPv4Network("10.77.1.0/24"), "dpl-second")]
    monkeypatch.setattr(local, "_host_routes", lambda: routes)
    spec = check(tmp_path, name="third", nodes=1)
    assert str(spec.local.subnet) == "10.77.2.0/24"
    # Recorded with the cluster; a later `up` keeps it, even once a lower one is free again.
    st = ClusterState(tmp_path, "third")
    st.create()
    st.write_spec(spec)
    routes[:] = [(ipaddress.IPv4Network("10.77.2.0/24"), "dpl-third")]
    assert str(check(tmp_path, name="third", nodes=1).local.subnet) == "10.77.2.0/24"


def test_own_bridge_route_is_not_a_collision(healthy, monkeypatch, tmp_path):
    monkeypatch.setattr(local, "_host_routes", lambda: [(ipaddress.IPv4Network("10.77.0.0/24"), "dpl-demo")])
    check(tmp_path, nodes=2)


def test_real_route_table_parses(monkeypatch):
    # This machine's own routes through `ip -j`, against a route the test adds to what
    # `ip` prints (a link-scope /24 on lo is what a bridge's route looks like).
    real = subprocess.run
    extra = {"dst": "10.213.7.0/24", "dev": "dpl-probe", "protocol": "kernel", "scope": "link"}

    def ip_with_a_probe(argv, *a, **kw):
        p = real(argv, *a, **kw)
        if argv[:2] == ["ip", "-j"]:
            p = subprocess.CompletedProcess(p.args, p.returncode, json.dumps([*json.loads(p.stdout or "[]"), extra]), p.stderr)
        return p

    monkeypatch.setattr(local.subprocess, "run", ip_with_a_probe)
    routes = local._host_routes()
    assert (ipaddress.IPv4Network("10.213.7.0/24"), "dpl-probe") in routes
    assert all(isinstance(net, ipaddress.IPv4Network) for net, _ in routes)


@pytest.mark.parametrize("name", ["demo", "abcdefghijk", "a-very-long-name-20c"])
def test_bridge_names_fit_ifnamsiz(name):
    b = local.bridge_name(name)
    assert len(b) <= 15 and b.startswith("dpl-")
    assert local.bridge_name(name) == b  # stable
