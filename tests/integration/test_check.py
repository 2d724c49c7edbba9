"""`deployer check` on the real local cluster: a healthy cluster passes, and injected
faults are found and named: a node given half the memory the spec says is short, a
node whose link is throttled (tc on both ends of its veth)
is the slow node, a node with a CPU hog is the straggler, a rank stopped (SIGSTOP) in the
middle of the straggler step is named within the stated time and nothing is left
running, a node whose shared dir is unmounted fails with the command that replaces it,
and `up --replace-failed` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _in_node(name: str, script: str) -> None:
    """A shell script run as root in the node (lxc-attach: its namespaces, its root)."""
    subprocess.run(["lxc-attach", "-n", name, "--", "sh", "-ec", script], check=True, capture_output=True, text=True)


def unmount_shared(node: str) -> None:
    """The node's /shared unmounted (lazily: a process may sit in it), as when its NFS
    mount went: the node now writes to a directory of its own root disk."""
    _in_node(node, "umount -l /shared")


@contextmanager
def throttled(node: str, rate: str = "200mbit") -> Iterator[None]:
    """The node's link throttled both ways: tc on the host's end of its veth (traffic to
    the node) and on the node's eth0 (traffic from it)."""
    veth = next(line.split()[-1] for line in subprocess.run(["lxc-info", "-n", node], capture_output=True, text=True,
                                                             check=True).stdout.splitlines() if line.startswith("Link:"))
    tbf = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms"]
    subprocess.run(["tc", "qdisc", "add", "dev", veth, *tbf], check=True)
    try:
        _in_node(node, "tc qdisc add dev eth0 " + " ".join(tbf))
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
        subprocess.run(["lxc-attach", "-n", node, "--", "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)


@contextmanager
def cpu_hog(node: str, loops: int = 3, share: float = 0.25) -> Iterator[Callable[[], str]]:
    """Busy loops on the node, within a CPU budget of its own, as in a VM: the node's
    cgroup is capped at `share` of a core (local nodes otherwise share this machine's
    cores with every other node, so a hog would slow them all alike), and the loops eat
    that budget beside the node's rank. Yields what says the hog is on (for a failure's
    message)."""
    v1 = Path(f"/sys/fs/cgroup/cpu/lxc.payload.{node}/cpu.cfs_quota_us")
    v2 = Path(f"/sys/fs/cgroup/lxc.payload.{node}/cpu.max")
    cap, uncapped = (v1, "-1") if v1.exists() else (v2, "max 100000")
    cap.write_text(str(int(share * 100000)) if cap is v1 else f"{int(share * 100000)} 100000")
    _in_node(node, f"for i in $(seq {loops}); do setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & done")
    try:
        yield lambda: hog_state(node, cap)
    finally:
        subprocess.run(["lxc-attach", "-n", node, "--", "pkill", "-9", "-f", "while :; do :; done"], check=False)
        cap.write_text(uncapped)


def hog_state(node: str, cap: Path) -> str:
    """The cap, how often the node was throttled under it, and the busy loops still running."""
    stat = cap.with_name("cpu.stat").read_text().split()
    loops = subprocess.run(["lxc-attach", "-n", node, "--", "pgrep", "-c", "-f", "while :; do :; done"],
                           capture_output=True, text=True).stdout.strip()
    return f"{cap.name}={cap.read_text().strip()}, cpu.stat {' '.join(stat)}, busy loops {loops or 0}"


def _findings(report: dict, check: str) -> dict[str, dict]:
    """Each node's finding of `check` (the cluster's own findings of it, where a node has none)."""
    found = {n["name"]: next((f for f in n["findings"] if f["check"] == check), None) for n in report["nodes"]}
    assert all(found.values()), [f for f in report["cluster_findings"] if f["check"] == check] or report
    return found  # type: ignore[return-value]


def test_a_healthy_cluster_passes_and_the_report_is_kept(local_cluster):
    p = local_cluster.deployer("check", "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout)
    assert [n["name"] for n in report["nodes"]] == local_cluster.cluster_output().names
    ram_mb = local_cluster.cluster_output().machine["ram_mb"]
    assert report["verdict"] in ("pass", "warn"), [(n["name"], n["reason"]) for n in report["nodes"]]
    for node in report["nodes"]:
        found = {f["check"]: f for f in node["findings"]}
        assert found["shared_dir"]["status"] == "pass" and found["runtime"]["status"] == "pass", node
        assert abs(found["clock"]["value"]["offset_s"]) < 1.0, "the containers keep this machine's time"
        # A container's /proc/meminfo is the host's: the size is its cgroup's limit, local.memory_mb
        size = found["size"]["value"]
        assert (size["memory_bytes"], size["memory_from"]) == (ram_mb << 20, "cgroup"), node
    assert "check (quick) of cluster itest" in p.stderr
    assert json.loads((local_cluster.state / "check.json").read_text())["verdict"] == report["verdict"]


@contextmanager
def memory_capped(node: str, mb: int) -> Iterator[None]:
    """The node's container given less memory than the spec says (its cgroup's limit
    lowered live, as a host short of memory or a hand-edited config would leave it)."""
    v1 = Path(f"/sys/fs/cgroup/memory/lxc.payload.{node}/memory.limit_in_bytes")
    limit = v1 if v1.exists() else Path(f"/sys/fs/cgroup/lxc.payload.{node}/memory.max")
    was = limit.read_text().strip()
    limit.write_text(str(mb << 20))
    try:
        yield
    finally:
        limit.write_text(was)


def test_a_node_given_less_memory_than_the_spec_is_named(local_cluster):
    small = local_cluster.cluster_output().workers[-1].name
    ram_mb = local_cluster.cluster_output().machine["ram_mb"]
    with memory_capped(small, ram_mb // 2):
        p = local_cluster.deployer("check", "--json", timeout=300)
    size = _findings(json.loads(p.stdout), "size")
    assert size[small]["status"] == "warn", size
    assert size[small]["detail"] == f"{ram_mb / 2048:.1f} GiB of memory, the flavor promises {ram_mb / 1024:.1f} GiB", size
    assert all(f["status"] == "pass" for name, f in size.items() if name != small), size


def test_a_throttled_link_names_the_slow_node(local_cluster):
    slow = local_cluster.cluster_output().workers[-1].name
    with throttled(slow):
        p = local_cluster.deployer("check", "--level", "standard", "--json", timeout=900)
    report = json.loads(p.stdout)
    network = _findings(report, "network")
    assert network[slow]["status"] in ("warn", "fail") and "the slow node" in network[slow]["detail"], network
    assert all(f["status"] == "pass" for name, f in network.items() if name != slow), network
    assert "iperf3 on 3 pair(s)" in p.stderr


def test_a_node_with_a_cpu_hog_is_the_straggler(local_cluster):
    busy = local_cluster.cluster_output().workers[0].name
    with cpu_hog(busy) as state:
        p = local_cluster.deployer("check", "--level", "standard", "--json", timeout=900)
        hog = state()
    report = json.loads(p.stdout)
    straggler = _findings(report, "straggler")
    said = f"{busy} hogged ({hog}): " + "; ".join(f"{name}: {f['status']}, {f['detail']}" for name, f in straggler.items())
    assert straggler[busy]["status"] in ("warn", "fail") and "the straggler" in straggler[busy]["detail"], said
    # The slowest node is the busy one (the master, which also carries the SSH hops and
    # the monitoring, may read slow beside it; it is not asserted to pass).
    rates = {name: f["value"]["img_per_sec"] for name, f in straggler.items()}
    assert min(rates, key=rates.get) == busy, said


def test_a_rank_that_stops_mid_check_is_named_in_the_stated_time(local_cluster):
    """A rank of the straggler step (the check's longest MPI program: seconds of windows)
    SIGSTOPped on a worker: its heartbeat stops, the watch names it (node, rank, step)
    after rank_watch's quiet time, and stops the run cleanly: nothing is left running."""
    from deployer.check.cluster_checks import QUIET_S

    frozen = local_cluster.cluster_output().workers[0].name
    proc = subprocess.Popen([sys.executable, "-m", "deployer", "check", "--level", "standard", "--json"],
                            cwd=local_cluster.workdir, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ})
    try:
        pid = ""
        deadline = time.monotonic() + 600
        while not pid and time.monotonic() < deadline and proc.poll() is None:
            pid = subprocess.run(["lxc-attach", "-n", frozen, "--", "pgrep", "-f", "benchmarks/resnet_synthetic.py"],
                                 capture_output=True, text=True).stdout.split("\n")[0].strip()
            time.sleep(0.3)
        assert pid, "the straggler step never ran on the worker"
        time.sleep(5)  # into its step (stopped in its imports instead, it is named all the same, 60 s later)
        stop = subprocess.run(["lxc-attach", "-n", frozen, "--", "kill", "-STOP", pid], capture_output=True, text=True)
        assert stop.returncode == 0, f"the rank ended before it could be stopped: {stop.stderr}"
        stopped_at = time.monotonic()
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:  # a failed assertion above: the check must not outlive the test
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, err[-3000:]
    report = json.loads(out)
    straggler = next(f for n in report["nodes"] if n["name"] == frozen for f in n["findings"] if f["check"] == "straggler")
    assert straggler["status"] == "fail" and f"on {frozen} silent for {QUIET_S:.0f} s" in straggler["detail"], straggler
    assert "nothing is left running" in straggler["detail"]
    left = subprocess.run(["lxc-attach", "-n", frozen, "--", "pgrep", "-f", "benchmarks/"], capture_output=True, text=True)
    assert left.returncode == 1, f"left running: {left.stdout}"
    # Named once its quiet time passed, not before.
    assert time.monotonic() - stopped_at >= QUIET_S


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
