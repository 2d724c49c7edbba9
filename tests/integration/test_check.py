"""`deployer check` on the real local cluster: a healthy cluster passes, and a node whose
shared dir is unmounted fails, named with the reason and the command that replaces it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

pytestmark = pytest.mark.integration


def _in_node(name: str, script: str) -> None:
    """A shell script run as root in the node (lxc-attach: its namespaces, its root)."""
    subprocess.run(["lxc-attach", "-n", name, "--", "sh", "-ec", script], check=True, capture_output=True, text=True)


@contextmanager
def shared_unmounted(node: str) -> Iterator[None]:
    """The node's /shared unmounted (lazily: a process may sit in it), put back after: the
    same host directory, through a bind kept aside in the node's /run."""
    _in_node(node, "mkdir -p /run/deployer-test-shared && mount --bind /shared /run/deployer-test-shared && umount -l /shared")
    try:
        yield
    finally:
        _in_node(node, "mount --bind /run/deployer-test-shared /shared && umount -l /run/deployer-test-shared")


def test_a_healthy_cluster_passes_and_the_report_is_kept(local_cluster):
    p = local_cluster.deployer("check", "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout)
    assert [n["name"] for n in report["nodes"]] == local_cluster.cluster_output().names
    assert report["verdict"] in ("pass", "warn"), [(n["name"], n["reason"]) for n in report["nodes"]]
    for node in report["nodes"]:
        found = {f["check"]: f for f in node["findings"]}
        assert found["shared_dir"]["status"] == "pass" and found["runtime"]["status"] == "pass", node
        assert abs(found["clock"]["value"]["offset_s"]) < 1.0, "the containers keep this machine's time"
    assert "check (quick) of cluster itest" in p.stderr
    assert json.loads((local_cluster.state / "check.json").read_text())["verdict"] == report["verdict"]


def test_a_node_without_its_shared_dir_fails_by_name(local_cluster):
    worker = local_cluster.cluster_output().workers[-1].name
    with shared_unmounted(worker):
        p = local_cluster.deployer("check", "--json", timeout=300)
    assert p.returncode == 1, p.stderr[-3000:]
    report = json.loads(p.stdout)
    verdicts = {n["name"]: (n["verdict"], n["reason"]) for n in report["nodes"]}
    assert verdicts[worker][0] == "fail" and verdicts[worker][1].startswith("shared_dir: /shared is not mounted"), verdicts
    assert all(v == "pass" or v == "warn" for name, (v, _) in verdicts.items() if name != worker), verdicts
    assert f"{worker}: shared_dir: /shared is not mounted" in p.stderr
    assert "`deployer up --replace-failed`" in p.stderr
    again = local_cluster.deployer("check", timeout=300)  # mounted again: the node passes again
    assert again.returncode == 0, again.stderr[-2000:]
