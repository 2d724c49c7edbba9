"""The benchmark scripts under a real mpirun on this machine (2 ranks over loopback),
and deployer.bench's sweep against a fake two-node cluster made of loopback addresses.

Skipped, with the reason, only where mpirun, torch or mpi4py are missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

missing = [m for m in ("torch", "mpi4py", "numpy") if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed"),
    pytest.mark.skipif(bool(missing), reason=f"python packages missing: {', '.join(missing)}"),
]


def mpi_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",  # 2 ranks may exceed the cores here
        OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo",  # loopback only
        GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
    )
    env.pop("MASTER_ADDR", None)
    env.pop("MASTER_PORT", None)
    env.update(extra)
    return env


def mpirun(np_: int, script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = ["mpirun", "-np", str(np_), "--bind-to", "none", sys.executable, str(BENCH / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout, env=mpi_env())


def last_json(stdout: str) -> dict:
    return json.loads([ln for ln in stdout.splitlines() if ln.startswith("{")][-1])


@pytest.mark.parametrize("backend", ["mpi", "torch"])
def test_allreduce_two_ranks(backend):
    p = mpirun(2, "allreduce.py", "-b", "1K", "-e", "64K", "-c", "1", "-n", "5", "-w", "2",
               "--backend", backend, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    res = last_json(p.stdout)
    assert res["backend"] == backend and res["world_size"] == 2
    assert [r["bytes"] for r in res["rows"]] == [1024 << i for i in range(7)]
    for r in res["rows"]:
        assert r["wrong"] == 0
        assert r["count"] == r["bytes"] // 4
        assert 0 < r["time_us"] < 1e6
        # algbw = S / t, and busbw = algbw * 2(n-1)/n = algbw for two ranks; the record
        # rounds GB/s to 6 decimals, so a slow run's tiny figure is compared to that grain.
        assert r["algbw_gb_s"] == pytest.approx(r["bytes"] / 1e9 / (r["time_us"] / 1e6), rel=1e-3, abs=1e-6)
        assert r["busbw_gb_s"] == pytest.approx(r["algbw_gb_s"])
    assert res["wrong"] == 0
    assert "# Avg bus bandwidth    :" in p.stdout and "# Out of bounds values : 0 OK" in p.stdout
    assert re.search(r"^\s+1024\s+256\s+float\s+sum\s+-1\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+0$", p.stdout, re.MULTILINE)
    assert res["versions"]["mpi"].startswith("Open MPI")


def test_allreduce_check_catches_a_wrong_sum():
    # the same check, fed an all-reduce that returns zeros, must count every element
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import allreduce as a; "
            "a.MpiOp.run = lambda self: self.recv.fill(0); "
            "sys.exit(a.main(['-b', '1K', '-e', '2K', '-n', '1', '-w', '0', '--backend', 'mpi', '--json']))")
    p = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, check=False,
                       timeout=120, env=mpi_env())
    assert p.returncode == 1, p.stderr[-2000:]
    res = last_json(p.stdout)
    assert [r["wrong"] for r in res["rows"]] == [256, 512]
    assert "FAILED" in p.stdout


def test_builtin_resnet_matches_torchvision_sizes():
    # parameter counts of torchvision's resnet18/50 (11,689,512 and 25,557,032)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import resnet_synthetic as r; "
            "print([sum(p.numel() for p in r.ResNet(*r.ARCH[m]).parameters()) for m in ('resnet18', 'resnet50')])")
    p = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, check=False,
                       timeout=120, env=mpi_env())
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[11689512, 25557032]"


def test_nccl_version_in_both_forms_torch_reports():
    # torch.cuda.nccl.version(): a tuple on current torch, NCCL_VERSION_CODE (an int) on old
    # torch, coded major*1000+minor*100+patch before NCCL 2.9 and major*10000+... from 2.9 on
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import resnet_synthetic as r; "
            "print([r.nccl_version_text(v) for v in ((2, 21, 5), [2, 18, 1], 2708, 2804, 20906, 21805)], r.gpu_inventory(False))")
    p = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, check=False,
                       timeout=120, env=mpi_env())
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "['2.21.5', '2.18.1', '2.7.8', '2.8.4', '2.9.6', '2.18.5'] (0, None)"


TINY = ["--model", "resnet18", "--image-size", "32", "--batch-size", "2", "--num-warmup-batches", "1",
        "--num-batches-per-iter", "2", "--num-iters", "2", "--json"]


@pytest.mark.parametrize("mode", ["dp", "ensemble"])
def test_resnet_two_ranks(mode):
    p = mpirun(2, "resnet_synthetic.py", *TINY, "--mode", mode)
    assert p.returncode == 0, p.stderr[-2000:]
    for line in ("Model: resnet18", "Batch size: 2", "Number of CPUs: 2", "Running warmup...",
                 "Running benchmark..."):
        assert line in p.stdout.splitlines()
    assert re.search(r"^Iter #1: [\d.]+ img/sec per CPU$", p.stdout, re.MULTILINE)
    assert re.search(r"^Img/sec per CPU: [\d.]+ \+-[\d.]+$", p.stdout, re.MULTILINE)
    total_line = re.search(r"^Total img/sec on 2 CPU\(s\): ([\d.]+) \+-[\d.]+$", p.stdout, re.MULTILINE)
    res = last_json(p.stdout)
    assert res["mode"] == mode and res["world_size"] == 2 and res["image_size"] == 32
    assert [r["rank"] for r in res["ranks"]] == [0, 1]
    assert all(r["img_per_sec"] > 0 for r in res["ranks"])
    # the total is the sum of what each rank measured, not 2 x rank 0
    assert res["img_per_sec"] == pytest.approx(sum(r["img_per_sec"] for r in res["ranks"]))
    assert res["img_per_sec_per_rank"] == pytest.approx(res["img_per_sec"] / 2)
    assert float(total_line.group(1)) == pytest.approx(res["img_per_sec"], abs=0.051)
    v = res["versions"]
    assert v["world_size"] == 2 and v["torch"] and v["mpi"].startswith("Open MPI") and v["hosts"]
    assert not {"gpu", "gpu_count", "nccl", "cuda"} & set(v)  # CPU ranks: no GPU record
    assert res["flags"]["mode"] == mode


def test_the_straggler_step_times_every_rank_over_the_same_windows():
    """--seconds-per-iter (the check's straggler step): each iteration is a window every
    rank starts together, at least that long, its rate the batches it finished in it; and
    not with DDP, where one rank's extra step would wait for the others forever."""
    p = mpirun(2, "resnet_synthetic.py", *TINY, "--mode", "ensemble", "--seconds-per-iter", "1", "--heartbeat", "0.2")
    assert p.returncode == 0, p.stderr[-2000:]
    res = last_json(p.stdout)
    assert res["flags"]["seconds_per_iter"] == 1 and len(res["iters_rank0"]) == 2
    assert all(r["img_per_sec"] > 0 for r in res["ranks"])
    assert all(r["window_s"] and len(r["window_s"]) == 2 and min(r["window_s"]) >= 1.0 for r in res["ranks"]), res["ranks"]
    # both ranks beat through their windows (a rank that waits for a slower one beats on
    # until all are done: tests/integration/test_check.py's CPU hog makes one that slow)
    beats = {(b["rank"], b["step"]) for b in (json.loads(x[len("HEARTBEAT "):]) for x in p.stdout.splitlines()
                                              if x.startswith("HEARTBEAT "))}
    assert {(0, "iter 2"), (1, "iter 2")} <= beats, beats
    refused = mpirun(1, "resnet_synthetic.py", *TINY, "--mode", "dp", "--seconds-per-iter", "1")
    assert refused.returncode == 2 and "--seconds-per-iter needs --mode ensemble" in refused.stderr


def test_resnet_one_rank_without_mpirun_flags():
    p = mpirun(1, "resnet_synthetic.py", *TINY, "--channels-last", "--amp")
    assert p.returncode == 0, p.stderr[-2000:]
    res = last_json(p.stdout)
    assert res["world_size"] == 1 and len(res["ranks"]) == 1
    assert res["flags"]["amp"] and res["flags"]["channels_last"]


# --- deployer.bench against a fake cluster: two "nodes" at 127.0.0.1 and 127.0.0.2 ----
SSH_SHIM = """#!/bin/bash
# test stand-in for ssh: drop the options and the host, run the command here
while [[ $# -gt 0 ]]; do
  case "$1" in -o|-p|-i|-l|-F) shift 2 ;; -*) shift ;; *) break ;; esac
done
shift
exec bash -c "$*"
"""


class LocalRunner:
    """Runs the master's commands here, with ssh and python replaced by stand-ins."""

    def __init__(self, bin_dir: Path):
        self.env = mpi_env(PATH=f"{bin_dir}:{os.environ['PATH']}")
        self.env.pop("OMPI_MCA_rmaps_base_oversubscribe")
        self.commands: list[str] = []

    def run(self, cmd: str, *, timeout: float, on_line=None) -> tuple[int, str, str]:
        # The streaming the SSH runner uses (deployer.remote.stream), with bash for ssh.
        from deployer.remote import stream

        self.commands.append(cmd)
        return stream(["bash", "-c", cmd], timeout=timeout, on_line=on_line, env=self.env)


@pytest.fixture
def fake_cluster(tmp_path):
    shared = tmp_path / "shared"
    (shared / "benchmarks").mkdir(parents=True)
    for f in BENCH.glob("*.py"):  # as the training_runtime role copies them
        shutil.copy(f, shared / "benchmarks" / f.name)
    (shared / "hostfile").write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(SSH_SHIM)
    (bin_dir / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    for f in ("ssh", "python"):
        (bin_dir / f).chmod(0o755)
    nodes = [{"name": "t-master", "role": "master", "private_ip": "127.0.0.1", "public_ip": None, "gpus": 0},
             {"name": "t-worker-1", "role": "worker", "private_ip": "127.0.0.2", "public_ip": None, "gpus": 0}]
    user = "root" if os.geteuid() == 0 else os.environ.get("USER", "user")
    from deployer.cluster import Cluster

    cl = Cluster.parse({"name": "t", "provider": "local", "ssh_user": user, "shared_dir": str(shared), "nodes": nodes})
    return cl, LocalRunner(bin_dir)


def test_sweep_on_fake_cluster(fake_cluster, tmp_path):
    from deployer.bench import profiles
    from deployer.bench import sweep as bench

    cl, runner = fake_cluster
    opts = profiles.make_options(cl, nodes="1,2", model="resnet18", batch_size=2, image_size=32,
                              num_warmup_batches=1, num_batches_per_iter=2, num_iters=2,
                              allreduce_min="1K", allreduce_max="16K", run_timeout_s=300, net=True, timeline=True)
    out = tmp_path / "state" / "bench" / "run1"
    rep = bench.run_bench(runner, cl, opts, "run1", out)

    assert [(r["nodes"], r["ranks"]) for r in rep["results"]] == [(1, 1), (2, 2)]
    assert rep["results"][0]["efficiency"] == pytest.approx(1.0)
    two = rep["results"][1]
    assert two["ensemble_img_per_sec"] > 0 and two["comm_share"] < 1
    assert two["efficiency"] == pytest.approx(two["img_per_sec"] / (2 * rep["results"][0]["img_per_sec"]))
    assert [r["bytes"] for r in rep["allreduce"]] == [1024, 2048, 4096, 8192, 16384]
    assert all(r["wrong"] == 0 and r["nodes"] == 2 for r in rep["allreduce"])
    if shutil.which("iperf3"):
        assert rep["link"]["tool"] == "iperf3" and rep["link"]["gbit_s"] > 0
        assert 0 < rep["link"]["bidir_gbit_s"]
        # --net: the one pair of this 2-node cluster, measured by the same runner
        (pair,) = rep["network"]["pairs"]
        assert (pair["src"], pair["dst"]) == ("t-master", "t-worker-1") and pair["gbit_s"] > 0
        assert rep["network"]["slowest"] == pair
    assert (Path(cl.shared_dir) / "bench" / "run1" / "hostfile.1").read_text() == "127.0.0.1 slots=1\n"
    v = rep["versions"]
    assert v["provider"] == "local" and v["node_counts"] == [1, 2] and v["flags"]["model"] == "resnet18"
    assert v["benchmark"]["torch"] and v["allreduce"]["backend"] == "torch"  # auto: gloo on CPU
    assert json.loads((out / "results.json").read_text())["run_id"] == "run1"
    want_plots = 4 if shutil.which("iperf3") else 3  # network.png with --net
    assert len(rep["files"]["plots"]) == want_plots and all(Path(p).exists() for p in rep["files"]["plots"])
    # --timeline: both ranks' torch.profiler traces, one process each, in one file
    trace = json.loads(Path(rep["files"]["timeline"]).read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(names) == [0, 1] and names[0].startswith("rank 0 (")
    assert {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == {0, 1}
    typed = (out / "commands.sh").read_text().splitlines()[1:]
    assert typed == runner.commands  # the record of the runs is exactly what ran


def test_hung_run_is_killed_and_reported(fake_cluster, tmp_path):
    from deployer.bench import profiles
    from deployer.bench import sweep as bench
    from deployer.errors import OperationFailed

    cl, runner = fake_cluster
    # a run that cannot finish inside its 3 s bound stands in for a hung rank
    opts = profiles.make_options(cl, nodes="2", model="resnet50", batch_size=8, image_size=64,
                              num_warmup_batches=50, run_timeout_s=3)
    with pytest.raises(OperationFailed) as e:
        bench.run_bench(runner, cl, opts, "run2", tmp_path / "out")
    assert "timed out" in str(e.value) and "resnet-dp-2" in str(e.value)
    assert e.value.log and e.value.log.exists()
    assert "pkill" in runner.commands[-1]
    left = subprocess.run(["pgrep", "-f", f"{cl.shared_dir}/benchmarks/"], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", "benchmark processes survived the cleanup"


def test_the_check_names_a_rank_that_stops_and_leaves_nothing_running(monkeypatch):
    """benchmarks/pingpong.py (the check's latency matrix) under a real mpirun here, one
    rank SIGSTOPped once it beats: rank_watch names that rank and its step after the quiet
    time, and the stop (every benchmark process killed, as on the nodes) ends the run."""
    import signal
    import threading

    from deployer.launch import rank_watch
    from deployer.remote import stream
    from tests.clusters import typed

    cluster = typed({"name": "c", "shared_dir": str(BENCH.parent), "nodes": [{"name": "c-master"}, {"name": "c-worker-1"}]})
    cmd = ["mpirun", "--tag-output", "-np", "2", "--bind-to", "none", sys.executable, str(BENCH / "pingpong.py"),
           "--iters", "100000000", "--heartbeat", "0.2"]
    stopped: list[int] = []

    class Runner:  # the master's shell, here
        def run(self, command, *, timeout, on_line=None):
            if "pkill" in command:  # the watch's stop: what it runs on every node, run on this machine
                subprocess.run(["pkill", "-KILL", "-f", f"[{str(BENCH)[0]}]{str(BENCH)[1:]}/pingpong.py"])
                return 0, "", ""

            def watch(line):
                if "HEARTBEAT" in line and line.startswith("[1,1]") and not stopped:
                    pid = subprocess.run(["pgrep", "-f", "-n", "pingpong.py --iters 100000000"], capture_output=True,
                                         text=True).stdout.split()
                    stopped.append(int(pid[0]))
                    threading.Thread(target=os.kill, args=(int(pid[0]), signal.SIGSTOP)).start()
                on_line(line)
            return stream(command, timeout=timeout, on_line=watch, env=mpi_env())

    monkeypatch.setattr(rank_watch, "STARTUP_GRACE_S", 0)  # the ranks start in a moment here
    rc, out, err, silent = rank_watch.run_watched(Runner(), cluster, cmd, cluster.nodes, quiet_s=3, timeout=120)
    assert stopped and silent is not None, (rc, err[-2000:])
    assert silent.rank in (0, 1) and silent.node == ("c-master", "c-worker-1")[silent.rank]
    assert silent.step.startswith("pair 0-1") or silent.step == "start"
    assert "silent for 3 s" in silent.said() and "nothing is left running" in silent.said()
    assert subprocess.run(["pgrep", "-f", "pingpong.py --iters 100000000"], capture_output=True).returncode == 1


def test_a_bench_rank_that_stops_is_named_and_the_run_stopped(fake_cluster, tmp_path, monkeypatch):
    """deployer bench's own runs are watched as the check's are: rank 1 SIGSTOPped in the
    middle of its iterations is named (node, rank, step) after the quiet time, long before
    the run's own timeout, and no benchmark process is left."""
    import signal
    import time

    from deployer.bench import profiles
    from deployer.bench import sweep as bench
    from deployer.errors import OperationFailed

    cl, local = fake_cluster
    stopped: list[int] = []

    def rank_pid(rank: int) -> int | None:
        for pid in subprocess.run(["pgrep", "-f", "benchmarks/resnet_synthetic.py"], capture_output=True,
                                  text=True).stdout.split():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
                return int(pid)
        return None

    class Runner:  # the fake cluster's runner, stopping rank 1 once it is in its iterations
        commands = local.commands

        def run(self, cmd, *, timeout, on_line=None):
            def watch(line):
                if line.startswith("[1,1]") and '"step": "iter' in line and not stopped:
                    pid = rank_pid(1)
                    if pid:
                        stopped.append(pid)
                        os.kill(pid, signal.SIGSTOP)
                if on_line:
                    on_line(line)
            return local.run(cmd, timeout=timeout, on_line=watch)

    monkeypatch.setattr(bench, "QUIET_S", 3.0)
    opts = profiles.make_options(cl, nodes="2", model="resnet18", batch_size=2, image_size=32,
                                 num_warmup_batches=1, num_batches_per_iter=2, num_iters=100000, run_timeout_s=300)
    started = time.monotonic()
    with pytest.raises(OperationFailed) as e:
        bench.run_bench(Runner(), cl, opts, "run3", tmp_path / "out")
    assert stopped, "rank 1 never reached its iterations"
    said = str(e.value)
    assert said.startswith("resnet-dp-2 failed: rank 1 on t-worker-1 silent for 3 s during iter "), said
    assert "nothing is left running" in said and e.value.log and e.value.log.exists()
    assert time.monotonic() - started < 120, "named after the quiet time, not the run's 300 s timeout"
    assert "HEARTBEAT" not in e.value.log.read_text(), "the heartbeats stay out of the run's log"
    left = subprocess.run(["pgrep", "-f", f"{cl.shared_dir}/benchmarks/"], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", "benchmark processes survived the stop"


def test_a_rank_stopped_in_its_torch_import_is_the_one_named(monkeypatch):
    """A rank SIGSTOPped while it imports torch (seconds with PyPI's CUDA build) is named,
    not the rank that waits for it: MPI_Init holds the GIL while it waits for every rank, so
    resnet_synthetic.py initialises MPI and starts beating before it imports torch
    (bench_common.beating_from_import); the others beat on in their first collective."""
    import signal
    import threading
    import time

    from deployer.launch import rank_watch
    from deployer.remote import stream
    from tests.clusters import typed

    cluster = typed({"name": "c", "shared_dir": str(BENCH.parent), "nodes": [{"name": "c-master"}, {"name": "c-worker-1"}]})
    cmd = ["mpirun", "--tag-output", "-np", "2", "--bind-to", "none", sys.executable, str(BENCH / "resnet_synthetic.py"),
           "--model", "resnet18", "--image-size", "32", "--batch-size", "2", "--num-iters", "1", "--heartbeat", "0.2"]
    stopped: list[int] = []

    def stop_rank_1_in_its_torch_import() -> None:
        deadline = time.monotonic() + 60
        while not stopped and time.monotonic() < deadline:
            for pid in subprocess.run(["pgrep", "-f", "benchmarks/resnet_synthetic.py"], capture_output=True,
                                      text=True).stdout.split():
                try:
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    maps = Path(f"/proc/{pid}/maps").read_text()
                except OSError:
                    continue
                if b"OMPI_COMM_WORLD_RANK=1" in env and "libtorch" in maps:  # torch's import has begun
                    os.kill(int(pid), signal.SIGSTOP)
                    stopped.append(int(pid))
                    return
            time.sleep(0.01)

    class Runner:  # the master's shell, here
        def run(self, command, *, timeout, on_line=None):
            if "pkill" in command:  # the watch's stop, run on this machine
                subprocess.run(["pkill", "-KILL", "-f", f"[{str(BENCH)[0]}]{str(BENCH)[1:]}/resnet_synthetic.py"])
                return 0, "", ""
            return stream(command, timeout=timeout, on_line=on_line, env=mpi_env())

    threading.Thread(target=stop_rank_1_in_its_torch_import, daemon=True).start()
    monkeypatch.setattr(rank_watch, "STARTUP_GRACE_S", 0)
    rc, out, err, silent = rank_watch.run_watched(Runner(), cluster, cmd, cluster.nodes, quiet_s=3, timeout=120)
    assert stopped, "rank 1 was never seen importing torch"
    assert silent is not None and (silent.rank, silent.node, silent.step) == (1, "c-worker-1", "import"), (silent, err[-2000:])
    assert subprocess.run(["pgrep", "-f", "benchmarks/resnet_synthetic.py"], capture_output=True).returncode == 1
