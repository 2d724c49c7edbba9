"""What makes the started services a cloud: the catalog and service users, then the
projects, users, networks, flavors and image a research cloud would offer.

Done through openstacksdk as the admin (the bootstrap user), except what a project's own
member would make (the colleague's shared network), which that member makes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .services import CATALOG, COMPUTE_HOST, COMPUTE_HOSTS, FLAVORS, IMAGE, compute_process
from .testcloud import OTHER_PROJECT, OTHER_USER, PROJECT, REGION, SERVICES_PROJECT, USER, log, wait_for

if TYPE_CHECKING:
    from .testcloud import Cloud, Launcher

SERVICE_USERS = ["service"]
EXTERNAL_NET, EXTERNAL_CIDR = "public", "203.0.113.0/24"
SHARED_NET, SHARED_CIDR = "lab-shared", "10.20.0.0/24"
IMAGE_BYTES = b"not a real disk: Nova's fake driver never reads it\n" * 64


def connect(cloud: Cloud, user: str = "admin", project: str = "admin"):
    return connect_as(cloud, user, cloud.passwords["service" if user in SERVICE_USERS else user], project)


def connect_as(cloud: Cloud, user: str, password: str, project: str):
    import openstack

    # Only these arguments: no clouds.yaml or OS_* variable of the machine (or of a test) is read.
    return openstack.connect(load_yaml_config=False, load_envvars=False, auth_url=cloud.auth_url, username=user,
                             password=password, project_name=project, user_domain_name="Default",
                             project_domain_name="Default", region_name=REGION, identity_api_version="3")


def register_services(cloud: Cloud) -> None:
    """The service user and every service's endpoint (Keystone's own came with bootstrap)."""
    conn = wait_for("Keystone token", lambda: _token(cloud), timeout=120)
    idn = conn.identity
    service_project = idn.create_project(name=SERVICES_PROJECT, domain_id="default")
    admin_role = idn.find_role("admin")
    service_role = idn.find_role("service") or idn.create_role(name="service")  # bootstrap makes it since 2024.1
    user = idn.create_user(name="service", password=cloud.passwords["service"], domain_id="default",
                           default_project_id=service_project.id)
    # As DevStack: admin and service roles on the service project (Nova binds ports,
    # Neutron tells Nova of port events, Cinder attaches: each needs the service role).
    for role in (admin_role, service_role):
        idn.assign_project_role_to_user(service_project, user, role)
    for name, type_, port, path in CATALOG:
        if type_ == "identity":
            continue
        svc = idn.create_service(name=name, type=type_)
        for interface in ("public", "internal", "admin"):
            idn.create_endpoint(service_id=svc.id, interface=interface, url=cloud.url(port) + path, region_id=REGION)


def _token(cloud: Cloud):
    conn = connect(cloud)
    conn.session.get_token()
    return conn


def populate(cloud: Cloud, launch: Launcher) -> None:
    conn = connect(cloud)
    idn = conn.identity
    member = idn.find_role("member")
    for project, user in ((PROJECT, USER), (OTHER_PROJECT, OTHER_USER)):
        p = idn.create_project(name=project, domain_id="default")
        u = idn.create_user(name=user, password=cloud.passwords[user], domain_id="default", default_project_id=p.id)
        idn.assign_project_role_to_user(p, u, member)

    log("waiting for the compute hosts and the volume service")
    computes = [compute_process(i) for i in range(len(COMPUTE_HOSTS))]
    wait_for("every nova-compute's hypervisor", lambda: len(list(conn.compute.hypervisors())) >= len(COMPUTE_HOSTS),
             timeout=240, procs={n: cloud.pids[n] for n in (*computes, "nova-conductor", "nova-scheduler")})
    wait_for("the VGPU provider in placement", lambda: _vgpu_provider(conn), timeout=120)
    cinder = {n: cloud.pids[n] for n in ("cinder-volume", "cinder-scheduler")}
    wait_for("cinder-volume", lambda: any(s.binary == "cinder-volume" and s.state == "up"
                                          for s in conn.block_storage.services()), timeout=180, procs=cinder)
    # A volume service that is up (its heartbeat) is not yet a place for a volume: the
    # scheduler learns the backend's pool from the service's capabilities report, a periodic
    # task of its own, and a volume asked for before that goes to `error` (no valid backend)
    # once the scheduler's start-up wait (service_down_time) is over. Seen in CI under load:
    # the first test's shared volume, 3 s after the cloud said it was ready. The pools the
    # scheduler lists are what it places volumes on.
    t = time.monotonic()
    wait_for("the volume scheduler's backend pool", lambda: any(True for _ in conn.block_storage.backend_pools()),
             timeout=180, procs=cinder)
    log(f"the volume scheduler has a backend pool ({time.monotonic() - t:.0f} s after cinder-volume was up)")

    for name, f in FLAVORS.items():
        flavor = conn.compute.create_flavor(name=name, vcpus=f["vcpus"], ram=f["ram"], disk=f["disk"], is_public=True)
        if f.get("extra_specs"):
            conn.compute.create_flavor_extra_specs(flavor, f["extra_specs"])

    image = conn.image.create_image(name=IMAGE, disk_format="raw", container_format="bare", visibility="public",
                                    data=IMAGE_BYTES, allow_duplicates=True)
    wait_for("the image", lambda: conn.image.get_image(image.id).status == "active", timeout=60)

    ext = conn.network.create_network(name=EXTERNAL_NET, is_router_external=True, provider_network_type="flat",
                                      provider_physical_network="public")
    conn.network.create_subnet(network_id=ext.id, name=f"{EXTERNAL_NET}-subnet", cidr=EXTERNAL_CIDR, ip_version=4,
                               enable_dhcp=False, gateway_ip="203.0.113.1")

    # A colleague's project shares its network with ours, its router with it: a member
    # of our project sees the network, never the router (Neutron's default policy).
    other = connect(cloud, OTHER_USER, OTHER_PROJECT)
    net = other.network.create_network(name=SHARED_NET)
    subnet = other.network.create_subnet(network_id=net.id, name=f"{SHARED_NET}-subnet", cidr=SHARED_CIDR, ip_version=4)
    router = other.network.create_router(name="lab-router", external_gateway_info={"network_id": ext.id})
    other.network.add_interface_to_router(router, subnet_id=subnet.id)
    ours = idn.find_project(PROJECT)
    other.network.create_rbac_policy(object_type="network", object_id=net.id, action="access_as_shared",
                                     target_project_id=ours.id)
    for c in (conn, other):
        c.close()


def _vgpu_provider(conn) -> bool:
    resp = conn.session.get("/resource_providers?resources=VGPU:1", endpoint_filter={"service_type": "placement"},
                            headers={"OpenStack-API-Version": "placement 1.14"})
    rps = resp.json()["resource_providers"]
    return any(rp.get("parent_provider_uuid") and rp["name"].startswith(COMPUTE_HOST) for rp in rps)
