"""The OpenStack preflight against the test cloud: Keystone, Nova, Neutron, Glance and
Cinder answer with their own code, policies and quotas, as a member of project horovod
(not an admin) sees them. Quotas are set by the admin and reset after each test; usage
is real (servers made for the test).
"""

from __future__ import annotations

import contextlib
import socket
import time

import pytest
import yaml

from deployer.errors import PreflightError
from deployer.providers.openstack import preflight as pf
from deployer.providers.openstack.provider import OpenStackProvider
from deployer.spec import ClusterSpec

from . import catalog, module_resources
from .services import IMAGE
from .testcloud import PROJECT


def make_spec(name: str = "demo", **openstack) -> ClusterSpec:
    # The test cloud is on 127.0.0.1: no public address to default admin_cidr to.
    base = {"cloud": "testcloud", "flavor": "m1.large", "image": IMAGE, "external_network": "public",
            "admin_cidr": "203.0.113.0/24"}
    nodes = openstack.pop("nodes", 4)
    monitoring = openstack.pop("monitoring", {"enabled": True})
    ttl = openstack.pop("ttl", None)
    return ClusterSpec.model_validate({"name": name, "provider": "openstack", "nodes": nodes, "monitoring": monitoring,
                                       **({"ttl": ttl} if ttl else {}), "openstack": {**base, **openstack}})


@pytest.fixture
def member(test_cloud):
    conn = catalog.connect(test_cloud, "researcher", PROJECT)
    yield conn
    conn.close()


@pytest.fixture
def quotas(admin, own_project):
    """Set the test's own project's quotas; the defaults come back afterwards."""
    project = admin.identity.get_project(own_project.current_project_id)

    class Quotas:
        def compute(self, **kw):
            admin.set_compute_quotas(project.id, **kw)

        def network(self, **kw):
            admin.set_network_quotas(project.id, **kw)

        def volume(self, **kw):
            admin.set_volume_quotas(project.id, **kw)

    yield Quotas()
    for reset in (admin.delete_compute_quotas, admin.delete_network_quotas, admin.delete_volume_quotas):
        with contextlib.suppress(Exception):
            reset(project.id)


@pytest.fixture
def cluster(member, cluster_name):
    """A cluster name whose resources, whatever the test made, are deleted afterwards."""
    yield cluster_name
    module_resources.delete_all(member, cluster_name)


def project_inventory(conn) -> dict[str, list[str]]:
    """Everything a member's project holds, to prove that the preflight made nothing."""
    return {"servers": sorted(s.id for s in conn.compute.servers()), "networks": sorted(n.id for n in conn.network.networks()),
            "ports": sorted(p.id for p in conn.network.ports()), "volumes": sorted(v.id for v in conn.block_storage.volumes()),
            "keypairs": sorted(k.name for k in conn.compute.keypairs()), "ips": sorted(i.id for i in conn.network.ips()),
            "groups": sorted(g.id for g in conn.network.security_groups())}


# ---- the happy path -----------------------------------------------------------------------


def test_all_good_and_nothing_made(os_env, member, state, capsys, test_cloud):
    before = project_inventory(member)
    OpenStackProvider().preflight(make_spec(), state)
    err = capsys.readouterr().err
    assert "4 × m1.large" in err and "fit the project's quotas" in err
    assert "warning" not in err
    assert project_inventory(member) == before
    assert test_cloud.passwords["researcher"] not in err


def test_result_fields(os_env, member):
    r = pf.check(make_spec())
    assert (r.flavor, r.vcpus, r.ram_mb, r.gpus_per_node, r.existing_nodes) == ("m1.large", 4, 8192, 0, [])
    assert r.image_id == member.image.find_image(IMAGE).id
    assert r.project_id == member.current_project_id
    assert r.flavor_id == member.compute.find_flavor("m1.large").id
    assert r.external_network_id == member.network.find_network("public").id


# ---- what the user gets wrong -------------------------------------------------------------------


def test_missing_flavor_names_the_choices(os_env):
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(flavor="m1.huge"))
    msg = str(e.value)
    assert "flavor 'm1.huge' not found" in msg and "openstack.flavor" in msg
    assert "g1.vgpu" in msg and "m1.large" in msg and "m1.small" in msg
    assert e.value.exit_code == 2


def test_missing_image(os_env):
    with pytest.raises(PreflightError, match=r"image 'Debian 13' not found .*openstack.image"):
        pf.check(make_spec(image="Debian 13"))


