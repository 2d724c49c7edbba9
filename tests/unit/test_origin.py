"""`down` finds the provider and Terraform's environment from what was recorded."""

import json

from deployer import origin, status
from deployer.records import Origin
from deployer.spec import ClusterSpec
from deployer.state import ClusterState


def test_origin_record_first(tmp_path):
    st = ClusterState(tmp_path, "demo")
    assert origin.origin_of(st) is None  # nothing recorded: nothing to destroy
    st.write_origin(Origin(**{"provider": "openstack", "terraform_env": {"OS_CLOUD": "lab"}, "cluster_id": "aaaaaaaaaaaa"}))
    st.write_spec(ClusterSpec(nodes=2))
    assert origin.origin_of(st) == ("openstack", {"OS_CLOUD": "lab"})


def test_terraform_state_when_the_origin_record_is_lost(tmp_path):
    st = ClusterState(tmp_path, "demo")
    workdir = st.terraform_dir / "local"
    workdir.mkdir(parents=True)
    (workdir / "terraform.tfstate").write_text(json.dumps({"resources": []}))
    assert origin.origin_of(st) is None  # a state with nothing in it
    (workdir / "terraform.tfstate").write_text(json.dumps({"resources": [{"type": "terraform_data"}]}))
    assert origin.origin_of(st) == ("local", {})


def test_the_status_table_shows_each_node_of_the_typed_cluster():
    """`deployer status` without --json: the table is made from status()'s record of
    each node (a dict, as --json prints it), not from the Cluster it was read from."""
    from dataclasses import asdict

    from deployer import ui

    from ..clusters import typed

    cluster = typed({"name": "demo", "nodes": [{"name": "demo-master", "public_ip": "10.0.0.10"}, {"name": "demo-worker-1", "gpus": 2}]})
    info = {"name": "demo", "id": "0123456789ab", "provider": "local", "extra": [], "lifetime": None,
            "nodes": [asdict(n) | {"state": "ok", "reachable": True} for n in cluster.nodes]}
    with ui.out.capture() as captured:
        status.show(info)
    table = captured.get()
    assert "demo-worker-1" in table and "10.0.0.11" in table and "id 0123456789ab" in table
    row = next(line for line in table.splitlines() if "demo-worker-1" in line)
    # The first column is the host, said once per host (no placement recorded here: one group, "-")
    assert [cell.strip() for cell in row.split("│")[1:-1]] == ["", "demo-worker-1", "worker", "10.0.0.11", "-", "2", "ok"]


def test_status_says_what_the_last_check_found(tmp_path, capsys):
    from deployer import records
    from deployer.check.model import CheckReport, Finding, NodeReport
    from deployer.check.run import check_file

    st = ClusterState(tmp_path, "demo")
    assert status.check_of(st) is None
    report = CheckReport("demo", "standard", "2026-11-25T22:00:00Z",
                         [NodeReport("demo-master", [Finding("clock", "pass", "")]),
                          NodeReport("demo-worker-1", [Finding("network", "fail", "the slow node")])])
    records.write(check_file(st), report.to_record())
    found = status.check_of(st)
    assert found == {"verdict": "fail", "level": "standard", "at": "2026-11-25T22:00:00Z",
                     "failed": {"demo-worker-1": "network: the slow node"}, "warned": {}}
    status.show({"name": "demo", "id": None, "provider": "local", "extra": [], "lifetime": None, "nodes": [], "check": found})
    said = capsys.readouterr().err
    assert "last check (standard, 2026-11-25T22:00:00Z): fail; demo-worker-1: network: the slow node" in said
    assert "`deployer up --replace-failed`" in said
