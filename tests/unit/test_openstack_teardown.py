"""The master-side teardown (openstack.auto_teardown) against the recorded-shape fake
cloud: the script the timer runs, the application credential's life (made, kept,
renewed, revoked), and the role that installs it, rendered by Ansible."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from deployer import lifetime
from deployer.errors import UsageError
from deployer.providers import openstack_appcred as appcred
from deployer.providers.openstack import OpenStackProvider, read_teardown_credential, teardown_credential_file
from deployer.providers.openstack_observe import session
from deployer.providers.openstack_teardown import teardown
from deployer.spec import ClusterSpec, build_spec
from deployer.state import ClusterState
from tests.unit.test_monitoring_ansible import ANSIBLE_PLAYBOOK, ROLES_DIR, inventory, run_playbook
from tests.unit.test_openstack_preflight import ENV, _servers, cloud, isolated_env, writes  # noqa: F401 (fixtures)

NOW = lifetime.parse_iso("2026-11-23T12:00:00Z")


def _cluster(cloud, expires):  # noqa: F811
    servers = _servers(["demo-master", "demo-worker-1", "demo-worker-2"])
    for s in servers:
        s["metadata"]["deployer_expires_at"] = expires
    cloud.data["compute_servers_detail"]["servers"] = servers + _servers(["other-master"], cluster="other")
    cloud.allow_delete = True


def test_before_the_expiry_the_timer_deletes_nothing(cloud):  # noqa: F811
    _cluster(cloud, "2026-11-23T20:00:00Z")
    with session(ENV) as conn:
        assert teardown(conn, "demo", "id-demo-master", NOW, say=lambda _: None) == []
    assert writes(cloud) == []


def test_at_expiry_the_workers_go_first_and_the_master_last(cloud):  # noqa: F811
    _cluster(cloud, "2026-11-23T11:59:00Z")
    said = []
    with session(ENV) as conn:
        gone = teardown(conn, "demo", "id-demo-master", NOW, say=said.append)
    assert gone == ["demo-worker-1", "demo-worker-2", "demo-master"]
    assert [p for _, p in writes(cloud)] == ["/compute/v2.1/servers/id-demo-worker-1", "/compute/v2.1/servers/id-demo-worker-2",
                                            "/compute/v2.1/servers/id-demo-master"]
    assert [s["name"] for s in cloud.data["compute_servers_detail"]["servers"]] == ["other-master"]
    assert any("deployer down" in line for line in said), "it says what it leaves behind"


def test_a_server_id_that_is_not_the_clusters_deletes_nothing(cloud):  # noqa: F811
    _cluster(cloud, "2026-11-23T11:00:00Z")
    with session(ENV) as conn:
        assert teardown(conn, "demo", "id-other-master", NOW, say=lambda _: None) == []
    assert writes(cloud) == []


def _spec(auto=True, ttl="8h"):
    base = {"cloud": "testcloud", "flavor": "m1.large", "image": "Ubuntu 22.04", "auto_teardown": auto}
    return ClusterSpec.model_validate({"name": "demo", "provider": "openstack", "nodes": 2, "ttl": ttl, "openstack": base})


def test_auto_teardown_needs_a_ttl(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("provider: openstack\nopenstack:\n  auto_teardown: true\n")
    with pytest.raises(UsageError, match="auto_teardown needs a ttl"):
        build_spec(cfg)
    cfg.write_text("provider: openstack\nttl: 8h\nopenstack:\n  auto_teardown: true\n")
    assert build_spec(cfg).openstack.auto_teardown is True


def _set_expiry(st, expires):
    st.write_record(st.lifetime_file, {"ttl": "8h", "set_at": "2026-11-23T12:00:00Z", "expires_at": expires})


def test_the_credential_is_made_kept_renewed_and_revoked(cloud, tmp_path):  # noqa: F811
    st = ClusterState(tmp_path / "state", "demo")
    st.create()
    provider = OpenStackProvider()
    _set_expiry(st, "2026-11-23T20:00:00Z")
    provider.prepare(_spec(), st)
    (sent,) = cloud.application_credentials
    assert sent["name"] == "deployer-demo-teardown" and sent["unrestricted"] is False
    assert sent["access_rules"] == appcred.ACCESS_RULES and all(r["service"] == "compute" for r in sent["access_rules"])
    assert sent["expires_at"] == "2026-11-24T20:00:00"  # a day past the cluster
    rec = read_teardown_credential(st)
    assert rec["secret"] and rec["auth_url"].endswith("/identity/v3") and rec["user_id"]
    assert teardown_credential_file(st).stat().st_mode & 0o777 == 0o600

    provider.prepare(_spec(), st)  # the same expiry: the same credential
    assert len(cloud.application_credentials) == 1 and cloud.revoked == []

    _set_expiry(st, "2026-11-26T20:00:00Z")  # `up --ttl` beyond the credential's life: a new one, the old revoked
    provider.prepare(_spec(), st)
    assert len(cloud.application_credentials) == 2 and cloud.revoked == [rec["id"]]

    provider.prepare(_spec(auto=False), st)  # switched off: revoked, forgotten
    assert len(cloud.revoked) == 2 and read_teardown_credential(st) is None


def test_down_revokes_the_credential(cloud, tmp_path):  # noqa: F811
    st = ClusterState(tmp_path / "state", "demo")
    st.create()
    _set_expiry(st, "2026-11-23T20:00:00Z")
    OpenStackProvider().prepare(_spec(), st)
    OpenStackProvider().forget(st, ENV)
    assert cloud.revoked == [read_teardown_credential(st)["id"]]


@pytest.mark.slow  # Ansible renders the role's templates
def test_the_master_gets_the_credential_root_only_and_a_timer(tmp_path):
    if ANSIBLE_PLAYBOOK is None:
        pytest.skip("ansible-playbook not installed (pip install ansible-core)")
    role = ROLES_DIR / "teardown_timer"
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    cred = {"id": "cred-id", "name": "deployer-demo-teardown", "secret": "s3cr3t", "expires_at": "2026-11-24T20:00:00Z",
            "auth_url": "https://keystone.example:5000/v3", "region_name": "RegionOne", "interface": "public", "user_id": "u"}
    (secrets / "teardown_credential.json").write_text(json.dumps(cred))
    out = tmp_path / "out"
    out.mkdir()
    tpl = role / "templates"
    play = [{
        "hosts": "master", "gather_facts": False, "vars_files": [str(role / "defaults/main.yml")],
        "vars": {"deployer_teardown_server_id": "srv-123", "deployer_teardown_script": "/x/openstack_teardown.py",
                 "teardown_timer_credential": "{{ lookup('ansible.builtin.file', teardown_timer_credential_file) | from_json }}"},
        "tasks": [{"ansible.builtin.template": {"src": str(tpl / f), "dest": str(out / f.removesuffix(".j2")), "mode": "0600"}, "no_log": True}
                  for f in ("teardown-clouds.yaml.j2", "deployer-teardown.service.j2", "deployer-teardown.timer.j2")],
    }]
    r = run_playbook(play, inventory(tmp_path), tmp_path, "-e", json.dumps({"ansible_connection": "local", "ansible_python_interpreter": sys.executable}))
    assert r.returncode == 0, r.stdout[-3000:]
    assert "s3cr3t" not in r.stdout + r.stderr, "no_log: the secret is never printed"
    clouds = yaml.safe_load((out / "teardown-clouds.yaml").read_text())["clouds"]["deployer-teardown"]
    assert clouds["auth_type"] == "v3applicationcredential" and clouds["region_name"] == "RegionOne"
    assert clouds["auth"] == {"auth_url": cred["auth_url"], "application_credential_id": "cred-id", "application_credential_secret": "s3cr3t"}
    service = (out / "deployer-teardown.service").read_text()
    assert "--cluster demo --server-id srv-123" in service and "OS_CLIENT_CONFIG_FILE=/etc/deployer/teardown-clouds.yaml" in service
    assert "OnCalendar=*:0/5" in (out / "deployer-teardown.timer").read_text()


def test_the_role_is_off_unless_asked():
    defaults = yaml.safe_load((ROLES_DIR / "teardown_timer" / "defaults/main.yml").read_text())
    assert defaults["teardown_timer_enabled"] == "{{ deployer_auto_teardown | default(false) }}"
    tasks = yaml.safe_load((ROLES_DIR / "teardown_timer" / "tasks/timer.yml").read_text())
    secret_tasks = [t for t in tasks if "credential" in json.dumps(t.get("vars", {}))]
    assert secret_tasks and all(t.get("no_log") is True for t in secret_tasks)
