"""`deployer check` without a cluster: the node script run on this machine, the verdicts
from recorded answers, the report's record, and the watch that names a silent node. The
real cluster's checks (a healthy one passes, injected faults are named):
tests/integration/test_check.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployer.check import analyse, run
from deployer.check.model import CheckReport, Finding, NodeReport, worst
from deployer.errors import OperationFailed
from deployer.state import ClusterState

from ..clusters import typed

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "node_check.py"


def node_check(*args: str) -> dict[str, dict]:
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1].startswith("DONE ")
    steps = [x.split(" ", 1)[1] for x in lines if x.startswith("STEP ")]
    found = {f["check"]: f for f in (json.loads(x.split(" ", 1)[1]) for x in lines if x.startswith("CHECK "))}
    assert steps == list(found), "every check announced before it ran, in order"
    return found


def test_the_node_script_on_this_machine(tmp_path):
    # /dev/shm: a mount point of its own, as the shared dir is on a node.
    token = f"unit-{time.time_ns()}"
    found = node_check("--shared", "/dev/shm", "--token", token)
    try:
        assert list(found) == run.NODE_CHECKS
        assert found["shared_dir"]["status"] == "pass", found["shared_dir"]
        assert Path(found["shared_dir"]["value"]["file"]).read_text().strip()
        assert found["disk_root"]["value"]["free_bytes"] > 0 and found["size"]["value"]["cpus"] >= 1
        assert isinstance(found["clock"]["value"]["time"], float)
        assert found["runtime"]["status"] in ("pass", "fail") and found["runtime"]["detail"]
    finally:
        import shutil

        shutil.rmtree(f"/dev/shm/.deployer-check/{token}", ignore_errors=True)


def test_a_shared_dir_that_is_not_mounted_fails_the_node(tmp_path):
    found = node_check("--shared", str(tmp_path), "--token", "t")
    assert found["shared_dir"]["status"] == "fail"
    assert "is not mounted" in found["shared_dir"]["detail"] and "shared storage is missing" in found["shared_dir"]["detail"]
    assert not (tmp_path / ".deployer-check").exists(), "nothing written where the shared dir should be"


def _node(name: str, **values) -> NodeReport:
    return NodeReport(name, [Finding(check, "pass", "", value) for check, value in values.items()])


def test_clock_offsets_are_measured_against_this_machine():
    nodes = [_node("a", clock={"time": 1000.2, "ntp_synchronized": True}),
             _node("b", clock={"time": 1003.0, "ntp_synchronized": False}),
             _node("c", clock={"time": 990.0, "ntp_synchronized": None})]
    analyse.clock(nodes, {"a": 1000.0, "b": 1000.5, "c": 1000.0})
    assert [n.verdict for n in nodes] == ["pass", "warn", "fail"]
    assert nodes[1].reason() == "clock: +2.50 s from this machine's clock (NTP not synchronised)"
    assert nodes[2].findings[0].value["offset_s"] == -10.0


def test_a_node_smaller_than_the_others_is_named():
    gib = 1 << 30
    nodes = [_node(n, size={"cpus": c, "memory_bytes": m * gib}) for n, c, m in
             (("a", 8, 32), ("b", 8, 32), ("c", 4, 32), ("d", 8, 16))]
    analyse.size(nodes)
    assert [n.verdict for n in nodes] == ["pass", "pass", "warn", "warn"]
    assert nodes[2].reason() == "size: 4 CPU(s), the others have 8"
    assert nodes[3].reason() == "size: 16.0 GiB of memory, the others 32.0 GiB"


def test_nccl_on_another_interface_on_one_node_is_named():
    nodes = [_node(n, interface={"name": i}) for n, i in (("a", "eth0"), ("b", "eth0"), ("c", "ens3"))]
    analyse.interface(nodes)
    assert nodes[2].reason() == "interface: NCCL and gloo use ens3 here, eth0 on the other nodes"
    assert nodes[0].verdict == nodes[1].verdict == "pass"


def test_a_shared_dir_the_master_does_not_see_is_not_shared():
    nodes = [_node("m", shared_dir={}), _node("w", shared_dir={})]
    analyse.shared(nodes, {"m"}, "/shared")
    assert nodes[0].verdict == "pass" and nodes[1].verdict == "fail"
    assert "the master does not see them" in nodes[1].reason()


def test_verdicts_and_the_record_round_trip():
    assert worst([]) == "pass" and worst(["skip"]) == "pass" and worst(["pass", "warn", "skip"]) == "warn"
    report = CheckReport("lab", "quick", "2026-11-25T00:00:00Z",
                         [_node("lab-master", clock={}), NodeReport("lab-worker-1", [Finding("runtime", "fail", "no torch")])],
                         [Finding("collective", "warn", "slow")], seconds=3.0)
    record = report.to_record()
    assert record["verdict"] == "fail" and record["nodes"][1]["reason"] == "runtime: no torch"
    again = CheckReport.from_record(json.loads(json.dumps(record)))
    assert again.to_record() == record and again.failed() == ["lab-worker-1"]


def test_a_failed_node_fails_the_verb_with_how_to_replace_it():
    cluster = typed({"name": "lab", "nodes": [{"name": "lab-master"}, {"name": "lab-worker-1"}]})
    bad = NodeReport("lab-worker-1", [Finding("shared_dir", "fail", "/shared is not mounted")])
    with pytest.raises(OperationFailed, match=r"lab-worker-1: shared_dir: /shared is not mounted; `deployer up --replace-failed`"):
        run.raise_on_failure(CheckReport("lab", "quick", "t", [_node("lab-master"), bad]), cluster)
    master = NodeReport("lab-master", [Finding("clock", "fail", "off")])
    with pytest.raises(OperationFailed, match=r"the master only when named: `deployer up --replace lab-master`"):
        run.raise_on_failure(CheckReport("lab", "quick", "t", [master, _node("lab-worker-1")]), cluster)


def test_a_node_that_falls_silent_is_named_with_its_check_and_stopped(tmp_path, monkeypatch):
    """Each node's command runs here instead of over SSH; one stops answering after its
    first step. It is named within the quiet time, with the step, and killed."""
    cluster = typed({"name": "lab", "nodes": [{"name": "lab-master"}, {"name": "lab-worker-1"}]})
    state = ClusterState(tmp_path, "lab")
    state.dir.mkdir(parents=True)
    monkeypatch.setattr(run, "ssh_argv", lambda st, node: ["bash", "-c"])
    scripts = {"lab-master": "echo STEP clock; echo 'CHECK {\"check\": \"clock\", \"status\": \"pass\", \"detail\": \"\"}'; echo DONE x",
               "lab-worker-1": "echo STEP runtime; exec sleep 60"}
    monkeypatch.setattr(run, "node_command", lambda cluster, node, level, token: scripts[node.name])
    said: list[str] = []
    t0 = time.monotonic()
    report = run.run_check(state, cluster, "quick", quiet_s=2, say=said.append)
    assert time.monotonic() - t0 < 20
    worker = report.nodes[1]
    assert worker.verdict == "fail"
    assert worker.reason() == "runtime: no answer for 2 s (during the runtime check): stopped, the node hangs there"
    assert any("lab-worker-1" in line and "silent during runtime" in line for line in said)
    assert report.nodes[0].first("fail").check == "disk_root", "the master's missing answers are failures by name"
    assert run.last_report(state).to_record() == report.to_record()


def test_a_slow_link_names_the_node_whose_pairs_are_all_slow():
    from deployer.check import cluster_checks

    nodes = [NodeReport(n) for n in ("a", "b", "c")]
    measured = [{"src": "a", "dst": "b", "gbit_s": 16.0}, {"src": "a", "dst": "c", "gbit_s": 0.2},
                {"src": "b", "dst": "c", "gbit_s": 0.19}]
    [matrix] = cluster_checks.network_findings(measured, nodes)
    assert [n.verdict for n in nodes] == ["pass", "pass", "fail"]
    assert nodes[2].reason() == "network: 0.20 Gbit/s at best, the other pairs' median is 16.00: the slow node"
    assert matrix.status == "warn" and "slowest b - c 0.19 Gbit/s" in matrix.detail
    two = [NodeReport("a"), NodeReport("b")]
    cluster_checks.network_findings([{"src": "a", "dst": "b", "gbit_s": 1.0}], two)
    assert [n.verdict for n in two] == ["pass", "pass"], "one pair: nothing to hold it against"
    gone = [NodeReport("a"), NodeReport("b"), NodeReport("c")]
    cluster_checks.network_findings([{"src": "a", "dst": "b", "gbit_s": 9.0}, {"src": "a", "dst": "c", "gbit_s": None, "error": "no route"},
                                     {"src": "b", "dst": "c", "gbit_s": None, "error": "no route"}], gone)
    assert gone[2].reason() == "network: iperf3 failed on every pair: no route"


def test_pairs_are_every_pair_up_to_8_nodes_then_a_ring_and_a_few_more():
    from deployer.check import cluster_checks

    def names(n):
        return typed({"name": "c", "nodes": [{"name": f"c-{i}"} for i in range(n)]})

    assert len(cluster_checks.pairs(names(8))) == 28
    big = cluster_checks.pairs(names(16))
    assert len(big) == 16 + cluster_checks.RANDOM_PAIRS and len({(a.name, b.name) for a, b in big}) == len(big)
    assert big == cluster_checks.pairs(names(16)), "the same pairs on every run"


def test_the_straggler_is_the_node_slower_than_the_others_median():
    from deployer.check import cluster_checks

    cluster = typed({"name": "c", "nodes": [{"name": "c-master"}, {"name": "c-worker-1"}, {"name": "c-worker-2"}]})
    record = {"benchmark": "resnet_synthetic", "ranks": [{"rank": 0, "host": "c-master", "img_per_sec": 3.3},
                                                         {"rank": 1, "host": "c-worker-1", "img_per_sec": 2.0},
                                                         {"rank": 2, "host": "c-worker-2", "img_per_sec": 3.5}]}

    class Runner:
        def run(self, cmd, *, timeout, on_line=None):
            assert "resnet_synthetic.py --mode ensemble" in cmd and "-np 3" in cmd
            return 0, "[1,0]<stdout>:Img/sec\n[1,0]<stdout>:" + json.dumps(record) + "\n", ""

    rates, why, silent = cluster_checks.measure_straggler(Runner(), cluster)
    nodes = [NodeReport(n) for n in cluster.names]
    cluster_checks.straggler_findings(rates, why, silent, nodes)
    assert [n.verdict for n in nodes] == ["pass", "warn", "pass"]
    assert nodes[1].reason() == "straggler: 2.0 img/s on its own, 59% of the other nodes' median (3.4): the straggler"
    shared = [NodeReport(n) for n in cluster.names]
    cluster_checks.straggler_findings({"c-master": 1.0, "c-worker-1": 3.3, "c-worker-2": 3.5}, "", None, shared, shared_cpus=2)
    assert shared[0].verdict == "warn", "sharing one machine's cores, the slow node is where the load sits: a warning"
    assert shared[0].reason().endswith("(the nodes share 2 cores): the straggler")
    [failed] = cluster_checks.straggler_findings(None, "mpirun: rank 2 died", None, [])
    assert failed.status == "fail" and "rank 2 died" in failed.detail


def test_a_node_short_of_what_the_flavor_promises_is_named():
    """OpenStack's cluster output carries the flavor's vCPUs and RAM (the preflight read
    them from Nova): a VM short of them warns, even when every node is as short."""
    gib = 1 << 30
    nodes = [_node(n, size={"cpus": c, "memory_bytes": m * gib}) for n, c, m in (("a", 8, 31), ("b", 4, 31), ("c", 8, 24))]
    analyse.size(nodes, {"flavor": "g1.large", "vcpus": 8, "ram_mb": 32768})
    assert [n.verdict for n in nodes] == ["pass", "warn", "warn"]
    assert nodes[1].reason() == "size: 4 CPU(s), the flavor promises 8"
    assert nodes[2].reason() == "size: 24.0 GiB of memory, the flavor promises 32.0 GiB"
    alike = [_node(n, size={"cpus": 4, "memory_bytes": 31 * gib}) for n in ("a", "b")]
    analyse.size(alike, {"vcpus": 8, "ram_mb": 32768})
    assert [n.reason() for n in alike] == ["size: 4 CPU(s), the flavor promises 8"] * 2


def _node_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("node_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("files", "memory", "cpus", "source"), [
    # a local node: cgroup v1, its container's limit and no CPU quota (as LXC writes them)
    ({"memory/memory.limit_in_bytes": "1610612736", "cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"},
     1536 << 20, None, "cgroup"),
    # cgroup v2 with a quota of half a CPU and a limit
    ({"memory.max": "805306368", "cpu.max": "50000 100000"}, 768 << 20, 1, "cgroup"),
    # a VM: v1 with no limit (PAGE_COUNTER_MAX's bytes), or v2 at its root (no memory.max): MemTotal stands
    ({"memory/memory.limit_in_bytes": "9223372036854771712"}, 64 << 30, None, "meminfo"),
    ({"cpu.max": "max 100000"}, 64 << 30, None, "meminfo"),
])
def test_a_nodes_size_is_its_cgroups_limit_where_it_has_one(tmp_path, files, memory, cpus, source):
    """A container's /proc/meminfo is the host's: the check reads its cgroup's limit, so a
    local node is held to local.memory_mb as a VM is to its flavor."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:       {64 << 20} kB\nMemFree:        1000 kB\n")
    found = _node_script().check_size(str(tmp_path), str(meminfo))
    v = found["value"]
    assert (v["memory_bytes"], v["memory_from"]) == (memory, source)
    assert v["cpus"] == (cpus or len(__import__("os").sched_getaffinity(0)))
    assert ("its cgroup's limit" in found["detail"]) == (source == "cgroup")


def test_a_gpu_node_without_its_driver_fails_and_dcgm_is_skipped_where_absent():
    """--gpus 1 on this machine (no NVIDIA driver, no DCGM): the cluster promised a GPU
    that nvidia-smi cannot show; DCGM's diagnostics are skipped, not failed."""
    token = f"unit-gpu-{time.time_ns()}"
    try:
        found = node_check("--shared", "/dev/shm", "--token", token, "--gpus", "1")
    finally:
        import shutil

        shutil.rmtree(f"/dev/shm/.deployer-check/{token}", ignore_errors=True)
    assert found["gpus"]["status"] == "fail" and "nvidia-smi" in found["gpus"]["detail"]
    assert found["dcgm"]["status"] == "skip" and "not installed" in found["dcgm"]["detail"]
    assert "gpu_run" not in found, "quick: no CUDA run"
