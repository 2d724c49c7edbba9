"""Down leaves nothing behind, even without the spec record, and never forgets a cluster
while something of it remains. It destroys the shared cluster, so it is marked
`destroys_cluster`: tests/conftest.py runs it after every other test, whatever the
file names."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.destroys_cluster


def _containers() -> list[str]:
    return [c for c in subprocess.run(["lxc-ls", "-1"], capture_output=True, text=True).stdout.split() if c.startswith("itest-")]


def test_down_without_the_spec_record_removes_a_stray_of_its_own_then_leaves_nothing(local_cluster):
    # The spec record lost: down works from what was recorded at creation (origin.json)
    # and Terraform's state.
    (local_cluster.state / "spec.json").unlink()
    # A container of the cluster's name that Terraform does not know (a stray of an
    # interrupted scale-in, or a node whose creation failed: Terraform runs no destroy
    # provisioner for a tainted resource), with the cluster's id recorded beside it by the
    # driver: the deployer made it for this cluster, so down removes it too (issue 44,
    # item 8; it used to refuse and ask for removal by hand).
    from deployer.providers.local.node import CLUSTER_ID_FILE

    stray = Path("/var/lib/lxc/itest-worker-9")
    stray.mkdir(parents=True)
    (stray / "config").write_text("lxc.uts.name = itest-worker-9\n")
    (stray / CLUSTER_ID_FILE).write_text(json.loads((local_cluster.state / "origin.json").read_text())["cluster_id"] + "\n")
    try:
        p = local_cluster.deployer("down", "--yes", timeout=600)
        assert p.returncode == 0, p.stderr
        assert "removed node itest-worker-9, left by a creation that failed" in p.stderr
        assert _containers() == []
        assert not stray.exists()
    finally:
        shutil.rmtree(stray, ignore_errors=True)

    assert _containers() == []
    assert subprocess.run(["ip", "link", "show", "dpl-itest"], capture_output=True).returncode != 0
    assert subprocess.run(["nft", "list", "table", "ip", "deployer_itest"], capture_output=True).returncode != 0
    assert not (local_cluster.state / "terraform").exists()
    assert not (local_cluster.state / "shared").exists()
    assert (local_cluster.state / "runs").is_dir()  # the logs stay
    assert not list(local_cluster.state.glob("ssh"))
    again = local_cluster.deployer("down", "--yes")
    assert again.returncode == 0 and "does not exist" in again.stderr