def test_missing_external_network_lists_external_ones(os_env):
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(external_network="ext-net"))
    assert "external network 'ext-net' not found" in str(e.value) and "public" in str(e.value)


def test_a_shared_internal_network_is_not_external(os_env):
    with pytest.raises(PreflightError, match="'lab-shared' is not an external network"):
        pf.check(make_spec(external_network="lab-shared"))


def test_missing_existing_network(os_env):
    with pytest.raises(PreflightError, match=r"network 'lab-net' not found; set openstack.network"):
        pf.check(make_spec(network="lab-net"))


def test_existing_network_needs_one_ipv4_subnet(os_env, member, cluster):
    net = member.network.create_network(name=f"{cluster}-net")
    for cidr in ("10.31.0.0/24", "10.32.0.0/24"):
        member.network.create_subnet(network_id=net.id, cidr=cidr, ip_version=4)
    with pytest.raises(PreflightError, match="has 2 IPv4 subnets"):
        pf.check(make_spec(network=f"{cluster}-net"))


def test_network_cidr_too_small(os_env):
    with pytest.raises(PreflightError, match=r"network_cidr 10.9.0.0/29 has room for 4 nodes, not 6"):
        pf.check(make_spec(network_cidr="10.9.0.0/29", nodes=6))


def test_missing_key_pair_lists_the_projects(os_env, member, cluster):
    member.compute.create_keypair(name=f"{cluster}-key", public_key=module_resources.PUBLIC_KEY)
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(key_pair="laptop"))
    assert "key pair 'laptop' not found" in str(e.value) and f"{cluster}-key" in str(e.value)
    pf.check(make_spec(key_pair=f"{cluster}-key"))


def test_floating_ip_not_allocated_then_allocated(os_env, member, cluster):
    with pytest.raises(PreflightError, match="floating IP 203.0.113.99 is not allocated"):
        pf.check(make_spec(floating_ip="203.0.113.99"))
    ip = member.network.create_ip(floating_network_id=member.network.find_network("public").id,
                                  description=f"deployer {cluster} master")
    pf.check(make_spec(floating_ip=ip.floating_ip_address))


def test_several_problems_on_one_line(os_env):
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(flavor="nope", image="nope"))
    msg = str(e.value)
    assert "\n" not in msg and "flavor 'nope'" in msg and "(and 1 more: image 'nope'" in msg


# ---- names, IDs and duplicates: what the module will look up ----------------------------------------


def test_ids_are_resolved_and_handed_to_terraform(os_env, member, state):
    """openstack.flavor, .network and .external_network may be IDs; the module used to look
    each up by name and failed. The preflight resolves them and tfvars passes the IDs."""
    flavor = member.compute.find_flavor("m1.large")
    ext = member.network.find_network("public")
    shared = member.network.find_network("lab-shared")
    provider = OpenStackProvider()
    spec = make_spec(flavor=flavor.id, external_network=ext.id, network=shared.id)
    checked = provider.preflight(spec, state)
    v = provider.tfvars(spec, state, checked)
    assert (v["flavor_id"], v["external_network_id"], v["network_id"]) == (flavor.id, ext.id, shared.id)
    assert v["image_id"] == member.image.find_image(IMAGE).id and "image_name" not in v
    assert checked.flavor == "m1.large"  # shown by name
    # What the flavor promises, as Nova says it, for `deployer check` (the cluster output's machine).
    assert (v["flavor_vcpus"], v["flavor_ram_mb"]) == (flavor.vcpus, flavor.ram)


def test_duplicate_image_names_pick_the_newest_as_the_module_does(os_env, member, cluster):
    """Glance allows two images of one name; the module's look-up takes the most recent
    (most_recent = true). The preflight refused the name ("use the ID") instead."""
    name = f"{cluster}-image"
    made = []
    for _ in range(2):  # Glance's created_at counts seconds
        made.append(member.image.create_image(name=name, disk_format="raw", container_format="bare", data=b"x" * 512,
                                              allow_duplicates=True))
        time.sleep(1.1)
    try:
        newest = max(made, key=lambda i: member.image.get_image(i.id).created_at)
        assert pf.check(make_spec(image=name)).image_id == newest.id
    finally:
        for image in made:
            member.image.delete_image(image, ignore_missing=True)


def test_a_network_shared_by_another_project_is_accepted_with_a_warning(os_env, member):
    """lab-shared belongs to project lab, whose router a member of horovod cannot see
    (Neutron hides other projects' routers and ports); it was refused as 'no router'."""
    r = pf.check(make_spec(network="lab-shared"))
    assert any("belongs to another project" in w and "lab-shared" in w for w in r.warnings), r.warnings


