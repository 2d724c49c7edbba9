"""A local bake, then a node from it: `image build` saves a sealed image with its manifest
and leaves no builder; `up --image` of one node from it installs nothing the image holds
(the training environment is the image's, linked; no pip or apt task runs); `image rm`
is refused while the node stands on it, and removes it once the cluster is down.
About 2½ minutes: the bake (~100 s, torch from the machine's wheelhouse) and one `up`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import _why_not, cluster_up

pytestmark = pytest.mark.integration

NAME = "ibake"
SPEC = f"name: {NAME}\nnodes: 1\nlocal:\n  subnet: 10.83.0.0/24\n"


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("bake")
    p = subprocess.run([sys.executable, "-m", "deployer", "image", "build",
                        "--provider", "local", "--json"], cwd=workdir, text=True, capture_output=True, timeout=1500)
    assert p.returncode == 0, p.stderr[-4000:]
    result = json.loads(p.stdout)
    yield result
    subprocess.run([sys.executable, "-m", "deployer", "image", "rm", result["name"], "--provider", "local"],
                   cwd=workdir, capture_output=True)


def test_the_bake_holds_a_manifest_and_leaves_no_builder(baked):
    m = baked["manifest"]
    assert m["torch"].startswith("torch==") and m["openmpi"] and m["slurm"] and m["jupyterlab"]
    assert not m["gpu"] and m["venv"] == "/opt/deployer/venv"
    containers = subprocess.run(["lxc-ls", "-1"], text=True, capture_output=True).stdout.split()
    assert not [c for c in containers if c.startswith("bake-")]
    from deployer.providers.local import baked as store

    root = store.rootfs(baked["name"])
    assert (root / "etc/machine-id").read_text() == ""
    assert not list((root / "etc/ssh").glob("ssh_host_*")) and not (root / "var/lib/cloud").exists()
    assert not list(root.glob("home/*/.ssh")) and not (root / "etc/munge/munge.key").exists()


def test_a_node_from_the_bake_installs_nothing_it_holds(baked, tmp_path_factory):
    image = baked["name"]
    with cluster_up(tmp_path_factory, NAME, SPEC, "--image", image, "--json") as c:
        events = sorted((c.state / "runs").glob("*-up"))[-1] / "ansible-events.jsonl"
        ran = [json.loads(line)["event_data"].get("task", "") for line in events.read_text().splitlines()
               if json.loads(line).get("event") in ("runner_on_ok", "runner_on_failed")]
        assert not [t for t in ran if t.startswith(("Install torch", "Install mpi4py", "Install JupyterLab",
                                                    "Install base packages", "Install Open MPI"))], ran
        assert "Say why the node installs as without its baked image" not in ran
        p = c.deployer("ssh", "--", "readlink", "/shared/venv")
        assert p.returncode == 0 and p.stdout.strip() == "/opt/deployer/venv"
        rm = c.deployer("image", "rm", image, "--provider", "local")
        assert rm.returncode == 2 and f"in use by container {NAME}-master" in rm.stderr
        assert len(rm.stderr.strip().splitlines()) == 1
