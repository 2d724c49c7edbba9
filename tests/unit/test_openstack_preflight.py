"""OpenStack preflight against a stand-in cloud on 127.0.0.1.

openstacksdk and keystoneauth run for real (clouds.yaml, version discovery, token,
catalog, find-by-name-or-id, microversions); the cloud is tests/fixtures/openstack/
fake_cloud.py serving JSON shaped after the official API references.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest
import yaml

from deployer.errors import OperationFailed, PreflightError
from deployer.providers import openstack_preflight as pf
from deployer.providers import openstack_quota as quota
from deployer.providers import openstack_session as session
from deployer.providers.openstack import OpenStackProvider
from deployer.spec import ClusterSpec

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
    import os

    for key in list(os.environ):
        if key.startswith("OS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(tmp_path / "clouds.yaml"))
    monkeypatch.setenv("OS_CLIENT_SECURE_FILE", str(tmp_path / "secure.yaml"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/openstack/clouds.yaml
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    monkeypatch.chdir(tmp_path)  # no ./clouds.yaml
    # openstacksdk fixes its search path (cwd, ~/.config, /etc) when first imported.
    from openstack.config import loader

    monkeypatch.setattr(loader, "CONFIG_FILES", [])
    monkeypatch.setattr(loader, "SECURE_FILES", [])
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
    base = {"cloud": "testcloud", "flavor": "m1.large", "image": "Ubuntu 22.04", "external_network": "public"}
    nodes = openstack.pop("nodes", 4)
    monitoring = openstack.pop("monitoring", {"enabled": True})
    return ClusterSpec.model_validate(
        {"name": "demo", "provider": "openstack", "nodes": nodes, "monitoring": monitoring, "openstack": {**base, **openstack}}
    )


def set_compute_limits(cloud, **absolute):
    cloud.data["compute_limits"]["limits"]["absolute"].update(absolute)


def writes(cloud) -> list[tuple[str, str]]:
    return [r for r in cloud.requests if r[0] != "GET" and not r[1].endswith("/auth/tokens")]


# ---- the happy path -----------------------------------------------------------------------


def test_all_good(cloud, state, capsys):
    provider = OpenStackProvider()
    provider.preflight(make_spec(), state)
    err = capsys.readouterr().err
    assert "4 × m1.large" in err and "fit the project's quotas" in err
    assert "warning" not in err
    assert writes(cloud) == []  # preflight creates nothing
    assert PASSWORD not in err


def test_result_fields(cloud):
    r = pf.check(make_spec())
    assert (r.flavor, r.vcpus, r.ram_mb, r.gpus_per_node, r.existing_nodes) == ("m1.large", 4, 8192, 0, [])
    assert r.image_id == "1bea47ed-f6a9-463b-b423-14b9cca9ad27"
    assert r.project_id == fake_cloud.PROJECT_ID


def test_image_by_id_and_existing_network_and_key_pair(cloud):
    r = pf.check(
        make_spec(
            image="1bea47ed-f6a9-463b-b423-14b9cca9ad27", network="horovod-net", key_pair="researcher-laptop", floating_ip="203.0.113.42"
        )
    )
    assert r.image_id == "1bea47ed-f6a9-463b-b423-14b9cca9ad27"


# ---- what the user gets wrong -------------------------------------------------------------------


def test_missing_flavor_names_the_choices(cloud):
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(flavor="m1.huge"))
    msg = str(e.value)
    assert "flavor 'm1.huge' not found" in msg and "openstack.flavor" in msg
    assert "g1.v100" in msg and "m1.large" in msg
    assert e.value.exit_code == 2


def test_missing_image(cloud):
    with pytest.raises(PreflightError, match=r"image 'Debian 13' not found .*openstack.image"):
        pf.check(make_spec(image="Debian 13"))


def test_missing_external_network_lists_external_ones(cloud):
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(external_network="ext-net"))
    assert "external network 'ext-net' not found" in str(e.value) and "public" in str(e.value)


def test_internal_network_is_not_external(cloud):
    with pytest.raises(PreflightError, match="is not an external network"):
        pf.check(make_spec(external_network="horovod-net"))


def test_missing_existing_network(cloud):
    with pytest.raises(PreflightError, match=r"network 'lab-net' not found; set openstack.network"):
        pf.check(make_spec(network="lab-net"))


def test_existing_network_needs_one_ipv4_subnet(cloud):
    with pytest.raises(PreflightError, match="has 2 IPv4 subnets"):
        pf.check(make_spec(network="two-subnets"))


def test_network_cidr_too_small(cloud):
    with pytest.raises(PreflightError, match=r"network_cidr 10.9.0.0/29 has room for 4 nodes, not 6"):
        pf.check(make_spec(network_cidr="10.9.0.0/29", nodes=6))


def test_missing_key_pair(cloud):
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(key_pair="laptop"))
    assert "key pair 'laptop' not found" in str(e.value) and "researcher-laptop" in str(e.value)


def test_missing_floating_ip(cloud):
    with pytest.raises(PreflightError, match="floating IP 203.0.113.99 is not allocated"):
        pf.check(make_spec(floating_ip="203.0.113.99"))


def test_several_problems_on_one_line(cloud):
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(flavor="nope", image="nope"))
    msg = str(e.value)
    assert "\n" not in msg and "flavor 'nope'" in msg and "(and 1 more: image 'nope'" in msg


# ---- credentials and reachability ----------------------------------------------------------------


def test_wrong_password(isolated_env):
    with fake_cloud.FakeCloud(password="the real one") as c:
        write_clouds_yaml(isolated_env / "clouds.yaml", c.auth_url, password=PASSWORD)
        with pytest.raises(PreflightError) as e:
            pf.check(make_spec())
    msg = str(e.value)
    assert "refused the credentials of cloud 'testcloud' (HTTP 401)" in msg and "clouds.yaml" in msg
    assert PASSWORD not in msg


def test_unreachable_auth_url(isolated_env, capsys):
    with socket.socket() as s:  # a port on 127.0.0.1 that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    write_clouds_yaml(isolated_env / "clouds.yaml", f"http://researcher:{PASSWORD}@127.0.0.1:{port}/identity/v3")
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec())
    msg = str(e.value)
    assert "cannot reach the OpenStack identity service" in msg and "auth_url" in msg
    assert PASSWORD not in msg
    assert capsys.readouterr().err == ""  # keystoneauth's own warnings stay quiet


def test_no_clouds_yaml_and_no_os_cloud(isolated_env):
    spec = make_spec(cloud=None)
    with pytest.raises(PreflightError) as e:
        pf.check(spec)
    assert "clouds.yaml" in str(e.value) and "OS_CLOUD" in str(e.value)


def test_cloud_not_in_clouds_yaml(cloud):
    with pytest.raises(PreflightError, match=r"cloud 'elkh' is not in any clouds.yaml.*OS_CLOUD"):
        pf.check(make_spec(cloud="elkh"))


def test_os_cloud_from_environment(cloud, monkeypatch):
    monkeypatch.setenv("OS_CLOUD", "testcloud")
    assert pf.check(make_spec(cloud=None)).flavor == "m1.large"


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


# ---- quotas -----------------------------------------------------------------------------------------


def test_quota_too_small_names_largest_n(cloud):
    # 160 cores free, 16 vCPUs a node: 10 would fit by cores, but 5 instances are in use of 10.
    set_compute_limits(cloud, totalInstancesUsed=5)
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(flavor="g1.v100", nodes=8, enable_gpu=True))
    msg = str(e.value)
    assert "too small for 8 nodes of g1.v100" in msg
    assert "instances: need 8, 5 free of 10" in msg
    assert "--nodes 5" in msg and "the largest cluster that fits is 5 nodes" in msg


def test_quota_ram_binds(cloud):
    set_compute_limits(cloud, maxTotalRAMSize=200 * 1024, maxTotalInstances=-1)
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(flavor="g1.v100", nodes=8, enable_gpu=True))
    assert "RAM: need 512 GiB, 200 GiB free" in str(e.value) and "--nodes 3" in str(e.value)


def test_quota_not_even_one_node(cloud):
    set_compute_limits(cloud, maxTotalCores=8)
    with pytest.raises(PreflightError, match="too small for even one node of g1.v100"):
        pf.check(make_spec(flavor="g1.v100", nodes=2))


def test_quota_shared_resources(cloud):
    cloud.data["network_quota_details"]["quota"]["floatingip"] = {"limit": 1, "used": 1, "reserved": 0}
    with pytest.raises(PreflightError, match=r"floating IPs: need 1, 0 free of 1"):
        pf.check(make_spec())
    # An existing floating IP needs no new one.
    pf.check(make_spec(floating_ip="203.0.113.42"))


def test_quota_volume_gigabytes(cloud):
    with pytest.raises(PreflightError, match=r"volume gigabytes: need 4096, 2000 free of 2000.*volume_size"):
        pf.check(make_spec(volume_size=4096))


def test_quota_security_group_rules_count_exposed_ports(cloud):
    cloud.data["network_quota_details"]["quota"]["security_group_rule"] = {"limit": 14, "used": 4, "reserved": 0}
    pf.check(make_spec())  # 7 rules
    # 2 ports (Grafana, Prometheus) x 2 CIDRs = 4 more
    spec = make_spec(monitoring={"enabled": True, "expose": True, "allowed_cidrs": ["203.0.113.0/24", "198.51.100.0/24"]})
    with pytest.raises(PreflightError, match=r"security group rules: need 11, 10 free"):
        pf.check(spec)


def _servers(names, cluster="demo", flavor=None):
    flavor = flavor or {"vcpus": 4, "ram": 8192, "disk": 80, "original_name": "m1.large"}
    return [{"id": f"id-{n}", "name": n, "status": "ACTIVE", "metadata": {"deployer_cluster": cluster}, "flavor": flavor} for n in names]


def test_scale_out_counts_only_new_nodes(cloud):
    # Four nodes exist and use 4 of 6 instances; growing to 6 needs 2 more: fits.
    cloud.data["compute_servers_detail"]["servers"] = _servers(["demo-master", "demo-worker-1", "demo-worker-2", "demo-worker-3"])
    # ...and the cluster's volume, groups and floating IP already count as used.
    set_compute_limits(cloud, maxTotalInstances=6, totalInstancesUsed=4, totalCoresUsed=16, totalRAMUsed=4 * 8192)
    cloud.data["volume_limits"]["limits"]["absolute"].update(maxTotalVolumes=1, totalVolumesUsed=1)
    r = pf.check(make_spec(nodes=6))
    assert len(r.existing_nodes) == 4
    with pytest.raises(PreflightError, match=r"too small for 7 nodes of m1.large \(4 exist, 3 to add\).*--nodes 6"):
        pf.check(make_spec(nodes=7))


def test_scale_in_on_a_full_project_fits(cloud):
    # The project is full with this cluster's own 4 nodes: 3 of them certainly fit.
    cloud.data["compute_servers_detail"]["servers"] = _servers(["demo-master", "demo-worker-1", "demo-worker-2", "demo-worker-3"])
    set_compute_limits(cloud, maxTotalInstances=4, totalInstancesUsed=4, maxTotalCores=16, totalCoresUsed=16)
    cloud.data["volume_limits"]["limits"]["absolute"].update(maxTotalVolumes=1, totalVolumesUsed=1)
    pf.check(make_spec(nodes=3), cluster_exists=True)
    pf.check(make_spec(nodes=4), cluster_exists=True)  # a plain re-run fits too
    with pytest.raises(PreflightError, match=r"--nodes 4"):
        pf.check(make_spec(nodes=5), cluster_exists=True)


def test_a_look_alike_server_of_someone_else_is_other_usage(cloud):
    # Named like our master but not tagged as ours (another tool, another user): it
    # takes quota, and it does not make the cluster "exist".
    cloud.data["compute_servers_detail"]["servers"] = _servers(["demo-master"], cluster="someone-else")
    set_compute_limits(cloud, maxTotalInstances=4, totalInstancesUsed=1)
    r = pf.check(make_spec(nodes=3))
    assert r.existing_nodes == []
    with pytest.raises(PreflightError, match=r"too small for 4 nodes of m1.large.*--nodes 3"):
        pf.check(make_spec(nodes=4))


def test_resumed_cluster_needs_no_shared_resources_again(cloud):
    # Terraform's state has the network, volume and floating IP, no server yet (an
    # interrupted first apply): those are not needed a second time.
    cloud.data["network_quota_details"]["quota"]["floatingip"] = {"limit": 1, "used": 1, "reserved": 0}
    with pytest.raises(PreflightError, match="floating IPs: need 1"):
        pf.check(make_spec())
    pf.check(make_spec(), cluster_exists=True)


def test_existing_network_needs_a_router_to_the_external_network(cloud):
    pf.check(make_spec(network="horovod-net"))
    cloud.data["network_routers"]["routers"][0]["external_gateway_info"]["network_id"] = "somewhere-else"
    with pytest.raises(PreflightError, match=r"network 'horovod-net' has no router to external network 'public'.*router add subnet R horovod-subnet"):
        pf.check(make_spec(network="horovod-net"))
    cloud.data["network_ports"]["ports"] = []
    with pytest.raises(PreflightError, match="has no router"):
        pf.check(make_spec(network="horovod-net"))


def test_flavor_without_root_disk_asks_for_boot_from_volume(cloud):
    cloud.data["compute_flavors_detail"]["flavors"][1]["disk"] = 0  # g1.v100
    with pytest.raises(PreflightError, match=r"flavor 'g1.v100' has no root disk \(0 GB\): boot from a volume with openstack.root_volume_size"):
        pf.check(make_spec(flavor="g1.v100", enable_gpu=True))
    pf.check(make_spec(flavor="g1.v100", enable_gpu=True, root_volume_size=100))


def test_image_larger_than_the_root_volume(cloud):
    cloud.data["image_images"]["images"][0]["min_disk"] = 60
    with pytest.raises(PreflightError, match="set openstack.root_volume_size to 60 or more"):
        pf.check(make_spec(root_volume_size=40))
    with pytest.raises(PreflightError, match=r"needs a 60 GB root disk, flavor 'm1.large' has 80 GB|set openstack.root_volume_size: 60"):
        cloud.data["compute_flavors_detail"]["flavors"][0]["disk"] = 50
        pf.check(make_spec())


def test_boot_volumes_count_against_the_volume_quotas(cloud):
    # 4 nodes x 100 GiB boot volumes + the 100 GiB shared volume = 500 GiB, 5 volumes.
    cloud.data["volume_limits"]["limits"]["absolute"].update(maxTotalVolumes=5, maxTotalVolumeGigabytes=500)
    pf.check(make_spec(nodes=4, root_volume_size=100))
    with pytest.raises(PreflightError, match=r"volumes: need 6, 5 free.*--nodes 4"):
        pf.check(make_spec(nodes=5, root_volume_size=100))


def test_unlimited_quotas(cloud):
    set_compute_limits(cloud, maxTotalInstances=-1, maxTotalCores=-1, maxTotalRAMSize=-1)
    pf.check(make_spec(nodes=64))


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


def test_gpu_flavor_sets_gpus_per_node(cloud, state):
    provider = OpenStackProvider()
    spec = make_spec(flavor="g2.a100x4", enable_gpu=True, nodes=2)
    checked = provider.preflight(spec, state)
    assert provider.tfvars(spec, state, checked)["gpus_per_node"] == 4
    # Without this run's preflight result, the spec's default.
    assert provider.tfvars(spec, state)["gpus_per_node"] == 1


def test_vgpu_flavor(cloud):
    assert pf.check(make_spec(flavor="g1.vgpu", enable_gpu=True)).gpus_per_node == 1


def test_enable_gpu_on_cpu_flavor_warns(cloud, state, capsys):
    OpenStackProvider().preflight(make_spec(enable_gpu=True), state)
    err = capsys.readouterr().err
    assert "warning:" in err and "asks for no GPU" in err and "m1.large" in err


def test_gpu_flavor_without_enable_gpu_warns(cloud):
    r = pf.check(make_spec(flavor="g1.v100"))
    assert r.gpus_per_node == 0 and any("enable_gpu is false" in w for w in r.warnings)


# ---- observe, repair, and what down must see gone ----------------------------------------------------------

ENV = {"OS_CLOUD": "testcloud"}


def test_observe_nothing_left(cloud):
    from deployer.providers.openstack_observe import observe

    seen = observe("demo", ENV, [])
    assert seen.remaining() == []


def test_observe_states_ids_and_what_remains(cloud):
    from deployer.providers.openstack_observe import observe

    servers = _servers(["demo-master", "demo-worker-1", "demo-worker-3"])
    servers[1]["status"] = "SHUTOFF"
    servers.append({"id": "s2", "name": "demo-worker-2", "status": "ACTIVE", "metadata": {}})  # a look-alike, not ours
    servers.append({"id": "s3", "name": "demo-workers", "status": "ACTIVE", "metadata": {"deployer_cluster": "demo"}})
    cloud.data["compute_servers_detail"]["servers"] = servers
    cloud.data["volume_volumes_detail"]["volumes"] = [
        {"id": "v1", "name": "demo-shared", "status": "available", "size": 100, "metadata": {"deployer_cluster": "demo"}},
        {"id": "v2", "name": "demo-shared", "status": "available", "size": 100, "metadata": {}},  # a look-alike: not ours
    ]
    cloud.data["network_security_groups"]["security_groups"] += [
        {"id": "g1", "name": "demo-cluster", "tags": ["deployer", "deployer-cluster-demo"]},
        {"id": "g2", "name": "demo-master", "tags": []},  # someone's group with a look-alike name: not ours
    ]
    cloud.data["compute_keypairs"]["keypairs"].append({"keypair": {"name": "demo-key", "type": "ssh"}})
    seen = observe("demo", ENV, ["demo-master", "demo-worker-1", "demo-worker-2"])
    assert {n: (m.state, m.id) for n, m in seen.nodes.items()} == {
        "demo-master": ("running", "id-demo-master"),
        "demo-worker-1": ("stopped", "id-demo-worker-1"),
        "demo-worker-2": ("missing", None),
    }
    assert seen.extra == ["demo-worker-3"]
    assert seen.remaining() == [
        "node demo-master", "node demo-worker-1", "node demo-worker-3",
        "security group demo-cluster", "volume demo-shared", "key pair demo-key",
    ]


def test_repair_starts_stopped_servers(cloud, state):
    from deployer.providers.base import Machine, Observation

    servers = _servers(["demo-master", "demo-worker-1"])
    servers[1]["status"] = "SHUTOFF"
    cloud.data["compute_servers_detail"]["servers"] = servers
    seen = Observation(nodes={"demo-master": Machine("running", "id-demo-master"), "demo-worker-1": Machine("stopped", "id-demo-worker-1")})
    fix = OpenStackProvider().repair(make_spec(nodes=2), state, {}, seen)
    assert fix.started == ["demo-worker-1"] and fix.recreate == []
    assert ("POST", "/compute/v2.1/servers/id-demo-worker-1/action") in [(m, p) for m, p in writes(cloud)]
    assert servers[1]["status"] == "ACTIVE"


def test_observe_on_a_failing_cloud_is_operation_failed(cloud):
    from deployer.providers.openstack_observe import observe

    cloud.fail["/compute/v2.1/servers"] = 503
    with pytest.raises(OperationFailed, match="listing what exists of cluster demo"):
        observe("demo", ENV, ["demo-master"])


def test_gc_finds_expired_clusters_by_server_metadata_without_any_state(cloud, tmp_path):
    from deployer import gc

    servers = _servers(["old-master", "old-worker-1"], cluster="old") + _servers(["new-master"], cluster="new") \
        + _servers(["keep-master"], cluster="keep")
    for s in servers[:2]:
        s["metadata"]["deployer_expires_at"] = "2026-11-20T08:00:00Z"
    servers[2]["metadata"]["deployer_expires_at"] = "2099-01-01T00:00:00Z"
    servers.append({"id": "x", "name": "someones-vm", "status": "ACTIVE", "metadata": {"deployer_expires_at": "2020-01-01T00:00:00Z"}})
    cloud.data["compute_servers_detail"]["servers"] = servers
    found = gc.find(tmp_path / "empty-state-root", "testcloud", gc.parse_iso("2026-11-23T12:00:00Z"))
    assert [e.to_json() for e in found] == [
        {"name": "old", "provider": "openstack", "expires_at": "2026-11-20T08:00:00Z", "in_state": False,
         "servers": ["old-master", "old-worker-1"]},
    ]
    # Listing and --dry-run write nothing.
    for dry in (False, True):
        results = gc.collect_and_act(tmp_path / "empty-state-root", cloud="testcloud", destroy=False, dry_run=dry)
        assert [r["action"] for r in results] == ["would destroy" if dry else "listed"]
    assert writes(cloud) == []


def _whole_cluster(cloud, name, expires):
    """What terraform/openstack makes for a 2-node cluster, as the APIs list it (tags:
    main.tf's local.tags), and a look-alike network of someone else's, untagged."""
    d = cloud.data
    tags = ["deployer", f"deployer-cluster-{name}"]
    d["network_networks"]["networks"].append({"id": "n-other", "name": f"{name}-net"})
    servers = _servers([f"{name}-master", f"{name}-worker-1"], cluster=name)
    for s in servers:
        s["metadata"]["deployer_expires_at"] = expires
    d["compute_servers_detail"]["servers"] += servers
    d["network_ports"]["ports"] += [{"id": f"p-{n}", "name": f"{name}-{n}-port", "network_id": "n1", "tags": tags}
                                    for n in ("master", "worker-1")]
    d["network_floatingips"]["floatingips"].append({"id": "f1", "floating_ip_address": "203.0.113.7", "tags": tags,
                                                    "description": f"deployer {name} master"})
    d["network_routers"]["routers"].append({"id": "r1", "name": f"{name}-router", "tags": tags})
    d["network_subnets"]["subnets"].append({"id": "sn1", "name": f"{name}-subnet", "network_id": "n1", "tags": tags})
    d["network_networks"]["networks"].append({"id": "n1", "name": f"{name}-net", "tags": tags})
    d["network_security_groups"]["security_groups"] += [{"id": f"g-{r}", "name": f"{name}-{r}", "tags": tags} for r in ("cluster", "master")]
    d["compute_keypairs"]["keypairs"].append({"keypair": {"name": f"{name}-key", "type": "ssh"}})
    d["volume_volumes_detail"]["volumes"].append({"id": "v1", "name": f"{name}-shared", "status": "available", "size": 100,
                                                  "metadata": {"deployer_cluster": name}})


def test_gc_yes_deletes_a_cloud_only_cluster_by_its_metadata_and_proves_nothing_is_left(cloud, tmp_path):
    from deployer import gc

    _whole_cluster(cloud, "old", "2026-11-20T08:00:00Z")
    cloud.data["compute_servers_detail"]["servers"] += _servers(["keep-master"], cluster="keep")  # no expiry: untouched
    cloud.allow_delete = True
    results = gc.collect_and_act(tmp_path / "no-state", cloud="testcloud", destroy=True, dry_run=False)
    assert [(r["name"], r["action"]) for r in results] == [("old", "destroyed")]
    done = [p.split("?")[0] for m, p in writes(cloud)]
    # Servers first (a port or volume in use cannot go), the network after its router.
    assert done[:2] == ["/compute/v2.1/servers/id-old-master", "/compute/v2.1/servers/id-old-worker-1"]
    assert done.index("/network/v2.0/routers/r1/remove_router_interface") < done.index("/network/v2.0/routers/r1") < done.index("/network/v2.0/networks/n1")
    assert f"/volume/v3/{fake_cloud.PROJECT_ID}/volumes/v1" in done and "/compute/v2.1/os-keypairs/old-key" in done
    from deployer.providers.openstack_observe import observe

    assert observe("old", ENV, []).remaining() == []
    assert [s["name"] for s in cloud.data["compute_servers_detail"]["servers"]] == ["keep-master"]
    assert "n-other" in [n["id"] for n in cloud.data["network_networks"]["networks"]], "by tag, not by name: the look-alike stays"


def test_deleting_by_metadata_refuses_a_name_no_server_vouches_for(cloud):
    from deployer.providers.openstack_delete import delete_cluster

    cloud.data["network_networks"]["networks"].append({"id": "n9", "name": "lab-net"})  # someone's network
    cloud.allow_delete = True
    with pytest.raises(OperationFailed, match="nothing proves 'lab' is a deployer cluster"):
        delete_cluster(ENV, "lab", say=lambda _: None)
    assert writes(cloud) == []


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