def test_own_network_without_a_router_is_refused(os_env, member, cluster):
    net = member.network.create_network(name=f"{cluster}-net")
    subnet = member.network.create_subnet(network_id=net.id, cidr="10.33.0.0/24", ip_version=4, name=f"{cluster}-subnet")
    with pytest.raises(
        PreflightError, match=rf"network '{cluster}-net' has no router to external network 'public'.*router add subnet R {cluster}-subnet"
    ):
        pf.check(make_spec(network=f"{cluster}-net"))
    router = member.network.create_router(name=f"{cluster}-router",
                                          external_gateway_info={"network_id": member.network.find_network("public").id})
    member.network.add_interface_to_router(router, subnet_id=subnet.id)
    pf.check(make_spec(network=f"{cluster}-net"))


# ---- credentials and reachability ----------------------------------------------------------------


def _clouds_yaml(path, test_cloud, **auth):
    entry = test_cloud.clouds()["clouds"]["testcloud"]
    entry["auth"] |= auth
    path.write_text(yaml.safe_dump({"clouds": {"testcloud": entry}}))


def test_wrong_password(os_env, test_cloud):
    _clouds_yaml(os_env, test_cloud, password="not-the-password")
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec())
    msg = str(e.value)
    assert "refused the credentials of cloud 'testcloud' (HTTP 401)" in msg and "clouds.yaml" in msg
    assert "not-the-password" not in msg


def test_unreachable_auth_url(os_env, test_cloud, capsys):
    with socket.socket() as s:  # a port on 127.0.0.1 that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    password = test_cloud.passwords["researcher"]
    _clouds_yaml(os_env, test_cloud, auth_url=f"http://researcher:{password}@127.0.0.1:{port}/v3")
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec())
    msg = str(e.value)
    assert "cannot reach the OpenStack identity service" in msg and "auth_url" in msg
    assert password not in msg
    assert capsys.readouterr().err == ""


def test_cloud_not_in_clouds_yaml(os_env):
    with pytest.raises(PreflightError, match=r"cloud 'elkh' is not in any clouds.yaml.*OS_CLOUD"):
        pf.check(make_spec(cloud="elkh"))


def test_os_cloud_from_environment(os_env, monkeypatch):
    monkeypatch.setenv("OS_CLOUD", "testcloud")
    assert pf.check(make_spec(cloud=None)).flavor == "m1.large"


def test_a_user_of_another_project_sees_other_things(os_env):
    """The colleague's project: the same cloud, another view (its own network by name)."""
    r = pf.check(make_spec(cloud="testcloud-other", network="lab-shared"))
    assert not any("another project" in w for w in r.warnings)  # its own network, its own router


# ---- quotas: limits set by the admin, usage real ------------------------------------------------------


def test_quota_too_small_names_largest_n(own_project, quotas, cluster):
    quotas.compute(instances=4)
    module_resources.make_cluster(own_project, f"{cluster}x", 1, volume=False, floating_ip=False)  # someone else's server
    try:
        with pytest.raises(PreflightError) as e:
            pf.check(make_spec(nodes=5))
        msg = str(e.value)
        assert "too small for 5 nodes of m1.large" in msg and "instances: need 5, 3 free of 4" in msg
        assert "--nodes 3" in msg and "the largest cluster that fits is 3 nodes" in msg
    finally:
        module_resources.delete_all(own_project, f"{cluster}x")


def test_quota_ram_binds(own_project, quotas):
    quotas.compute(ram=20 * 1024)
    with pytest.raises(PreflightError) as e:
        pf.check(make_spec(nodes=4))
    assert "RAM: need 32 GiB, 20 GiB free" in str(e.value) and "--nodes 2" in str(e.value)


def test_quota_not_even_one_node(own_project, quotas):
    quotas.compute(cores=2)
    with pytest.raises(PreflightError, match="too small for even one node of m1.large"):
        pf.check(make_spec(nodes=2))


def test_quota_shared_resources(own_project, quotas, cluster):
    quotas.network(floatingip=1)
    ip = own_project.network.create_ip(floating_network_id=own_project.network.find_network("public").id,
                                  description=f"deployer {cluster} master")
    with pytest.raises(PreflightError, match=r"floating IPs: need 1, 0 free of 1"):
        pf.check(make_spec())
    pf.check(make_spec(floating_ip=ip.floating_ip_address))  # an existing floating IP needs no new one


