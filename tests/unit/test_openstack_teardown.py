"""The master-side teardown (openstack.auto_teardown) without a cloud: the spec's rule
and the role that installs the timer, rendered by Ansible. The script the timer runs and
the credential's life (made, kept, renewed, revoked, accepted by Nova) run against the
test cloud: tests/cloud/test_teardown_credential.py."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from deployer.errors import UsageError
from deployer.spec import build_spec
from tests.unit.test_monitoring_ansible import ANSIBLE_PLAYBOOK, ROLES_DIR, inventory, run_playbook


def test_auto_teardown_needs_a_ttl(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("provider: openstack\nopenstack:\n  auto_teardown: true\n")
    with pytest.raises(UsageError, match="auto_teardown needs a ttl"):
        build_spec(cfg)
    cfg.write_text("provider: openstack\nttl: 8h\nopenstack:\n  auto_teardown: true\n")
    assert build_spec(cfg).openstack.auto_teardown is True


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
        "vars": {"deployer_teardown_server_id": "srv-123", "deployer_cluster_id": "0123456789ab",
                 "deployer_teardown_script": "/x/openstack_teardown.py",
                 "teardown_timer_credential": "{{ lookup('ansible.builtin.file', teardown_timer_credential_file) | from_json }}"},
        "tasks": [{"ansible.builtin.template": {"src": str(tpl / f), "dest": str(out / f.removesuffix(".j2")), "mode": "0600"},
                   "no_log": True}
                  for f in ("teardown-clouds.yaml.j2", "deployer-teardown.service.j2", "deployer-teardown.timer.j2")],
    }]
    r = run_playbook(
        play, inventory(tmp_path), tmp_path, "-e", json.dumps({"ansible_connection": "local", "ansible_python_interpreter": sys.executable})
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "s3cr3t" not in r.stdout + r.stderr, "no_log: the secret is never printed"
    clouds = yaml.safe_load((out / "teardown-clouds.yaml").read_text())["clouds"]["deployer-teardown"]
    assert clouds["auth_type"] == "v3applicationcredential" and clouds["region_name"] == "RegionOne"
    assert clouds["auth"] == {
        "auth_url": cred["auth_url"], "application_credential_id": "cred-id", "application_credential_secret": "s3cr3t",
    }
    service = (out / "deployer-teardown.service").read_text()
    assert (
        "--cluster demo --cluster-id 0123456789ab --server-id srv-123" in service
        and "OS_CLIENT_CONFIG_FILE=/etc/deployer/teardown-clouds.yaml" in service
    )
    assert "OnCalendar=*:0/5" in (out / "deployer-teardown.timer").read_text()


def test_the_role_is_off_unless_asked():
    defaults = yaml.safe_load((ROLES_DIR / "teardown_timer" / "defaults/main.yml").read_text())
    assert defaults["teardown_timer_enabled"] == "{{ deployer_auto_teardown | default(false) }}"
    tasks = yaml.safe_load((ROLES_DIR / "teardown_timer" / "tasks/timer.yml").read_text())
    secret_tasks = [t for t in tasks if "credential" in json.dumps(t.get("vars", {}))]
    assert secret_tasks and all(t.get("no_log") is True for t in secret_tasks)


@pytest.mark.parametrize(("endpoint", "api"), [
    ("https://nova.example:8774/v2.1", "/v2.1"),
    ("https://cloud.example/compute/v2.1", "/compute/v2.1"),  # DevStack's layout (the test cloud's too)
    ("https://nova.example:8774/v2.1/4f1ab7", "/v2.1/4f1ab7"),  # an endpoint carrying the project id
    ("https://cloud.example/compute", "/compute/v2.1"),  # unversioned: openstacksdk settles on v2.1
    ("https://nova.example:8774/v2/4f1ab7", "/v2.1/4f1ab7"),  # the legacy v2 entry: the same
])
def test_access_rules_follow_the_catalogs_compute_endpoint(endpoint, api):
    """keystonemiddleware matches a rule against the whole request path: each server by id
    under the path openstacksdk will really call, discovery at the endpoint's root."""
    from deployer.providers.openstack.appcred import access_rules

    rules = {(r["method"], r["path"]) for r in access_rules(endpoint, ["s1", "s2"])}
    root = api.removesuffix("/v2.1").split("/v2.1/")[0]
    assert {("GET", f"{api}/servers/s1"), ("DELETE", f"{api}/servers/s1"), ("GET", f"{api}/servers/s2"),
            ("DELETE", f"{api}/servers/s2"), ("GET", f"{root}/v2.1"), ("GET", f"{root}/")} <= rules
    assert not any("*" in p or p.endswith("/servers/detail") for _, p in rules)


def test_the_inventory_names_the_teardown_script_the_role_copies(tmp_path):
    """The script path the teardown_timer role installs on the master comes from the
    OpenStack provider, and is the file that is there (the role's copy would fail on the
    cloud otherwise: no local run copies it)."""
    from deployer.providers.local.provider import LocalProvider
    from deployer.providers.openstack import teardown
    from deployer.providers.openstack.provider import OpenStackProvider
    from deployer.state import ClusterState
    from tests.clusters import typed

    cfg = tmp_path / "cluster.yaml"
    cfg.write_text("provider: openstack\nttl: 8h\nopenstack:\n  auto_teardown: true\n")
    cluster = typed({"provider": "openstack", "nodes": [{"name": "t-master", "id": "m"}, {"name": "t-worker-1", "id": "w"}]})
    got = OpenStackProvider().inventory_vars(build_spec(cfg), ClusterState(tmp_path, "t"), cluster)
    assert got["deployer_teardown_script"] == teardown.__file__ and got["deployer_teardown_server_id"] == "m"
    off = LocalProvider().inventory_vars(build_spec(None), ClusterState(tmp_path, "t"), cluster)
    assert set(off) == set(got) and off["deployer_teardown_script"] is None


def test_nothing_says_the_teardown_credential_may_list_servers():
    """Its access rules name each server by id: it cannot list (issue 44, item 11). The
    spec's description (`deployer init`'s reference), the role that installs it, the file
    it leaves on the master and the docs say what it may do."""
    import re
    from pathlib import Path

    from deployer.spec import OpenStackSpec

    root = Path(__file__).resolve().parents[2]
    claims = re.compile(r"(may|can|only|to)\s+(only\s+)?list(ing)?\s+(and|or)\s+delet|listing and deleting|lists? and deletes?", re.I)
    texts = {"spec openstack.auto_teardown": OpenStackSpec.model_fields["auto_teardown"].description or ""}
    for f in [*(root / "docs").glob("*.md"), root / "README.md", *(root / "ansible/roles/teardown_timer").rglob("*")]:
        if f.is_file():
            texts[str(f.relative_to(root))] = f.read_text()
    wrong = {where: m.group(0) for where, text in texts.items() if (m := claims.search(" ".join(text.split())))}
    assert wrong == {}
