"""A 32-node cluster's servers on the test cloud (fake virt driver, m1.small) through
preflight, observe, repair, gc and the master's teardown, with the API requests each
makes counted at the SDK (keystoneauth's session, every request and retry, version
discovery and tokens included): they must grow at most linearly with N, which a
per-server listing inside a per-server loop would break (32 nodes: 4x the requests of 8
would become 16x). 64 nodes measured the same (docs/openstack.md, "Scale"); 32 keep CI's time.

The counts are printed (`pytest -s`) and kept in docs/openstack.md.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from datetime import timedelta

import pytest

from deployer import gc
from deployer.lifetime import iso, now
from deployer.providers.openstack import preflight as pf
from deployer.providers.openstack.observe import observe, session
from deployer.providers.openstack.provider import OpenStackProvider
from deployer.providers.openstack.teardown import teardown

from . import module_resources
from .test_preflight import make_spec

ENV = {"OS_CLOUD": "testcloud"}
SIZES = (8, 32)


@contextlib.contextmanager
def counted():
    """Every HTTP request keystoneauth sends meanwhile, by method."""
    from keystoneauth1 import session as ks

    counts: Counter[str] = Counter()
    original = ks.Session.request

    def request(self, url, method, *a, **kw):
        counts[method] += 1
        return original(self, url, method, *a, **kw)

    ks.Session.request = request
    try:
        yield counts
    finally:
        ks.Session.request = original


@pytest.fixture(scope="module")
def clusters(test_cloud, admin, tmp_path_factory):
    """Two clusters of 8 and 32 nodes in a project of their own, expired an hour ago."""
    import secrets
    import uuid

    from . import catalog

    name = f"s{uuid.uuid4().hex[:6]}"
    password = secrets.token_urlsafe(12)
    idn = admin.identity
    project = idn.create_project(name=name, domain_id="default")
    user = idn.create_user(name=name, password=password, domain_id="default", default_project_id=project.id)
    idn.assign_project_role_to_user(project, user, idn.find_role("member"))
    admin.set_compute_quotas(project.id, instances=100, cores=200, ram=100 * 1024)
    conn = catalog.connect_as(test_cloud, name, password, name)
    expired = iso(now() - timedelta(hours=1))
    made = {}
    try:
        for i, n in enumerate(SIZES):
            made[n] = module_resources.make_cluster(conn, f"{name}n{n}", n, expires_at=expired, cidr=f"192.168.{80 + i}.0/24")
        yield {"conn": conn, "made": made, "user": name, "password": password, "project": name}
    finally:
        module_resources.wipe_project(conn)
        conn.close()
        idn.delete_user(user)
        idn.delete_project(project)


@pytest.fixture
def scale_env(clusters, os_env):
    import yaml

    data = yaml.safe_load(os_env.read_text())
    data["clouds"]["testcloud"]["auth"] |= {"username": clusters["user"], "password": clusters["password"],
                                            "project_name": clusters["project"]}
    os_env.write_text(yaml.safe_dump(data))
    return clusters


def _per_size(measure) -> dict[int, int]:
    counts = {}
    for n in SIZES:
        with counted() as c:
            measure(n)
        counts[n] = sum(c.values())
    return counts


def _linear(what: str, counts: dict[int, int]) -> None:
    small, large = SIZES
    print(f"\n{what}: requests at N={small}: {counts[small]}, N={large}: {counts[large]}")
    assert counts[large] <= counts[small] * large / small, f"{what} grows faster than N: {counts}"


def test_preflight_and_observe_at_scale(scale_env):
    made = scale_env["made"]

    def preflight(n):
        r = pf.check(make_spec(made[n].name, nodes=n, flavor="m1.small"), cluster_exists=True, cluster_id=made[n].id)
        assert len(r.existing_nodes) == n

    def look(n):
        seen = observe(made[n].name, made[n].id, ENV, list(made[n].servers))
        assert all(m.state == "running" for m in seen.nodes.values())

    _linear("preflight", _per_size(preflight))
    _linear("observe", _per_size(look))


def test_repair_at_scale(scale_env, state):
    """Every node stopped, then repaired: one action each."""
    conn, made = scale_env["conn"], scale_env["made"]
    for n in SIZES:
        for s in made[n].servers.values():
            conn.compute.stop_server(s)
        for s in made[n].servers.values():
            conn.compute.wait_for_server(s, status="SHUTOFF", wait=300)

    def repair(n):
        seen = observe(made[n].name, made[n].id, ENV, list(made[n].servers))
        fix = OpenStackProvider().repair(make_spec(made[n].name, nodes=n, flavor="m1.small"), state, {}, seen)
        assert len(fix.started) == n

    _linear("observe + repair", _per_size(repair))
    for n in SIZES:
        for s in made[n].servers.values():
            conn.compute.wait_for_server(s, status="ACTIVE", wait=300)


def test_gc_listing_and_the_masters_teardown_at_scale(scale_env, tmp_path):
    made = scale_env["made"]
    with counted() as c:
        found = gc.find(tmp_path / "no-state", "testcloud", now())
    assert {e.name for e in found} >= {made[n].name for n in SIZES}
    print(f"\ngc listing ({sum(len(made[n].servers) for n in SIZES)} servers): {sum(c.values())} requests")
    assert sum(c.values()) < 20

    def master_teardown(n):
        with session(ENV) as conn:
            ids = [s.id for s in made[n].servers.values()]
            gone = teardown(conn, made[n].name, made[n].id, ids[0], ids[1:], now(), say=lambda _: None)
        assert len(gone) == n

    _linear("the master's teardown (delete and wait)", _per_size(master_teardown))
