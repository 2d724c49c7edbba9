"""terraform/openstack applied for real: the OpenStack provider v3.4.0 built from the Go
module proxy (`make provider`: a filesystem mirror) against the test cloud, through the
deployer's own verbs as a user runs them (`python -m deployer up --no-setup`, `status`,
`down --yes`), and what was made checked in the cloud's own answers (openstacksdk as the
project's member), not in Terraform's.

The test cloud's servers never boot (Nova's fake virt driver: ACTIVE without a guest), so
`up --no-setup` is what runs: Terraform, the cluster output, known_hosts, ssh_config,
the inventory; no boot wait, no Ansible, no check.

Each test has a project of its own (conftest.own_project), wiped afterwards whatever the
test left. The seconds each verb took are printed (`pytest -s`) and kept in
docs/openstack.md ("Applied for real").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.tools import terraform

from . import module_resources
from .services import IMAGE

pytestmark = pytest.mark.cloud

MIRROR = Path(os.environ.get(terraform.MIRROR_ENV) or "/var/cache/deployer/terraform-plugins")


def _mirror_problem() -> str | None:
    """Why the mirror cannot serve terraform/openstack (None: it can)."""
    from deployer.errors import UsageError

    try:
        terraform.check_mirror(MIRROR, "mirror", "openstack")
    except UsageError as e:
        return str(e)
    return None


@pytest.fixture(autouse=True)
def _needs_the_built_provider():
    problem = _mirror_problem()
    if problem:
        pytest.skip(f"no usable terraform-provider-openstack in {MIRROR} ({problem}); `make provider` builds it")


ADMIN_CIDR = "203.0.113.0/24"  # the test cloud is on 127.0.0.1: no public address to default to
CIDR = "192.168.77.0/24"


def write_spec(path: Path, name: str, nodes: int = 3, **openstack: Any) -> Path:
    spec = {
        "name": name, "provider": "openstack", "nodes": nodes,
        "openstack": {"cloud": "testcloud", "flavor": "m1.small", "image": IMAGE, "external_network": "public",
                      "admin_cidr": ADMIN_CIDR, "volume_size": 1, "network_cidr": CIDR, **openstack},
        "terraform": {"plugin_mirror": str(MIRROR)},
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class Verb:
    """`python -m deployer ...` in the test's directory, as a user runs it: the seconds it
    took and, when `count_requests`, the HTTP requests the provider sent (its debug log,
    TF_LOG=DEBUG: gophercloud logs each as `OpenStack Request URL: METHOD URL`)."""

    def __init__(self, cwd: Path, services: dict[str, int], count_requests: bool = False):
        self.cwd = cwd
        self.services = {str(port): name for name, port in services.items()}  # the test cloud's port -> service
        self.count_requests = count_requests
        self.seconds: dict[str, float] = {}
        self.requests: dict[str, dict[str, int]] = {}

    def __call__(self, *args: str, ok: bool = True, label: str | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        log = self.cwd / f"tf-debug-{len(self.seconds)}.log"
        if self.count_requests and label:
            log.unlink(missing_ok=True)
            env |= {"TF_LOG": "DEBUG", "TF_LOG_PATH": str(log)}
        began = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "deployer", *args], cwd=self.cwd, text=True, capture_output=True,
                           timeout=timeout, stdin=subprocess.DEVNULL, env=env)
        took = time.monotonic() - began
        if label:
            self.seconds[label] = took
            if self.count_requests and log.exists():
                self.requests[label] = requests_in(log.read_text(errors="replace"), self.services)
        print(f"\n$ deployer {' '.join(args)}  ({took:.1f}s, exit {p.returncode})\n{p.stderr[-4000:]}")
        if ok:
            assert p.returncode == 0, f"deployer {' '.join(args)} failed:\n{p.stderr[-6000:]}"
        return p

    def json(self, *args: str, label: str | None = None) -> dict[str, Any]:
        return json.loads(self(*args, "--json", label=label).stdout)


def requests_in(log: str, services: dict[str, str]) -> dict[str, int]:
    """The provider's requests in a Terraform debug log, by service (told by the test
    cloud's port) and method; keystone's token requests included."""
    import re
    from collections import Counter

    found = Counter(f"{services.get(m.group(2), m.group(2))} {m.group(1)}" for m in
                    re.finditer(r"OpenStack Request URL: (\w+) https?://[^:/]+:(\d+)", log))
    return dict(sorted(found.items())) | {"total": sum(found.values())}


@pytest.fixture
def deployer(own_project, test_cloud, tmp_path) -> Verb:
    return Verb(tmp_path, test_cloud.ports)


def state_dir(cwd: Path, name: str) -> Path:
    return cwd / ".deployer" / name


def cluster_id(cwd: Path, name: str) -> str:
    return json.loads((state_dir(cwd, name) / "origin.json").read_text())["cluster_id"]


def servers(conn: Any, name: str) -> dict[str, Any]:
    return {s.name: s for s in conn.compute.servers(details=True, name=f"^{name}-")
            if (s.metadata or {}).get("deployer_cluster") == name}


def wait_status(conn: Any, server: Any, status: str, wait: int = 120) -> Any:
    return conn.compute.wait_for_server(conn.compute.get_server(server.id), status=status, failures=["ERROR"], wait=wait)


def check_made(conn: Any, cwd: Path, name: str, nodes: int) -> dict[str, Any]:
    """Everything terraform/openstack declares, found in the cloud's own answers, and the
    records `up --no-setup` writes: the cluster output, known_hosts, ssh_config, inventory."""
    cid = cluster_id(cwd, name)
    tag = f"deployer-id-{cid}"
    net = conn.network
    ext = net.find_network("public", ignore_missing=False)

    (network,) = [n for n in net.networks(tags=tag)]
    assert network.name == f"{name}-net" and set(network.tags) >= {"deployer", f"deployer-cluster-{name}", tag}
    (subnet,) = list(net.subnets(network_id=network.id))
    assert subnet.name == f"{name}-subnet" and subnet.cidr == CIDR and subnet.is_dhcp_enabled and tag in subnet.tags
    (router,) = [r for r in net.routers(tags=tag)]
    assert router.name == f"{name}-router" and router.external_gateway_info["network_id"] == ext.id
    interfaces = list(net.ports(device_id=router.id, device_owner="network:router_interface"))
    assert [ip["subnet_id"] for p in interfaces for ip in p.fixed_ips] == [subnet.id]

    groups = {g.name: g for g in net.security_groups(tags=tag)}
    assert set(groups) == {f"{name}-cluster", f"{name}-master"}
    cluster_group, master_group = groups[f"{name}-cluster"], groups[f"{name}-master"]
    internal = [r for r in net.security_group_rules(security_group_id=cluster_group.id) if r.direction == "ingress"]
    assert sorted((r.ether_type, r.remote_group_id, r.protocol) for r in internal) == [
        ("IPv4", cluster_group.id, None), ("IPv6", cluster_group.id, None)]
    ssh = [r for r in net.security_group_rules(security_group_id=master_group.id) if r.direction == "ingress"]
    assert [(r.protocol, r.port_range_min, r.port_range_max, r.remote_ip_prefix) for r in ssh] == [("tcp", 22, 22, ADMIN_CIDR)]

    key = conn.compute.find_keypair(f"{name}-key-{cid}", ignore_missing=True)
    assert key is not None and key.public_key.strip() == (state_dir(cwd, name) / "ssh" / "id_ed25519.pub").read_text().strip()

    found = servers(conn, name)
    names = [f"{name}-master"] + [f"{name}-worker-{i}" for i in range(1, nodes)]
    assert sorted(found) == sorted(names)
    flavor = conn.compute.find_flavor("m1.small", ignore_missing=False)
    for i, n in enumerate(names):
        s = found[n]
        assert s.status == "ACTIVE", (n, s.status)
        assert s.metadata["deployer_cluster_id"] == cid and s.metadata["deployer_index"] == str(i)
        assert s.metadata["deployer_role"] == ("master" if i == 0 else "worker")
        assert s.key_name == key.name and s.flavor.original_name == flavor.name
        (port,) = list(net.ports(device_id=s.id))
        assert port.name == f"{n}-port" and tag in port.tags
        want = {cluster_group.id, master_group.id} if i == 0 else {cluster_group.id}
        assert set(port.security_group_ids) == want

    master = found[f"{name}-master"]
    (volume,) = [v for v in conn.block_storage.volumes() if (v.metadata or {}).get("deployer_cluster_id") == cid]
    assert volume.name == f"{name}-shared" and volume.size == 1 and volume.status == "in-use"
    assert [a["server_id"] for a in volume.attachments] == [master.id]
    assert [a.volume_id for a in conn.compute.volume_attachments(master)] == [volume.id]

    (fip,) = list(net.ips(tags=tag))
    (master_port,) = list(net.ports(device_id=master.id))
    assert fip.port_id == master_port.id and fip.floating_network_id == ext.id

    # What the deployer recorded from the `cluster` output agrees with the cloud.
    st = state_dir(cwd, name)
    out = json.loads((st / "cluster.json").read_text())
    assert [n["name"] for n in out["nodes"]] == names
    assert {n["name"]: n["id"] for n in out["nodes"]} == {n: found[n].id for n in names}
    assert out["nodes"][0]["public_ip"] == fip.floating_ip_address
    assert out["shared_device"] == f"/dev/disk/by-id/virtio-{volume.id[:20]}" and out["cluster_cidr"] == CIDR
    for n in out["nodes"]:
        (port,) = list(net.ports(device_id=found[n["name"]].id))
        assert n["private_ip"] == port.fixed_ips[0]["ip_address"]
    assert fip.floating_ip_address in (st / "ssh" / "known_hosts").read_text()
    assert f"Host {name}-worker-1" in (st / "ssh" / "config").read_text()
    assert (st / "inventory" / "hosts.yml").is_file() and len((st / "inventory" / "hostfile").read_text().splitlines()) == nodes
    return {"servers": found, "volume": volume, "fip": fip, "network": network}


def nothing_left(conn: Any, cwd: Path, name: str, cid: str) -> None:
    """The proof after `down`: nothing of the cluster by name, and nothing by its id."""
    assert module_resources.leftovers(conn, name) == []
    tag = f"deployer-id-{cid}"
    assert [x for kind in (conn.network.networks, conn.network.ports, conn.network.routers, conn.network.ips,
                           conn.network.security_groups) for x in kind(tags=tag)] == []
    assert [v for v in conn.block_storage.volumes() if (v.metadata or {}).get("deployer_cluster_id") == cid] == []
    assert sorted(p.name for p in state_dir(cwd, name).iterdir()) == ["lock", "runs"]  # `down` keeps the logs


def test_up_no_setup_status_rerun_down(own_project, deployer, tmp_path, cluster_name):
    """The issue's first real apply: 3 nodes, every resource checked, `status`, a re-run
    that changes nothing, `down --yes` and nothing left."""
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c)
    made = deployer.json("up", "--provider", "openstack", "--nodes", "3", "--no-setup", label="up 3")
    assert made["setup"] is False and made["converged"] is False
    assert not (state_dir(tmp_path, c) / "configured.json").exists()
    assert not list(state_dir(tmp_path, c).glob("runs/*/ansible*"))
    check_made(conn, tmp_path, c, 3)
    print(f"\nup --no-setup of 3 nodes: {made['timings']}")

    status = deployer.json("status")
    # Running, never configured (--no-setup): not "ok", not "missing" or "stopped".
    assert [n["state"] for n in status["nodes"]] == ["new (needs configure)"] * 3
    assert status["extra"] == []

    again = deployer.json("up", "--no-setup", label="re-run")
    assert again["converged"] is True, again
    log = Path(again["run_dir"]) / "terraform.jsonl"
    summary = [json.loads(line) for line in log.read_text().splitlines() if '"change_summary"' in line]
    assert summary and {k: summary[-1]["changes"].get(k) for k in ("add", "change", "remove")} == {
        "add": 0, "change": 0, "remove": 0}, summary

    cid = cluster_id(tmp_path, c)
    deployer("down", "--yes", label="down 3")
    nothing_left(conn, tmp_path, c, cid)
    print(f"\nfigures (3 nodes, seconds, wall): {json.dumps({k: round(v, 1) for k, v in deployer.seconds.items()})}")


def test_scale_out_and_in(own_project, deployer, tmp_path, cluster_name):
    """3 -> 5 -> 3: the survivors keep their servers (for_each by name), the new workers
    join with their ports, the highest go; the master's volume and floating IP stay."""
    conn, c = own_project, cluster_name
    deployer.count_requests = True  # the figures in docs/openstack.md; test_up_no_setup_... times without the log
    write_spec(tmp_path / "cluster.yaml", c)
    deployer("up", "--no-setup", label="up 3")
    deployer("up", "--no-setup", label="re-run 3")  # the refresh alone: what scaling out adds to it is per node
    first = {n: s.id for n, s in servers(conn, c).items()}
    deployer("up", "--nodes", "5", "--no-setup", label="up 5")
    five = check_made(conn, tmp_path, c, 5)
    assert {n: five["servers"][n].id for n in first} == first
    refused = deployer("up", "--nodes", "3", "--no-setup", ok=False)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    deployer("up", "--nodes", "3", "--no-setup", "--yes", label="down to 3")
    three = check_made(conn, tmp_path, c, 3)
    assert {n: s.id for n, s in three["servers"].items()} == first
    assert three["volume"].id == five["volume"].id and three["fip"].id == five["fip"].id
    cid = cluster_id(tmp_path, c)
    deployer("down", "--yes", label="down 3")
    nothing_left(conn, tmp_path, c, cid)
    print(f"\nfigures with TF_LOG=DEBUG (seconds, wall): {json.dumps({k: round(v, 1) for k, v in deployer.seconds.items()})}"
          f"\nthe provider's requests: {json.dumps(deployer.requests, indent=1)}")


