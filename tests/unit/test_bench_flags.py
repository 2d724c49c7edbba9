"""deployer.bench.sweep: flag validation, the remote command strings, output parsing."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex

import pytest

from deployer.bench import commands, profiles
from deployer.bench import sweep as bench
from deployer.cluster import Cluster
from deployer.errors import UsageError
from deployer.launch import iperf, mpirun


def cluster(n: int = 3, gpus: int = 0, user: str = "root") -> Cluster:
    nodes = [{"name": f"demo-{'master' if i == 0 else f'worker-{i}'}", "role": "master" if i == 0 else "worker",
              "private_ip": f"10.10.0.{10 + i}", "public_ip": None, "gpus": gpus} for i in range(n)]
    return Cluster.parse({"name": "demo", "provider": "local", "ssh_user": user, "shared_dir": "/shared", "nodes": nodes})


@pytest.mark.parametrize("text,size,expect", [
    ("1,2,4", 4, (1, 2, 4)),
    (" 4, 1 ,2", 4, (1, 2, 4)),
    ("3", 3, (3,)),
    (None, 3, (1, 2, 3)),
    (None, 8, (1, 2, 4, 8)),
    (None, 6, (1, 2, 4, 6)),
    (None, 1, (1,)),
])
def test_node_counts(text, size, expect):
    assert profiles.parse_node_counts(text, size) == expect


@pytest.mark.parametrize("text,fix", [
    ("a,b", "use e.g. --nodes 1,2,4"),
    ("1,,2", "use e.g. --nodes 1,2,4"),
    ("1.5", "use e.g. --nodes 1,2,4"),
    ("-1,2", "use e.g. --nodes 1,2,4"),
    ("0,1", "start at 1"),
    ("1,2,2", "repeats"),
    ("1,4", "scale the cluster up"),
])
def test_node_counts_rejected(text, fix):
    with pytest.raises(UsageError) as e:
        profiles.parse_node_counts(text, 3)
    assert fix in str(e.value) and "\n" not in str(e.value)
    assert e.value.exit_code == 2


@pytest.mark.parametrize("flags,fix", [
    ({"model": "vgg16"}, "resnet18"),
    ({"batch_size": 0}, "--batch-size"),
    ({"image_size": 16}, "--image-size"),
    ({"mode": "pipeline"}, "dp or ensemble"),
    ({"num_iters": 0}, "--num-iters"),
    ({"allreduce_max": "lots"}, "K/M/G"),
    ({"allreduce_min": "1M", "allreduce_max": "1K"}, "min <= max"),
    ({"allreduce_backend": "nccl"}, "auto, mpi, torch"),
])
def test_options_rejected(flags, fix):
    with pytest.raises(UsageError) as e:
        profiles.make_options(cluster(), nodes="1,2", **flags)
    assert fix in str(e.value)


def test_options_accepted():
    o = profiles.make_options(cluster(), nodes="3,1", model="resnet18", batch_size=4, image_size=32,
                           mode="ensemble", allreduce_max="1G")
    assert o.nodes == (1, 3) and o.mode == "ensemble" and profiles.size_bytes(o.allreduce_max) == 1 << 30


def test_mpirun_command_cpu_root():
    c = cluster(3)
    cmd = commands.mpirun_cmd(c, "r1", 2, 600, "resnet_synthetic.py",
                           commands.resnet_args(profiles.make_options(c, nodes="2", fp16_allreduce=True), "dp"))
    argv = shlex.split(cmd)
    assert argv[:4] == ["timeout", "--kill-after=30", "600", "mpirun"]
    assert "--allow-run-as-root" in argv
    assert argv[argv.index("--hostfile") + 1] == "/shared/bench/r1/hostfile.2"
    assert argv[argv.index("-np") + 1] == "2"  # one rank per CPU node
    i = argv.index("python")
    assert argv[i + 1] == "/shared/benchmarks/resnet_synthetic.py"
    assert {"--json", "--fp16-allreduce"} <= set(argv[i:])
    assert argv[argv.index("--mode") + 1] == "dp"


def test_mpirun_command_gpus_counts_slots():
    c = cluster(3, gpus=8, user="ubuntu")
    argv = shlex.split(commands.mpirun_cmd(c, "r1", 3, 60, "allreduce.py", ["--json"]))
    assert argv[argv.index("-np") + 1] == "24"
    assert "--allow-run-as-root" not in argv


def test_hostfiles_and_cleanup_commands():
    c = cluster(3)
    assert commands.hostfiles_cmd(c, "r1", (1, 2, 3)) == (
        "mkdir -p /shared/bench/r1 && for n in 1 2 3; do head -n $n /shared/hostfile > "
        "/shared/bench/r1/hostfile.$n; done")
    cmd = mpirun.cleanup_cmd(c)
    for ip in ("10.10.0.10", "10.10.0.11", "10.10.0.12"):
        assert ip in cmd
    # the pkill pattern, after both shells unquote it, matches the ranks' command lines
    # but not the cleanup command itself (else pkill would kill its own shell)
    remote = shlex.split(cmd.split(" $h ", 1)[1].split(";")[0])[0]
    pattern = shlex.split(remote)[2]
    assert re.search(pattern, "python /shared/benchmarks/resnet_synthetic.py --json")
    assert not re.search(pattern, cmd)


def test_parse_json_line():
    out = "Model: resnet18\nTotal img/sec on 2 CPU(s): 30.0 +-1.0\n" + json.dumps({"img_per_sec": 30.0}) + "\n"
    assert mpirun.parse_json_line(out, "x") == {"img_per_sec": 30.0}
    with pytest.raises(bench.OperationFailed, match="no JSON"):
        mpirun.parse_json_line("Model: resnet18\n", "resnet")


def test_parse_iperf():
    out = json.dumps({"end": {"sum_received": {"bits_per_second": 9.41e9}, "sum_sent": {}}})
    assert iperf.parse_iperf("warning first\n" + out) == pytest.approx(9.41)


def test_parse_iperf_bidir_takes_the_slower_direction():
    out = json.dumps({"end": {"sum_received": {"bits_per_second": 8e9},
                              "sum_received_bidir_reverse": {"bits_per_second": 6e9}}})
    assert iperf.parse_iperf(out) == pytest.approx(6.0)
    assert iperf.iperf_cmd("10.0.0.2", bidir=True).endswith("-J -t 3 --bidir")


# ---- profiles and threads -------------------------------------------------------------------


def test_cpu_only_clusters_get_the_quick_profile_and_are_told_why():
    o = profiles.make_options(cluster(3), nodes=None)
    assert o.profile == "quick" and (o.model, o.image_size, o.batch_size) == ("resnet18", 64, 16)
    assert "--profile horovod" in o.profile_reason


def test_gpu_clusters_keep_horovods_defaults():
    o = profiles.make_options(cluster(2, gpus=4), nodes=None)
    assert o.profile == "horovod" and (o.model, o.image_size, o.batch_size, o.num_iters) == ("resnet50", 224, 32, 10)


def test_flags_override_the_profile():
    o = profiles.make_options(cluster(3), nodes="1", profile="horovod", model="resnet18", num_iters=2)
    assert (o.profile, o.model, o.image_size, o.num_iters) == ("horovod", "resnet18", 224, 2)


def test_unknown_profile_names_the_choices():
    with pytest.raises(UsageError, match="quick, standard, horovod"):
        profiles.make_options(cluster(3), nodes="1", profile="fast")


def test_threads_per_rank_for_nodes_sharing_cores():
    shared = dataclasses.replace(cluster(3), shared_cpus=2)
    o = profiles.make_options(shared, nodes="1,2,3")
    assert o.threads == 1  # 3 ranks on 2 cores: one thread each, at every N
    assert commands.resnet_args(o, "dp")[-2:] == ["--threads", "1"]
    assert profiles.cpu_sharing(shared, o) == {"shared_cpus": 2, "threads_per_rank": 1,
                                            "efficiency_ceiling": {"1": 1.0, "2": 1.0, "3": 0.667}}
    big = dataclasses.replace(cluster(3), shared_cpus=16)
    assert profiles.make_options(big, nodes="1,2").threads == 8
    assert profiles.make_options(big, nodes="1,2", threads=3).threads == 3  # asked for
    # Nodes with their own CPUs: the benchmark sizes itself, nothing to report.
    o = profiles.make_options(cluster(3), nodes="1,2")
    assert o.threads is None and "--threads" not in commands.resnet_args(o, "dp") and profiles.cpu_sharing(cluster(3), o) is None
    with pytest.raises(UsageError, match="--threads"):
        profiles.make_options(cluster(3), nodes="1", threads=0)


# ---- the pairwise network check ---------------------------------------------------------------


def test_net_pairs_every_pair_up_to_eight_then_a_ring():
    three = [(a.name, b.name) for a, b in iperf.net_pairs(cluster(3))]
    assert three == [("demo-master", "demo-worker-1"), ("demo-master", "demo-worker-2"), ("demo-worker-1", "demo-worker-2")]
    assert len(iperf.net_pairs(cluster(8))) == 28
    ring = [(a.name, b.name) for a, b in iperf.net_pairs(cluster(10))]
    assert len(ring) == 10 and ring[-1] == ("demo-worker-9", "demo-master")


def test_pair_command_runs_the_server_on_the_receiver():
    argv = shlex.split(iperf.pair_cmd("10.10.0.11", "10.10.0.12"))
    assert argv[:4] == ["ssh", "-o", "BatchMode=yes", "10.10.0.12"] and argv[4:8] == ["iperf3", "-s", "-1", "-D"]
    assert argv[-8:] == ["timeout", "30", "iperf3", "-c", "10.10.0.12", "-J", "-t", "2"]
    assert argv[argv.index("10.10.0.11") - 3] == "ssh"


def test_network_summary_names_the_slowest_link_table_and_plot(tmp_path):
    from deployer.bench import metrics
    from deployer.bench import report as bench_report

    pairs = [{"src": "d-master", "dst": "d-worker-1", "gbit_s": 9.0}, {"src": "d-master", "dst": "d-worker-2", "gbit_s": 1.5},
             {"src": "d-worker-1", "dst": "d-worker-2", "gbit_s": None}]
    net = bench_report.network_summary(pairs)
    assert net["slowest"]["dst"] == "d-worker-2" and net["median_gbit_s"] == 5.25
    report = bench_report.aggregate("r1", [], network=net)
    rows = [[c._cells[i] for c in bench_report.network_table(report).columns] for i in range(3)]
    assert rows[0][:3] == ["d-worker-1", "d-worker-2", "—"] and rows[1][2] == "1.50" and rows[1][3] == "29%"
    paths = bench_report.plot(report, tmp_path)
    assert [p.name for p in paths] == ["network.png"] and paths[0].read_bytes()[:4] == b"\x89PNG"
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in metrics.bench_registry(report).collect() for s in f.samples}
    assert got[("deployer_bench_pair_gbit_s", (("dst", "d-worker-2"), ("src", "d-master")))] == 1.5
