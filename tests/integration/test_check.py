"""`deployer check` on the real local cluster: a healthy cluster passes, and a node whose
shared dir is unmounted fails, named with the reason and the command that replaces it."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.integration


def _in_node(name: str, script: str) -> None:
    """A shell script run as root in the node (lxc-attach: its namespaces, its root)."""
    subprocess.run(["lxc-attach", "-n", name, "--", "sh", "-ec", script], check=True, capture_output=True, text=True)


def unmount_shared(node: str) -> None:
    """The node's /shared unmounted (lazily: a process may sit in it), as when its NFS
    mount went: the node now writes to a directory of its own root disk."""
    _in_node(node, "umount -l /shared")


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


def test_a_node_without_its_shared_dir_fails_by_name_and_replace_failed_repairs_it(local_cluster):
    before = local_cluster.cluster_output()
    worker = before.workers[-1]
    unmount_shared(worker.name)
    p = local_cluster.deployer("check", "--json", timeout=300)
    assert p.returncode == 1, p.stderr[-3000:]
    report = json.loads(p.stdout)
    verdicts = {n["name"]: (n["verdict"], n["reason"]) for n in report["nodes"]}
    assert verdicts[worker.name][0] == "fail", verdicts
    assert verdicts[worker.name][1].startswith("shared_dir: /shared is not mounted"), verdicts
    assert all(v in ("pass", "warn") for name, (v, _) in verdicts.items() if name != worker.name), verdicts
    assert f"{worker.name}: shared_dir: /shared is not mounted" in p.stderr
    assert f"`deployer up --replace-failed` replaces {worker.name}" in p.stderr

    fixed = local_cluster.deployer("up", "--replace-failed", timeout=1200)
    assert fixed.returncode == 0, fixed.stderr[-4000:]
    assert f"--replace-failed: {worker.name} (failed the quick check of" in fixed.stderr
    assert "check (quick): pass" in fixed.stderr or "check (quick): warn" in fixed.stderr
    after = local_cluster.cluster_output()
    assert after.find(worker.name).id != worker.id, "the failed node was made anew"
    assert after.master.id == before.master.id, "the rest of the cluster stays as it was"
    nothing = local_cluster.deployer("up", "--replace-failed", timeout=300)  # the last check failed nobody now
    assert nothing.returncode == 2 and "failed no node to replace" in nothing.stderr, nothing.stderr[-2000:]