@pytest.mark.parametrize("action, status", [("stop_server", "SHUTOFF"), ("suspend_server", "SUSPENDED"),
                                            ("pause_server", "PAUSED"), ("shelve_server", "SHELVED_OFFLOADED")])
def test_a_node_stopped_outside_converges(own_project, deployer, tmp_path, cluster_name, action, status):
    """A worker stopped, suspended, paused or shelved outside the deployer: a plain
    `up --no-setup` brings it back and Terraform applies on top (the provider's Read
    refuses SUSPENDED; its Update would Start a server Nova is still moving), and `down`
    of a cluster with such a node works too."""
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, nodes=2)
    deployer("up", "--no-setup")
    worker = servers(conn, c)[f"{c}-worker-1"]
    getattr(conn.compute, action)(worker)
    wait_status(conn, worker, status)
    again = deployer.json("up", "--no-setup")
    assert again["started"] == [f"{c}-worker-1"] and again["recreated"] == []
    after = servers(conn, c)
    assert after[f"{c}-worker-1"].id == worker.id and after[f"{c}-worker-1"].status == "ACTIVE"
    # down of a cluster with a node in that state
    getattr(conn.compute, action)(after[f"{c}-worker-1"])
    wait_status(conn, worker, status)
    cid = cluster_id(tmp_path, c)
    deployer("down", "--yes")
    nothing_left(conn, tmp_path, c, cid)


