"""`deployer bench --nodes 1,2` on the real local cluster (resnet18, 32x32 images)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_json_schema(live_cluster):
    r = live_cluster.bench
    assert set(r) >= {"run_id", "results", "allreduce", "link", "files", "versions"}
    assert [x["nodes"] for x in r["results"] if x.get("mode", "dp") == "dp"] == [1, 2]
    for x in r["results"]:
        assert set(x) >= {"nodes", "ranks", "img_per_sec", "img_per_sec_per_rank", "efficiency"}
        assert x["img_per_sec"] > 0
        assert x["img_per_sec_per_rank"] == pytest.approx(x["img_per_sec"] / x["ranks"], rel=1e-6)
    one, two = r["results"][0], r["results"][1]
    assert one["efficiency"] == pytest.approx(1.0)
    assert two["efficiency"] == pytest.approx(two["img_per_sec"] / (2 * one["img_per_sec"]), rel=1e-6)
    for a in r["allreduce"]:
        assert set(a) >= {"nodes", "bytes", "time_us", "algbw_gb_s", "busbw_gb_s", "wrong"}
        assert a["wrong"] == 0 and a["nodes"] == 2
        assert a["busbw_gb_s"] == pytest.approx(a["algbw_gb_s"] * 2 * (2 - 1) / 2, rel=1e-6)
    assert r["link"]["tool"] == "iperf3" and r["link"]["gbit_s"] > 0


def test_files_saved_in_the_state_dir(live_cluster):
    files = live_cluster.bench["files"]
    run_dir = live_cluster.cluster.state / "bench" / live_cluster.bench_run_id
    assert Path(files["json"]).parent == run_dir
    assert json.loads(Path(files["json"]).read_text())["run_id"] == live_cluster.bench_run_id
    header = Path(files["csv"]).read_text().splitlines()[0].split(",")
    assert {"nodes", "img_per_sec", "efficiency", "busbw_gb_s"} <= set(header)
    assert files["plots"] and all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in files["plots"])


def test_reproducibility_record(live_cluster):
    v = live_cluster.bench["versions"]
    text = json.dumps(v)
    assert "torch" in text and "Open MPI" in text
    assert v["provider"] == "local" and v["node_counts"] == [1, 2]
    assert v["flags"]["model"] == "resnet18" and v["flags"]["image_size"] == 32
    assert v["image"].startswith("debian-bookworm") and v["flavor"] == "container: 2048 MiB"
    assert v["benchmark"]["kernel"] and v["benchmark"]["torch"].startswith("2.13")


def test_every_pair_of_nodes_measured_and_the_slowest_named(live_cluster):
    net = live_cluster.bench["network"]
    pairs = {(p["src"], p["dst"]) for p in net["pairs"]}
    name = live_cluster.cluster.name
    assert pairs == {(f"{name}-master", f"{name}-worker-1"), (f"{name}-master", f"{name}-worker-2"),
                     (f"{name}-worker-1", f"{name}-worker-2")}
    assert all(p["gbit_s"] > 0 for p in net["pairs"]) and net["slowest"] in net["pairs"]
    assert any(Path(p).name == "network.png" for p in live_cluster.bench["files"]["plots"])
    assert "slowest link" in live_cluster.bench_stderr


def test_timeline_of_every_rank_in_one_trace(live_cluster):
    trace = json.loads(Path(live_cluster.bench["files"]["timeline"]).read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    name = live_cluster.cluster.name
    assert names == {0: f"rank 0 ({name}-master)", 1: f"rank 1 ({name}-worker-1)"}


def test_the_report_says_whether_nodes_share_cores(live_cluster):
    import os

    v = live_cluster.bench["versions"]
    assert v["flags"]["profile"] in ("quick", "horovod", "standard")
    sharing = v["cpu_sharing"]
    if len(os.sched_getaffinity(0)) < 3:  # fewer cores than the 3 nodes: they share them
        assert sharing["shared_cpus"] >= 1 and sharing["threads_per_rank"] >= 1
        assert set(sharing["efficiency_ceiling"]) == {"1", "2"}
        assert "thread(s) per rank" in live_cluster.bench_stderr
        assert "nodes share this machine's" in live_cluster.cluster.up_log
    else:  # each node pinned to cores of its own
        assert sharing is None and "cores: each node has its own" in live_cluster.cluster.up_log


def test_results_pushed_to_pushgateway(live_cluster):
    assert "pushed to the Pushgateway" in live_cluster.bench_stderr


def test_no_benchmark_process_left_on_any_node(live_cluster):
    for node in ("master", "worker-1", "worker-2"):
        p = live_cluster.cluster.deployer("ssh", node, "--", "pgrep -f '[/]shared/benchmarks/' || true")
        assert p.stdout.strip() == "", f"{node}: {p.stdout}"


def test_bad_bench_input_exits_2_and_runs_nothing(live_cluster):
    runs = sorted((live_cluster.cluster.state / "bench").iterdir())
    for args in (["--nodes", "0"], ["--nodes", "1,9"], ["--nodes", "2,2"], ["--nodes", "x"], ["--model", "vgg"], ["--batch-size", "0"],
                 ["--via", "slurm"], ["--via", "pbs"]):
        p = live_cluster.cluster.deployer("bench", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert len([line for line in p.stderr.splitlines() if line.strip()]) == 1, p.stderr
        if args == ["--via", "slurm"]:  # this cluster has no Slurm: say how to get it
            assert "set scheduler: slurm in cluster.yaml and re-run `deployer up`" in p.stderr, p.stderr
    assert sorted((live_cluster.cluster.state / "bench").iterdir()) == runs, "no run was started"


def test_same_run_typed_by_hand_on_the_master(live_cluster):
    # The README's hand-typed run: plain mpirun from the master.
    cmd = "mpirun -np 2 --hostfile /shared/hostfile python /shared/benchmarks/allreduce.py -b 1K -e 64K -c 1"
    p = live_cluster.cluster.deployer("ssh", "--", cmd, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "# Out of bounds values : 0 OK" in p.stdout and "# Avg bus bandwidth" in p.stdout


def _ranks_on(node: str) -> str:
    p = subprocess.run(["lxc-attach", "-n", node, "--", "pgrep", "-f", "[r]esnet_synthetic"], capture_output=True, text=True)
    return p.stdout.strip()


def test_a_rank_killed_mid_run_is_named_and_nothing_is_left(live_cluster):
    c = live_cluster.cluster
    worker = f"{c.name}-worker-1"
    args = ["bench", "--nodes", "2", "--model", "resnet18", "--image-size", "64", "--num-iters", "200"]
    proc = subprocess.Popen([sys.executable, "-m", "deployer", *args], cwd=c.workdir, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not _ranks_on(worker):
            assert time.monotonic() < deadline and proc.poll() is None, "rank 1 never started"
            time.sleep(1)
        time.sleep(5)  # into the run
        subprocess.run(["lxc-attach", "-n", worker, "--", "pkill", "-9", "-f", "[r]esnet_synthetic"], check=True)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"killed rank -> deployer bench exit: {took:.1f}s")  # for the closing note
    assert proc.returncode == 1, err[-2000:]
    assert f"rank 1 on {worker} was killed by signal 9 (Killed)" in err, err[-2000:]
    assert took < 30
    for node in ("master", "worker-1", "worker-2"):
        assert not _ranks_on(f"{c.name}-{node}"), f"{node} still runs a rank"
