"""`down` finds the provider and Terraform's environment from what was recorded."""

import json

from deployer import status
from deployer.spec import ClusterSpec
from deployer.state import ClusterState


def test_origin_record_first(tmp_path):
    st = ClusterState(tmp_path, "demo")
    assert status.origin_of(st) is None  # nothing recorded: nothing to destroy
    st.write_record(st.origin_file, {"provider": "openstack", "terraform_env": {"OS_CLOUD": "lab"}})
    st.write_record(st.spec_file, {"spec": ClusterSpec(nodes=2).model_dump(mode="json")})
    assert status.origin_of(st) == ("openstack", {"OS_CLOUD": "lab"})


def test_terraform_state_when_the_origin_record_is_lost(tmp_path):
    st = ClusterState(tmp_path, "demo")
    workdir = st.terraform_dir / "local"
    workdir.mkdir(parents=True)
    (workdir / "terraform.tfstate").write_text(json.dumps({"resources": []}))
    assert status.origin_of(st) is None  # a state with nothing in it
    (workdir / "terraform.tfstate").write_text(json.dumps({"resources": [{"type": "terraform_data"}]}))
    assert status.origin_of(st) == ("local", {})