def test_replace_one_node(own_project, deployer, tmp_path, cluster_name):
    """`up --replace worker-1 --no-setup`: that server made anew (a new id, its port
    kept), the master untouched."""
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, nodes=2)
    deployer("up", "--no-setup")
    before = {n: s.id for n, s in servers(conn, c).items()}
    result = deployer.json("up", "--no-setup", "--replace", "worker-1")
    assert result["recreated"] == [f"{c}-worker-1"]
    after = {n: s.id for n, s in servers(conn, c).items()}
    assert after[f"{c}-master"] == before[f"{c}-master"] and after[f"{c}-worker-1"] != before[f"{c}-worker-1"]
    out = json.loads((state_dir(tmp_path, c) / "cluster.json").read_text())
    assert {n["name"]: n["id"] for n in out["nodes"]} == after
    cid = cluster_id(tmp_path, c)
    deployer("down", "--yes")
    nothing_left(conn, tmp_path, c, cid)


# ---- issue 43, items 2-6: what the provider and Neutron answer -------------------------------------------------


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "terraform.jsonl").read_text().splitlines() if line.startswith("{")]


def _plan_by_hand(cwd: Path, name: str, **tfvars: Any) -> subprocess.CompletedProcess:
    """`terraform plan -detailed-exitcode` in the cluster's own working dir, with its
    recorded variables changed by `tfvars`, as someone running Terraform by hand would:
    exit 0 when Terraform plans no change, 2 when it plans one (an output's value too)."""
    work = state_dir(cwd, name) / "terraform" / "openstack"
    values = json.loads((work / "terraform.tfvars.json").read_text()) | tfvars
    (work / "by-hand.tfvars.json").write_text(json.dumps(values))
    origin = json.loads((state_dir(cwd, name) / "origin.json").read_text())
    env = {**os.environ, **origin["terraform_env"], "CHECKPOINT_DISABLE": "1",
           "TF_CLI_CONFIG_FILE": str(work.parent / terraform.CLI_CONFIG)}
    binary = os.environ.get("DEPLOYER_TERRAFORM") or "terraform"
    p = subprocess.run([binary, "plan", "-detailed-exitcode", "-no-color", "-input=false", "-lock=false",
                        "-var-file=by-hand.tfvars.json"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    print(f"\n$ terraform plan (by hand)  exit {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-2000:]}")
    return p


def test_a_flavor_change_is_refused_and_never_a_resize(own_project, admin, deployer, tmp_path, cluster_name):
    """Item 2: the provider updates flavor_id in place (resize, then confirm) on a running
    server. Here: `up` with another flavor stops in one line, exit 2, before anything
    happens; Terraform itself, run by hand on the cluster's working dir with the new
    flavor, plans no change; `--replace` of every node makes them anew with it, the plan
    said first; no server was ever resized (Nova's migrations list none)."""
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, nodes=2)
    deployer("up", "--no-setup")
    before = {n: s.id for n, s in servers(conn, c).items()}
    large = conn.compute.find_flavor("m1.large", ignore_missing=False)

    write_spec(tmp_path / "cluster.yaml", c, nodes=2, flavor="m1.large")
    refused = deployer("up", "--no-setup", ok=False)
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.returncode == 2 and len([x for x in lines if x.startswith("error:")]) == 1, refused.stderr
    assert f"--replace {c}-master --replace {c}-worker-1" in refused.stderr and "a new cluster" in refused.stderr
    now = servers(conn, c)
    assert {n: s.id for n, s in now.items()} == before
    assert {s.flavor.original_name for s in now.values()} == {"m1.small"} and {s.status for s in now.values()} == {"ACTIVE"}

    # The module's own guard: Terraform by hand with the new flavor's ID plans nothing.
    plan = _plan_by_hand(tmp_path, c, flavor_id=large.id, flavor_name="m1.large")
    # At most the `cluster` output's flavor (it names the spec's); no resource action at all.
    assert plan.returncode in (0, 2) and "Plan:" not in plan.stdout, "Terraform planned a resource change for a new flavor"
    assert plan.returncode == 0 or "without changing any real infrastructure" in plan.stdout, plan.stdout[-2000:]

    replaced = deployer("up", "--no-setup", "--replace", "master", "--replace", "worker-1", "--json")
    made = json.loads(replaced.stdout)
    said = " ".join(replaced.stderr.split())
    plan_at = said.index(f"flavor change m1.small → m1.large: {c}-master, {c}-worker-1 will be deleted and made anew")
    assert plan_at < said.index("terraform: provisioning nodes"), "the plan is said before anything happens"
    after = servers(conn, c)
    assert sorted(made["recreated"]) == sorted(before) and all(after[n].id != before[n] for n in before)
    assert {s.flavor.original_name for s in after.values()} == {"m1.large"}
    # Nova records every resize as a migration (the admin's os-migrations): none of these servers.
    ids = set(before.values()) | {s.id for s in after.values()}
    assert [m for m in admin.compute.migrations() if m.server_id in ids] == []
    cid = cluster_id(tmp_path, c)
    deployer("down", "--yes")
    nothing_left(conn, tmp_path, c, cid)


def test_nodes_have_a_config_drive_made_after_the_router_and_the_clouds_dns(own_project, deployer, tmp_path, cluster_name):
    """Items 3 and 4: every server has a config drive (Nova's record), none was started
    before the router interface was complete (Terraform's own event log), and the subnet
    names no DNS server: the nodes get the cloud's own. One named in the spec is set."""
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, nodes=2)
    made = deployer.json("up", "--no-setup")
    for s in servers(conn, c).values():
        assert str(s.has_config_drive).lower() in ("true", "1"), (s.name, s.has_config_drive)
    events = _events(Path(made["run_dir"]))
    addr = lambda e: e.get("hook", {}).get("resource", {}).get("addr", "")  # noqa: E731
    done = next(i for i, e in enumerate(events) if e.get("type") == "apply_complete"
                and addr(e).startswith("openstack_networking_router_interface_v2.cluster"))
    first_server = min(i for i, e in enumerate(events) if e.get("type") == "apply_start"
                       and addr(e).startswith("openstack_compute_instance_v2.node"))
    assert done < first_server
    (subnet,) = conn.network.subnets(tags=f"deployer-id-{cluster_id(tmp_path, c)}")
    assert subnet.dns_nameservers == []

    write_spec(tmp_path / "cluster.yaml", c, nodes=2, dns_nameservers=["192.0.2.53"])
    again = deployer.json("up", "--no-setup")
    (subnet,) = conn.network.subnets(tags=f"deployer-id-{cluster_id(tmp_path, c)}")
    assert subnet.dns_nameservers == ["192.0.2.53"]
    assert again["recreated"] == []  # a subnet update, no node made anew
    cid = cluster_id(tmp_path, c)
    deployer("down", "--yes")
    nothing_left(conn, tmp_path, c, cid)