def test_quota_volume_gigabytes(own_project, quotas):
    quotas.volume(gigabytes=50)
    with pytest.raises(PreflightError, match=r"volume gigabytes: need 100, 50 free of 50.*volume_size"):
        pf.check(make_spec(volume_size=100))


def test_quota_security_group_rules_count_exposed_ports(own_project, quotas):
    used = len(list(own_project.network.security_group_rules(project_id=own_project.current_project_id)))
    quotas.network(security_group_rule=used + 7)
    pf.check(make_spec())  # 7 rules
    spec = make_spec(monitoring={"enabled": True, "expose": True, "allowed_cidrs": ["203.0.113.0/24", "198.51.100.0/24"]})
    with pytest.raises(PreflightError, match=r"security group rules: need 9, 7 free"):  # Grafana only, from 2 CIDRs
        pf.check(spec)


def test_scale_out_counts_only_new_nodes(own_project, quotas, cluster):
    made = module_resources.make_cluster(own_project, cluster, 2, flavor="m1.large")
    quotas.compute(instances=3)
    r = pf.check(make_spec(cluster, nodes=3), cluster_exists=True, cluster_id=made.id)
    assert r.existing_nodes == [f"{cluster}-master", f"{cluster}-worker-1"]
    with pytest.raises(PreflightError, match=r"too small for 4 nodes of m1.large \(2 exist, 2 to add\).*--nodes 3"):
        pf.check(make_spec(cluster, nodes=4), cluster_exists=True, cluster_id=made.id)


def test_scale_in_on_a_full_project_fits(own_project, quotas, cluster):
    made = module_resources.make_cluster(own_project, cluster, 3, flavor="m1.large")
    quotas.compute(instances=3, cores=12)
    pf.check(make_spec(cluster, nodes=2), cluster_exists=True, cluster_id=made.id)
    pf.check(make_spec(cluster, nodes=3), cluster_exists=True, cluster_id=made.id)  # a plain re-run fits too
    with pytest.raises(PreflightError, match=r"--nodes 3"):
        pf.check(make_spec(cluster, nodes=4), cluster_exists=True, cluster_id=made.id)


def test_a_look_alike_server_of_someone_else_is_other_usage(own_project, quotas, cluster):
    """Named like our master, without our metadata (another tool, another user): it
    takes quota and does not make the cluster exist."""
    flavor = own_project.compute.find_flavor("m1.small")
    net = own_project.network.create_network(name="elsewhere")
    own_project.network.create_subnet(network_id=net.id, cidr="10.40.0.0/24", ip_version=4)
    s = own_project.compute.create_server(name=f"{cluster}-master", flavor_id=flavor.id,
                                     image_id=own_project.image.find_image(IMAGE).id, networks=[{"uuid": net.id}])
    own_project.compute.wait_for_server(s, wait=120)
    quotas.compute(instances=4)
    r = pf.check(make_spec(cluster, nodes=3))
    assert r.existing_nodes == []
    with pytest.raises(PreflightError, match=r"too small for 4 nodes of m1.large.*--nodes 3"):
        pf.check(make_spec(cluster, nodes=4))


def test_boot_volumes_count_against_the_volume_quotas(own_project, quotas):
    # 4 nodes x 20 GiB boot volumes + the 100 GiB shared volume = 180 GiB, 5 volumes.
    quotas.volume(volumes=5, gigabytes=500)
    pf.check(make_spec(nodes=4, root_volume_size=20))
    with pytest.raises(PreflightError, match=r"volumes: need 6, 5 free.*--nodes 4"):
        pf.check(make_spec(nodes=5, root_volume_size=20))


def test_unlimited_quotas(own_project, quotas):
    quotas.compute(instances=-1, cores=-1, ram=-1)
    pf.check(make_spec(nodes=64))


# ---- GPUs -----------------------------------------------------------------------------------------


