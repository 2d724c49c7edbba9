"""deployer.bench.sweep.run_bench in the fast tier: a recorded sweep replayed.

tests/fixtures/bench/sweep_2node_recorded.json holds every command a real 2-rank sweep
sent to the master and what came back (recorded from the slow tier's
test_sweep_on_fake_cluster: real mpirun, torch, iperf3 on this machine). Here the same
commands get the same answers, so the sweep's logic (the order of runs, parsing,
efficiency, the report and its files) is checked in seconds; the slow tier runs it for real.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deployer.bench import profiles
from deployer.bench import sweep as bench
from deployer.cluster import Cluster
from deployer.launch import mpirun

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "sweep_2node_recorded.json").read_text())


def _kind(cmd: str) -> str:
    """What a command runs (its script or tool), paths aside."""
    m = re.search(r"(resnet_synthetic\.py|allreduce\.py|iperf3 -c \S+(?: -J -t \d+)?(?: --bidir)?|hostfile)", cmd)
    return m.group(1) if m else cmd.split()[0]


class ReplayRunner:
    def __init__(self, shared: str):
        self.shared = shared
        self.calls = list(RECORDED["calls"])
        self.commands: list[str] = []

    def run(self, cmd: str, *, timeout: float, on_line=None) -> tuple[int, str, str]:
        self.commands.append(cmd)
        want = self.calls.pop(0)
        assert _kind(cmd) == _kind(want["cmd"]), f"sent {cmd!r}, the recorded sweep sent {want['cmd']!r} here"
        if on_line:
            for line in want["stdout"].splitlines():
                on_line(line)
        return want["rc"], want["stdout"], want["stderr"]


@pytest.fixture
def replay(tmp_path):
    shared = str(tmp_path / "shared")
    cluster = Cluster.parse(json.loads(json.dumps(RECORDED["cluster"]).replace("{shared}", shared)))
    return cluster, ReplayRunner(shared)


def test_the_recorded_sweep_makes_the_same_report(replay, tmp_path):
    cluster, runner = replay
    opts = profiles.make_options(cluster, nodes="1,2", model="resnet18", batch_size=2, image_size=32,
                              num_warmup_batches=1, num_batches_per_iter=2, num_iters=2,
                              allreduce_min="1K", allreduce_max="16K", run_timeout_s=300, net=True)
    out = tmp_path / "bench" / "run1"
    rep = bench.run_bench(runner, cluster, opts, "run1", out)
    assert runner.calls == [], "every recorded command was sent, in order"
    assert [(r["nodes"], r["ranks"]) for r in rep["results"]] == [(1, 1), (2, 2)]
    one, two = rep["results"]
    assert one["efficiency"] == pytest.approx(1.0)
    assert two["efficiency"] == pytest.approx(two["img_per_sec"] / (2 * one["img_per_sec"]))
    assert [r["bytes"] for r in rep["allreduce"]] == [1024, 2048, 4096, 8192, 16384]
    assert rep["link"]["gbit_s"] > 0 and rep["network"]["slowest"]["src"] == "t-master"
    assert json.loads((out / "results.json").read_text())["run_id"] == "run1"
    assert (out / "commands.sh").read_text().splitlines()[1:] == runner.commands


def test_a_failed_run_cleans_up_and_names_the_log(replay, tmp_path):
    cluster, runner = replay
    runner.calls[1] = {**runner.calls[1], "rc": 1, "stdout": "", "stderr": "mpirun: something broke"}
    runner.calls.insert(2, {"cmd": mpirun.cleanup_cmd(cluster), "rc": 0, "stdout": "", "stderr": ""})
    opts = profiles.make_options(cluster, nodes="1,2", model="resnet18", run_timeout_s=300)
    from deployer.errors import OperationFailed

    with pytest.raises(OperationFailed, match="resnet-dp-1 failed"):
        bench.run_bench(runner, cluster, opts, "run1", tmp_path / "bench" / "run1")
    assert runner.commands[2] == mpirun.cleanup_cmd(cluster), "no rank is left running"