def test_a_network_with_port_security_off(own_project, deployer, tmp_path, cluster_name):
    """Item 5: Neutron refuses a security group on a port of a network with port security
    off (the cloud's own answer, first); the deployer's preflight says so in one line,
    exit 2, and nothing is made."""
    import openstack

    conn, c = own_project, cluster_name
    ext = conn.network.find_network("public", ignore_missing=False)
    net = conn.network.create_network(name=f"{c}-nosec", port_security_enabled=False)
    subnet = conn.network.create_subnet(network_id=net.id, ip_version=4, cidr="10.77.0.0/24", name=f"{c}-nosec-subnet")
    router = conn.network.create_router(name=f"{c}-nosec-router", external_gateway_info={"network_id": ext.id})
    conn.network.add_interface_to_router(router, subnet_id=subnet.id)
    group = conn.network.create_security_group(name=f"{c}-probe")
    with pytest.raises(openstack.exceptions.HttpException, match="(?i)port security"):
        conn.network.create_port(network_id=net.id, security_group_ids=[group.id])

    write_spec(tmp_path / "cluster.yaml", c, nodes=2, network=net.name)
    refused = deployer("up", "--no-setup", ok=False)
    assert refused.returncode == 2, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "port security disabled" in errors[0] and "--enable-port-security" in errors[0]
    assert servers(conn, c) == {} and not (state_dir(tmp_path, c) / "terraform").exists()


