"""`image build --provider openstack` against the test cloud: a builder server from the
spec's image, Nova's createImage (the test cloud's virt driver uploads a few bytes through
Nova's own Glance client, as the libvirt driver uploads a disk: plugins/.../virt.py),
waited for until active, its properties the manifest; the builder deleted;
`up --no-setup --image` boots servers from it; `image rm` is refused with one line while
they run, and removes it once the cluster is down. A Ctrl-C while the builder is being
made leaves no server, no image and nothing else of the builder's in the project.

The test cloud's servers never boot, so the bake runs with --no-setup (nothing installed,
nothing sealed: the manifest names nothing, and a node of it installs as from the base).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.interrupt import sigint_as_from_a_shell

from . import module_resources
from .test_module_apply import MIRROR, Verb, _mirror_problem, cluster_id, nothing_left, write_spec

pytestmark = pytest.mark.cloud


@pytest.fixture(autouse=True)
def _needs_the_built_provider():
    problem = _mirror_problem()
    if problem:
        pytest.skip(f"no usable terraform-provider-openstack in {MIRROR} ({problem}); `make provider` builds it")


@pytest.fixture
def deployer(own_project, test_cloud, tmp_path) -> Verb:
    return Verb(tmp_path, test_cloud.ports)


def test_a_bake_in_glance_with_its_manifest_and_a_cluster_from_it(own_project, deployer, tmp_path, cluster_name):
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, nodes=2)
    name = f"baked-{c}"
    made = deployer.json("image", "build", "--provider", "openstack", "--no-setup", "--image-name", name, label="bake")
    assert made["name"] == name
    image = next(i for i in conn.image.images() if i.name == name)
    assert image.status == "active"
    props = image.properties or {}
    assert props.get("deployer_roles_hash") == made["manifest"]["roles_hash"] and props.get("deployer_provider") == "openstack"
    assert not [s for s in conn.compute.servers(details=True) if (s.name or "").startswith("bake-")]  # the builder is gone

    listed = deployer.json("image", "list", "--provider", "openstack")
    assert [i["name"] for i in listed["images"]] == [name]

    deployer.json("up", "--no-setup", "--image", name, label="up from the bake")
    servers = [s for s in conn.compute.servers(details=True) if (s.name or "").startswith(f"{c}-")]
    assert len(servers) == 2 and {s.image["id"] for s in servers} == {image.id}

    refused = deployer("image", "rm", name, "--provider", "openstack", ok=False)
    assert refused.returncode == 2 and "in use by server" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    cid = cluster_id(tmp_path, c)
    deployer("down", "--yes", label="down")
    nothing_left(conn, tmp_path, c, cid)
    deployer("image", "rm", name, "--provider", "openstack", label="image rm")
    assert not [i for i in conn.image.images() if i.name == name]
    print(f"\nfigures (seconds, wall): { {k: round(v, 1) for k, v in deployer.seconds.items()} }")


def test_ctrl_c_while_the_builder_is_made_leaves_nothing(own_project, deployer, tmp_path, cluster_name):
    conn, c = own_project, cluster_name
    write_spec(tmp_path / "cluster.yaml", c, nodes=1)
    name = f"cut-{c}"
    proc = subprocess.Popen([sys.executable, "-m", "deployer", "image", "build", "--provider", "openstack", "--no-setup",
                             "--image-name", name], cwd=tmp_path, text=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, bufsize=1,
                            preexec_fn=sigint_as_from_a_shell)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True).start()
    deadline = time.monotonic() + 600
    builders: list[str] = []
    while not builders:  # Terraform is mid-apply: the builder's server is in Nova, its build under way
        assert proc.poll() is None, "".join(lines)[-3000:]
        assert time.monotonic() < deadline, "no builder server in 10 min:\n" + "".join(lines)[-3000:]
        builders = [s.name for s in conn.compute.servers() if (s.name or "").startswith("bake-")]
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(timeout=600)
    said = "".join(lines)
    print(f"\n$ deployer image build (Ctrl-C once {builders[0]} was in Nova): exit {rc}\n{said[-3000:]}")
    assert rc == 130, said[-3000:]
    builder = builders[0].removesuffix("-master")
    assert module_resources.leftovers(conn, builder) == []
    assert not [i.name for i in conn.image.images() if i.name == name]
    assert "deleting the builder" in said and "the builder is deleted and no image was saved" in said
