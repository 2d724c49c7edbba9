"""The OpenStack code where the real services cannot go: a cloud that fails mid-way
(HTTP 500/503), a service that refuses a read (403), an error body that echoes a
secret, and the pure helpers.

Everything a real cloud can answer runs against the test cloud instead (tests/cloud:
Keystone, Nova, Neutron, Glance, Cinder, Placement on 127.0.0.1). Here openstacksdk and
keystoneauth still run for real, against tests/fixtures/openstack/fake_cloud.py, whose
JSON follows the API references: it can be told to fail, which the real services cannot.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from deployer.errors import OperationFailed, PreflightError
from deployer.providers.openstack import preflight as pf
from deployer.providers.openstack import quota, session
from deployer.spec import ClusterSpec
from tests import openstack_env

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openstack"
PASSWORD = "Sup3r-Secret-Pa55word!"


def _load_fake_cloud():
    spec = importlib.util.spec_from_file_location("fake_cloud", FIXTURES / "fake_cloud.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_cloud"] = module
    spec.loader.exec_module(module)
    return module


fake_cloud = _load_fake_cloud()


def write_clouds_yaml(path: Path, auth_url: str, password: str = PASSWORD) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "clouds": {
                    "testcloud": {
                        "auth": {
                            "auth_url": auth_url,
                            "username": "researcher",
                            "password": password,
                            "project_name": "horovod",
                            "user_domain_name": "Default",
                            "project_domain_name": "Default",
                        },
                        "region_name": "RegionOne",
                        "identity_api_version": 3,
                    }
                }
            }
        )
    )


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """No clouds.yaml or OS_* variable of the machine leaks in."""
    openstack_env.isolate(monkeypatch, tmp_path)
    return tmp_path


@pytest.fixture
def cloud(isolated_env):
    with fake_cloud.FakeCloud(password=PASSWORD) as c:
        write_clouds_yaml(isolated_env / "clouds.yaml", c.auth_url)
        yield c


@pytest.fixture
def state(tmp_path):
    from deployer.state import ClusterState

    st = ClusterState(tmp_path, "state")
    st.ssh_public_key.parent.mkdir(parents=True)
    st.ssh_public_key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDeployerClusterKeyForTestsOnly00000000000 deployer@demo\n")
    return st


def make_spec(**openstack) -> ClusterSpec:
    base = {"cloud": "testcloud", "flavor": "m1.large", "image": "Ubuntu 22.04", "external_network": "public",
            "admin_cidr": "203.0.113.0/24"}
    nodes = openstack.pop("nodes", 4)
    monitoring = openstack.pop("monitoring", {"enabled": True})
    return ClusterSpec.model_validate(
        {"name": "demo", "provider": "openstack", "nodes": nodes, "monitoring": monitoring, "openstack": {**base, **openstack}}
    )


def writes(cloud) -> list[tuple[str, str]]:
    return [r for r in cloud.requests if r[0] != "GET" and not r[1].endswith("/auth/tokens")]


# ---- credentials and a cloud that fails ---------------------------------------------------------


def test_no_clouds_yaml_and_no_os_cloud(isolated_env):
    spec = make_spec(cloud=None)
    with pytest.raises(PreflightError) as e:
        pf.check(spec)
    assert "clouds.yaml" in str(e.value) and "OS_CLOUD" in str(e.value)


def test_cloud_failing_midway_is_operation_failed(cloud):
    cloud.fail = {"/network/v2.0/quotas": 500}
    with pytest.raises(OperationFailed) as e:
        pf.check(make_spec())
    assert e.value.exit_code == 1 and "reading network quotas" in str(e.value) and "HTTP 500" in str(e.value)
    assert PASSWORD not in str(e.value)


def test_forbidden_quota_read_is_a_warning(cloud):
    cloud.fail = {"/volume/v3/": 403}
    r = pf.check(make_spec())
    assert any("block storage quotas" in w for w in r.warnings)


def test_password_never_in_any_message(isolated_env):
    """Every failure path above, once more, looking only for the password."""
    messages = []
    with fake_cloud.FakeCloud(password="other") as c:
        write_clouds_yaml(isolated_env / "clouds.yaml", c.auth_url)
        for spec in (make_spec(), make_spec(cloud="nope")):
            with pytest.raises(PreflightError) as e:
                pf.check(spec)
            messages.append(str(e.value))
    with fake_cloud.FakeCloud(password=PASSWORD) as c:
        write_clouds_yaml(isolated_env / "clouds.yaml", c.auth_url)
        c.fail = {"/compute/v2.1/limits": 503}
        c.fail_body = {"computeFault": {"code": 503, "message": f"backend said: password={PASSWORD}"}}
        with pytest.raises(OperationFailed) as e:
            pf.check(make_spec())
        messages.append(str(e.value))
    assert all(PASSWORD not in m for m in messages), messages
    assert "***" in messages[-1]


# ---- GPUs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra_specs", "gpus"),
    [
        ({}, 0),
        (None, 0),
        ({"hw:cpu_policy": "dedicated"}, 0),
        ({"pci_passthrough:alias": "V100:1"}, 1),
        ({"pci_passthrough:alias": "a100-sxm:2, a100-pcie:2"}, 4),
        ({"pci_passthrough:alias": "gpu"}, 1),
        ({"resources:VGPU": "1"}, 1),
        ({"resources1:VGPU": "2"}, 2),
        ({"resources:PGPU": "8"}, 8),
        ({"resources_gpu:CUSTOM_NVIDIA_A100_GPU": "2"}, 2),
        ({"resources:PCI_DEVICE": "1"}, 0),
        ({"resources:VGPU": "1", "pci_passthrough:alias": "V100:1"}, 1),
    ],
)
def test_gpus_from_extra_specs(extra_specs, gpus):
    assert quota.gpus_from_extra_specs(extra_specs) == gpus


# ---- observe, repair, and what down must see gone ----------------------------------------------------------

ENV = {"OS_CLOUD": "testcloud"}


def test_observe_on_a_failing_cloud_is_operation_failed(cloud):
    from deployer.providers.openstack.observe import observe

    cloud.fail["/compute/v2.1/servers"] = 503
    with pytest.raises(OperationFailed, match="listing what exists of cluster demo"):
        observe("demo", "0badc0ffee00", ENV, ["demo-master"])


def test_admin_cidr_defaults_to_this_machines_public_address_only(cloud, monkeypatch):
    """No admin_cidr: SSH is opened to the address this machine reaches the cloud from,
    when that is a public one (here the fake cloud is on 127.0.0.1, so the address is given)."""
    from ipaddress import IPv4Address

    monkeypatch.setattr(pf, "controller_address", lambda conn: IPv4Address("193.224.1.1"))
    spec = make_spec(admin_cidr=None)
    assert pf.check(spec).admin_cidr_from == "193.224.1.1"
    assert str(spec.openstack.admin_cidr) == "193.224.1.1/32"


def test_a_baked_image_keeps_what_the_preflight_fills_into_the_spec(cloud, monkeypatch, state):
    """`image:` (a bake) makes the preflight check a copy of the openstack settings with the
    image in place: what it fills in (admin_cidr here) must still reach the spec that
    tfvars reads, or Terraform stops on a required variable left unset."""
    from ipaddress import IPv4Address

    from deployer.providers.openstack.provider import OpenStackProvider

    monkeypatch.setattr(pf, "controller_address", lambda conn: IPv4Address("193.224.1.1"))
    spec = make_spec(admin_cidr=None).model_copy(update={"image": "Ubuntu 22.04"})
    checked = pf.check(spec)
    assert checked.admin_cidr_from == "193.224.1.1"
    assert str(spec.openstack.admin_cidr) == "193.224.1.1/32"
    tfvars = OpenStackProvider().tfvars(spec, state, checked)
    assert tfvars["admin_cidr"] == "193.224.1.1/32"


def test_exposing_monitoring_without_grafana_is_refused(cloud):
    """expose opens Grafana alone: without it there is nothing to open (and Prometheus never is)."""
    monitoring = {"enabled": True, "expose": True, "grafana": False, "allowed_cidrs": ["198.51.100.0/24"]}
    with pytest.raises(PreflightError, match="monitoring.expose opens Grafana only"):
        pf.check(make_spec(monitoring=monitoring))


def test_a_world_open_admin_cidr_is_a_warning(cloud):
    warnings = pf.check(make_spec(admin_cidr="0.0.0.0/0")).warnings
    assert any("open to the whole internet" in w for w in warnings), warnings


def test_observe_of_a_state_dir_that_made_nothing_is_refused():
    """No id at all (no origin.json): there is nothing of this state dir's to look for, and
    reading 'nothing there' would be a guess."""
    from deployer.providers.openstack.observe import observe

    with pytest.raises(OperationFailed, match="has made nothing in this state dir"):
        observe("demo", None, ENV, ["demo-master"])


# ---- pure helpers ------------------------------------------------------------------------------------------


def test_scrub():
    text = "auth failed for https://bob:hunter22@keystone.example/v3 with hunter22\nretry"
    assert session.scrub(text, ["hunter22"]) == "auth failed for https://***@keystone.example/v3 with *** retry"


def test_fit_reports_largest():
    q = {"instances": quota.Quota("instances", 10, 2), "cores": quota.Quota("cores", 64, 0), "ports": quota.Quota("ports", 12, 0)}
    want = quota.Needs({"instances": 1, "cores": 16, "ports": 1}, {"ports": 2})
    r = quota.fit(q, want, 8)
    assert not r.ok and r.largest_new == 4
    assert quota.fit(q, want, 4).ok


@pytest.mark.parametrize(("extra_specs", "attached"), [
    ({"resources:VGPU": "1"}, "vgpu"),
    ({"resources1:VGPU": "1", "trait:CUSTOM_NVIDIA_11": "required"}, "vgpu"),
    ({"pci_passthrough:alias": "V100:1"}, "passthrough"),
    ({"resources:PGPU": "2"}, "passthrough"),
    ({"resources:CUSTOM_NVIDIA_GPU": "1"}, None),  # a custom class can be either: the node asks
    ({}, None),
])
def test_how_a_flavor_attaches_its_gpus(extra_specs, attached):
    assert quota.gpu_attachment(extra_specs) == attached


# ---- issue 43: a flavor change, a network with port security off -------------------------------------------

CID = "0a1b2c3d4e5f"


def _servers(cloud, flavor: dict, names=("demo-master", "demo-worker-1", "demo-worker-2", "demo-worker-3")) -> None:
    meta = {"deployer_cluster": "demo", "deployer_cluster_id": CID}
    cloud.data["compute_servers_detail"]["servers"] = [
        {"id": f"00000000-0000-4000-8000-00000000000{i}", "name": n, "status": "ACTIVE", "metadata": dict(meta),
         "flavor": dict(flavor)} for i, n in enumerate(names)
    ]


# Nova >= 2.47 embeds the flavor (original_name, no ID); before, only its ID.
EMBEDDED_LARGE = {"original_name": "m1.large", "vcpus": 4, "ram": 8192, "disk": 80, "ephemeral": 0, "swap": 0}
EMBEDDED_V100 = {"original_name": "g1.v100", "vcpus": 16, "ram": 65536, "disk": 100, "ephemeral": 0, "swap": 0}


@pytest.mark.parametrize("running", [EMBEDDED_V100, {"id": "b8a3c5e1-7f3e-4b1c-9d2a-3e5f7a9c1b01", "links": []}])
def test_a_flavor_the_running_nodes_do_not_have_is_refused_in_one_line(cloud, running):
    """Item 2: terraform/openstack ignores flavor changes (the provider would resize and
    confirm a running server in place); the preflight says so before anything happens:
    one line, exit 2, the --replace that makes them anew, or a new cluster."""
    _servers(cloud, running)
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(), cluster_exists=True, cluster_id=CID)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in msg
    assert msg.startswith("flavor 'm1.large' is not the flavor of running node(s) demo-master, demo-worker-1, ")
    assert "never resized in place" in msg
    assert ("`deployer up --replace demo-master --replace demo-worker-1 --replace demo-worker-2 --replace demo-worker-3`"
            in msg)
    assert "a new cluster" in msg and "openstack.flavor back to" in msg
    assert writes(cloud) == []


def test_a_flavor_change_goes_ahead_when_every_node_on_the_old_one_is_replaced(cloud):
    _servers(cloud, EMBEDDED_V100)
    every = ["demo-master", "demo-worker-1", "demo-worker-2", "demo-worker-3"]
    with pytest.raises(PreflightError, match=r"running node\(s\) demo-worker-3 "):
        pf.check(make_spec(), cluster_exists=True, cluster_id=CID, replacing=every[:3])
    r = pf.check(make_spec(), cluster_exists=True, cluster_id=CID, replacing=every)
    assert r.reflavored == dict.fromkeys(every, "g1.v100")
    # Scaling in away from the nodes on the old flavor needs no --replace for those.
    r = pf.check(make_spec(nodes=2), cluster_exists=True, cluster_id=CID, replacing=every[:2])
    assert r.reflavored == dict.fromkeys(every[:2], "g1.v100")


def test_the_same_flavor_is_no_change(cloud):
    _servers(cloud, EMBEDDED_LARGE)
    assert pf.check(make_spec(), cluster_exists=True, cluster_id=CID).reflavored == {}
    _servers(cloud, {"id": "4", "links": []})  # before 2.47: the ID
    assert pf.check(make_spec(), cluster_exists=True, cluster_id=CID).reflavored == {}
    assert pf.check(make_spec(flavor="4"), cluster_exists=True, cluster_id=CID).reflavored == {}


def test_up_says_the_flavor_plan_before_anything_happens(cloud, state, capsys):
    from deployer.providers.openstack.provider import OpenStackProvider
    from deployer.records import Origin

    _servers(cloud, EMBEDDED_V100, names=("demo-master", "demo-worker-1"))
    state.write_origin(Origin(provider="openstack", terraform_env={}, cluster_id=CID))
    OpenStackProvider().preflight(make_spec(nodes=2), state, replacing=["demo-master", "demo-worker-1"])
    said = " ".join(capsys.readouterr().err.split())
    assert ("flavor change g1.v100 → m1.large: demo-master, demo-worker-1 will be deleted and made anew with m1.large "
            "(--replace), not resized") in said
    assert writes(cloud) == []


def _network(cloud, name: str, port_security: bool | None) -> None:
    net = next(n for n in cloud.data["network_networks"]["networks"] if n["name"] == "horovod-net")
    if port_security is None:
        net.pop("port_security_enabled")  # a cloud without the port_security extension
    else:
        net["port_security_enabled"] = port_security


def test_an_existing_network_with_port_security_off_is_refused_in_one_line(cloud):
    """Item 5: Neutron refuses a security group on a port of such a network, and every
    node's port carries the cluster's; the preflight looks, and names the fix."""
    _network(cloud, "horovod-net", False)
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(network="horovod-net"))
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert str(e.value).startswith(
        "network 'horovod-net' has port security disabled, so Neutron refuses the security groups every node's port "
        "carries; enable it (openstack network set --enable-port-security horovod-net) or remove openstack.network")
    assert writes(cloud) == []


@pytest.mark.parametrize("port_security", [True, None])
def test_port_security_on_or_not_reported_is_no_problem(cloud, port_security):
    _network(cloud, "horovod-net", port_security)
    assert pf.check(make_spec(network="horovod-net")).network_id == "9a3b1c2d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