def test_the_floating_ip_lands_on_the_external_network_a_same_named_one_beside_it(own_project, deployer, tmp_path,
                                                                                 cluster_name):
    """Item 6: `pool` is a name, and the provider (v3.4.0) allocates on the first network
    Neutron lists with it, external or not. With project networks named like the external
    one (three, so that one of them is most likely listed first), the spec naming the
    external network by ID: the floating IP is on that network."""
    conn, c = own_project, cluster_name
    ext = conn.network.find_network("public", ignore_missing=False)
    decoys = [conn.network.create_network(name="public") for _ in range(3)]
    assert len(list(conn.network.networks(name="public"))) == 1 + len(decoys)
    write_spec(tmp_path / "cluster.yaml", c, nodes=1, external_network=ext.id)
    deployer("up", "--no-setup")
    (fip,) = list(conn.network.ips(tags=f"deployer-id-{cluster_id(tmp_path, c)}"))
    assert fip.floating_network_id == ext.id
    again = deployer.json("up", "--no-setup")
    assert again["converged"] is True  # pool read back from the ID: the same name, no diff
    cid = cluster_id(tmp_path, c)
    deployer("down", "--yes")
    nothing_left(conn, tmp_path, c, cid)
    for d in decoys:
        conn.network.delete_network(d)
