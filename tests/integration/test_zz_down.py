"""Last of the integration modules (name order): down leaves nothing behind."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.integration


def test_zz_down_leaves_nothing_behind(local_cluster):
    # The session fixture's own down is then a no-op.
    p = local_cluster.deployer("down", "--yes", timeout=600)
    assert p.returncode == 0, p.stderr
    containers = subprocess.run(["lxc-ls", "-1"], capture_output=True, text=True).stdout.split()
    assert not [c for c in containers if c.startswith("itest-")]
    assert subprocess.run(["ip", "link", "show", "dpl-itest"], capture_output=True).returncode != 0
    assert subprocess.run(["nft", "list", "table", "ip", "deployer_itest"], capture_output=True).returncode != 0
    assert not (local_cluster.state / "terraform").exists()
    assert not (local_cluster.state / "shared").exists()
    assert (local_cluster.state / "runs").is_dir()  # the logs stay
    assert not list(local_cluster.state.glob("ssh"))
    again = local_cluster.deployer("down", "--yes")
    assert again.returncode == 0 and "does not exist" in again.stderr