def test_vgpu_flavor_sets_gpus_per_node(os_env, state):
    """g1.vgpu asks placement for resources:VGPU=1 (the compute node's child provider)."""
    provider = OpenStackProvider()
    spec = make_spec(flavor="g1.vgpu", enable_gpu=True, nodes=2)
    checked = provider.preflight(spec, state)
    assert checked.gpus_per_node == 1 and provider.tfvars(spec, state, checked)["gpus_per_node"] == 1
    # The flavor's word on how the GPU comes, for the driver role (which cannot tell before a driver).
    assert spec.openstack.gpu_virtualization == "vgpu"
    told = make_spec(flavor="g1.vgpu", enable_gpu=True, nodes=2, gpu_virtualization="passthrough")
    warnings = provider.preflight(told, state).warnings
    assert told.openstack.gpu_virtualization == "passthrough" and any("the spec's word is taken" in w for w in warnings)
    # With a baked image (`image:`) the preflight checks a copy of the settings: the flavor's word still reaches the spec
    baked = make_spec(flavor="g1.vgpu", enable_gpu=True, nodes=2).model_copy(update={"image": IMAGE})
    provider.preflight(baked, state)
    assert baked.openstack.gpu_virtualization == "vgpu"


def test_a_vgpu_server_is_scheduled_on_the_child_provider(os_env, member, admin, cluster):
    made = module_resources.make_cluster(member, cluster, 1, flavor="g1.vgpu", volume=False, floating_ip=False)
    server = made.servers[f"{cluster}-master"]
    resp = admin.session.get(f"/allocations/{server.id}", endpoint_filter={"service_type": "placement"})
    allocations = resp.json()["allocations"]
    assert any("VGPU" in a["resources"] for a in allocations.values()), allocations


def test_gpu_flavor_without_enable_gpu_warns(os_env):
    r = pf.check(make_spec(flavor="g1.vgpu"))
    assert r.gpus_per_node == 0 and any("enable_gpu is false" in w for w in r.warnings)


def test_enable_gpu_on_cpu_flavor_warns(os_env, state, capsys):
    OpenStackProvider().preflight(make_spec(enable_gpu=True), state)
    err = capsys.readouterr().err
    assert "warning:" in err and "asks for no GPU" in err and "m1.large" in err


def test_resumed_cluster_needs_no_shared_resources_again(own_project, quotas, cluster):
    """Terraform's state has the network, volume and floating IP but no server yet (an
    interrupted first apply): those are not needed a second time."""
    quotas.network(floatingip=1)
    own_project.network.create_ip(floating_network_id=own_project.network.find_network("public").id,
                                  description=f"deployer {cluster} master")
    with pytest.raises(PreflightError, match="floating IPs: need 1"):
        pf.check(make_spec(cluster))
    pf.check(make_spec(cluster), cluster_exists=True)


@pytest.fixture
def diskless_flavor(admin, cluster):
    """A GPU-like flavor with no root disk (common on GPU clouds), made for one test."""
    flavor = admin.compute.create_flavor(name=f"{cluster}.nodisk", vcpus=2, ram=2048, disk=0, is_public=True)
    admin.compute.create_flavor_extra_specs(flavor, {"resources:VGPU": "1"})
    yield flavor.name
    admin.compute.delete_flavor(flavor)


def test_flavor_without_root_disk_asks_for_boot_from_volume(os_env, diskless_flavor):
    with pytest.raises(
        PreflightError, match=rf"flavor '{diskless_flavor}' has no root disk \(0 GB\): boot from a volume with openstack.root_volume_size"
    ):
        pf.check(make_spec(flavor=diskless_flavor, enable_gpu=True))
    pf.check(make_spec(flavor=diskless_flavor, enable_gpu=True, root_volume_size=100))


def test_image_larger_than_the_root_disk(os_env, member, cluster):
    image = member.image.create_image(name=f"{cluster}-big", disk_format="raw", container_format="bare", data=b"x" * 512,
                                      min_disk=100)
    try:
        with pytest.raises(PreflightError, match="set openstack.root_volume_size to 100 or more"):
            pf.check(make_spec(image=image.name, root_volume_size=40))
        with pytest.raises(PreflightError, match=r"needs a 100 GB root disk, flavor 'm1.large' has 80 GB.*root_volume_size: 100"):
            pf.check(make_spec(image=image.name))
    finally:
        member.image.delete_image(image)


def test_without_admin_cidr_behind_nat_the_spec_must_say(own_project):
    """The test cloud answers on 127.0.0.1: the address this machine reaches it from is not
    public, so there is no address to default SSH to; the preflight asks, and makes nothing."""
    spec = make_spec(admin_cidr=None)
    with pytest.raises(PreflightError) as e:
        pf.check(spec)
    msg = str(e.value)
    assert msg.startswith("openstack.admin_cidr is not set and this machine's address toward the cloud (127.0.0.1) is not "
                          "a public one"), msg
    assert "admin_cidr: 203.0.113.7/32" in msg and "\n" not in msg
