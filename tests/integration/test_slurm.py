"""Slurm on a real local cluster of its own (`scheduler: slurm`, 2 nodes, monitoring on, no
notebook): every node idle in sinfo, `srun -N 2 hostname` on both, an sbatch job running
an mpi4py program across two nodes with `srun --mpi=pmix` and one with mpirun inside the
allocation; `deployer bench --via slurm` over 1 and 2 nodes; a bench job queued behind
another job says what it waits for, and Ctrl-C cancels it; the dashboard's Slurm panels
have data in the cluster's Prometheus; a worker deleted outside the deployer rejoins Slurm
after a plain `up`; then `up --nodes 3` adds a node that comes up idle
and `up --nodes 2` takes it out of slurm.conf again, while a job running on the master
through both reconfigurations keeps running."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import dashboard_checks as dashboard
from tests.integration.conftest import cluster_up
from tests.interrupt import sigint_as_from_a_shell

NAME = "islurm"
SUBNET = "10.81.0.0/24"
MASTER, WORKER_1, WORKER_2 = f"{NAME}-master", f"{NAME}-worker-1", f"{NAME}-worker-2"

MPI_HELLO = (
    "from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
    "print(f'rank {c.rank} of {c.size} on {socket.gethostname()}', flush=True)"
)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    spec = (f"name: {NAME}\nnodes: 2\njupyter: false\nscheduler: slurm\n"
            f"local:\n  subnet: {SUBNET}\n")
    with cluster_up(tmp_path_factory, NAME, spec) as c:
        yield c


def on_master(cluster, cmd: str, timeout: float = 300) -> str:
    p = cluster.deployer("ssh", "--", cmd, timeout=timeout)
    assert p.returncode == 0, f"{cmd}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p.stdout


def node_states(cluster) -> dict[str, str]:
    out = on_master(cluster, "sinfo --noheader --Node --format='%N %T'")
    return dict(line.split() for line in out.splitlines() if line.strip())


def batch(cluster, name: str, script: str, timeout: float = 300) -> str:
    """Submit `script` from the shared dir, wait for it, return its output."""
    (cluster.state / "shared" / f"{name}.sh").write_text(script)
    on_master(cluster, f"cd /shared && sbatch --wait --output=/shared/{name}.out {name}.sh", timeout=timeout)
    return (cluster.state / "shared" / f"{name}.out").read_text()


def test_every_node_is_idle_in_sinfo(slurm_cluster):
    assert node_states(slurm_cluster) == {MASTER: "idle", WORKER_1: "idle"}


def test_srun_reaches_every_node(slurm_cluster):
    out = on_master(slurm_cluster, "srun -N 2 --ntasks-per-node=1 hostname")
    assert sorted(out.split()) == [MASTER, WORKER_1]


def test_sbatch_mpi4py_across_two_nodes_with_srun_pmix(slurm_cluster):
    out = batch(slurm_cluster, "pmix", "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                f'srun --mpi=pmix /shared/venv/bin/python -c "{MPI_HELLO}"\n')
    ranks = sorted(re.findall(r"rank (\d) of (\d) on (\S+)", out))
    assert ranks == [("0", "2", MASTER), ("1", "2", WORKER_1)], out


def test_mpirun_inside_an_allocation(slurm_cluster):
    # mpirun takes the nodes from the allocation (no hostfile) and starts its daemons through Slurm.
    out = batch(slurm_cluster, "mpirun", "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                f'mpirun /shared/venv/bin/python -c "{MPI_HELLO}"\n')
    ranks = sorted(re.findall(r"rank (\d) of (\d) on (\S+)", out))
    assert ranks == [("0", "2", MASTER), ("1", "2", WORKER_1)], out


def test_the_ddp_example_of_docs_slurm_md(slurm_cluster):
    out = batch(slurm_cluster, "ddp", "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                "srun --mpi=pmix /shared/venv/bin/python /shared/benchmarks/resnet_synthetic.py --model resnet18 "
                "--image-size 32 --batch-size 8 --num-iters 2 --num-batches-per-iter 2 --num-warmup-batches 1\n", timeout=600)
    assert re.search(r"Total img/sec on 2 (CPU|GPU)\(s\)", out), out


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "slurm"


def test_the_torchrun_example_as_shipped(slurm_cluster):
    # examples/slurm/ddp_torchrun.sbatch, unchanged: torchrun per node, env:// rendezvous at the first node
    for f in ("ddp_torchrun.sbatch", "ddp_env_check.py"):
        (slurm_cluster.state / "shared" / f).write_text((EXAMPLES / f).read_text())
    job = on_master(slurm_cluster, "cd /shared && sbatch --parsable --wait ddp_torchrun.sbatch", timeout=300).strip()
    out = (slurm_cluster.state / "shared" / f"ddp-torchrun-{job}.out").read_text()
    assert sorted(re.findall(r"rank (\d) of 2 on (\S+): sum 3", out)) == [("0", MASTER), ("1", WORKER_1)], out


TINY = ["--model", "resnet18", "--image-size", "32", "--batch-size", "8", "--num-iters", "2",
        "--num-batches-per-iter", "3", "--num-warmup-batches", "1", "--allreduce-max", "64K"]


def test_bench_via_slurm_reports_every_node_count(slurm_cluster):
    p = slurm_cluster.deployer("bench", "--via", "slurm", "--nodes", "1,2", *TINY, "--json", timeout=1200)
    assert p.returncode == 0, p.stderr[-4000:]
    report = json.loads(p.stdout)
    assert [(r["nodes"], r["ranks"]) for r in report["results"]] == [(1, 1), (2, 2)], report["results"]
    assert all(r["img_per_sec"] > 0 for r in report["results"]) and report["allreduce"]
    scripts = [Path(f) for f in report["files"]["job_scripts"]]
    assert [f.name for f in scripts] == ["resnet-dp-1.sbatch", "resnet-dp-2.sbatch", "resnet-ensemble-2.sbatch", "allreduce-2.sbatch"]
    assert all("#SBATCH --nodes=" in f.read_text() for f in scripts)
    # the same script, as it ran, is in the run dir on the shared storage
    shared_copy = slurm_cluster.state / "shared" / "bench" / report["run_id"] / "resnet-dp-2.sbatch"
    assert shared_copy.read_text() == scripts[1].read_text()


def test_a_queued_bench_says_what_it_waits_for_and_ctrl_c_cancels_it(slurm_cluster):
    blocker = on_master(slurm_cluster, f"sbatch --parsable -w {WORKER_1} --exclusive --wrap 'sleep 600' --output=/dev/null").strip()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "deployer", "bench", "--via", "slurm", "--nodes", "2", *TINY],
                                cwd=slurm_cluster.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=sigint_as_from_a_shell)
        said = []
        deadline = time.monotonic() + 120
        for line in proc.stderr:  # the bench's progress lines
            said.append(line)
            if "waiting for 2 node(s) (Resources)" in line or time.monotonic() > deadline:
                break
        assert "waiting for 2 node(s) (Resources)" in said[-1], "".join(said)
        queued = on_master(slurm_cluster, "squeue --noheader --format='%j %T'")
        assert re.search(r"deployer-bench-\S+ PENDING", queued), queued
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=120)[1]
        assert proc.returncode == 130, "".join(said) + rest
        assert "cancelling this bench's Slurm jobs" in rest, rest
        left = on_master(slurm_cluster, "squeue --noheader --format='%j %T'")
        assert "deployer-bench-" not in left, left
    finally:
        on_master(slurm_cluster, f"scancel {blocker}")


def prometheus_query(cluster, expr: str) -> list[dict]:
    """Ask the master's Prometheus, on the master (it listens on the cluster address only)."""
    master_ip = cluster.cluster_output().master.private_ip
    out = on_master(cluster, f"curl -s --fail --data-urlencode query={shlex.quote(expr)} http://{master_ip}:9090/api/v1/query")
    return json.loads(out)["data"]["result"]


def test_slurm_node_states_and_queue_are_on_the_cluster_dashboard(slurm_cluster):
    board = dashboard.load_dashboards()["cluster"]
    queries = [q for q in dashboard.panel_queries(board) if "slurm_" in q.expr]
    assert {q.panel for q in queries} == {"Slurm nodes by state", "Slurm queue", "Slurm node states"}
    # Both nodes idle in every series: the test before this one held worker-1 with a job,
    # and a series of its old state lasts until the next scrape marks it stale (a node's
    # states are collected as a set, so two series that disagree show, not the last one).
    want = {MASTER: {"idle"}, WORKER_1: {"idle"}}
    deadline = time.monotonic() + 90  # the timer writes every 15 s, Prometheus scrapes every 15 s
    while True:
        idle = prometheus_query(slurm_cluster, 'slurm_nodes{state="idle"}')
        states: dict[str, set[str]] = {}
        for r in prometheus_query(slurm_cluster, "slurm_node_state == 1"):
            states.setdefault(r["metric"]["node"], set()).add(r["metric"]["state"])
        settled = bool(idle) and all(r["value"][1] == "2" for r in idle) and states == want
        if settled or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert idle and all(r["value"][1] == "2" for r in idle), idle
    assert states == want
    for q in queries:
        expr, missing = dashboard.expand(q.expr, {"__rate_interval": "1m"})
        assert not missing and prometheus_query(slurm_cluster, expr), f"{q.panel}: no data for {expr}"


def test_a_worker_deleted_outside_rejoins_slurm_after_up(slurm_cluster):
    # `up` makes the node anew; its new host key is certified by the cluster's host CA, which
    # the master trusts already, so the node is configured alone: it gets the same slurm.conf
    # (every node's facts are read, the ones outside the --limit too) and munge key, and its
    # slurmd rejoins (ReturnToService=2) without a controller restart.
    subprocess.run(["lxc-destroy", "-f", "-n", WORKER_1], check=True, capture_output=True)
    p = slurm_cluster.deployer("up", timeout=1200)
    assert p.returncode == 0, p.stderr[-4000:]
    assert f"ssh: a fresh host key made on {WORKER_1} and pinned" in p.stderr
    assert f"ansible: configuring {WORKER_1} (" in p.stderr, p.stderr[-3000:]
    deadline = time.monotonic() + 60
    while (states := node_states(slurm_cluster)) != {MASTER: "idle", WORKER_1: "idle"} and time.monotonic() < deadline:
        time.sleep(2)
    assert states == {MASTER: "idle", WORKER_1: "idle"}, states
    assert sorted(on_master(slurm_cluster, "srun -N 2 --ntasks-per-node=1 hostname").split()) == [MASTER, WORKER_1]


def test_scale_out_and_in_keeps_a_running_job(slurm_cluster):
    job = on_master(slurm_cluster, "sbatch --parsable -w " + MASTER + " --wrap 'sleep 900' --output=/dev/null").strip()
    for _ in range(30):
        if on_master(slurm_cluster, f"squeue --noheader -j {job} -o %T").strip() == "RUNNING":
            break
        time.sleep(1)
    started = time.monotonic()
    p = slurm_cluster.deployer("up", "--nodes", "3", timeout=2400)
    assert p.returncode == 0, p.stderr[-4000:]
    print(f"up --nodes 3 with slurm: {time.monotonic() - started:.0f} s")
    try:
        states = node_states(slurm_cluster)
        assert states[WORKER_2] == "idle" and set(states) == {MASTER, WORKER_1, WORKER_2}, states
        assert on_master(slurm_cluster, f"squeue --noheader -j {job} -o %T").strip() == "RUNNING"
        assert sorted(on_master(slurm_cluster, "srun -N 3 --ntasks-per-node=1 hostname").split()) == [MASTER, WORKER_1, WORKER_2]
        # and back in: the removed node leaves slurm.conf everywhere, the job on the master still runs
        started = time.monotonic()
        p = slurm_cluster.deployer("up", "--nodes", "2", "--yes", timeout=2400)
        assert p.returncode == 0, p.stderr[-4000:]
        print(f"up --nodes 2 (scale in) with slurm: {time.monotonic() - started:.0f} s")
        states = node_states(slurm_cluster)
        assert states == {MASTER: "mixed", WORKER_1: "idle"} or states == {MASTER: "allocated", WORKER_1: "idle"}, states
        assert on_master(slurm_cluster, f"squeue --noheader -j {job} -o %T").strip() == "RUNNING"
        conf = on_master(slurm_cluster, f"ssh -o BatchMode=yes {WORKER_1} grep -c '^NodeName=' /etc/slurm/slurm.conf")
        assert conf.strip() == "2", conf
    finally:
        on_master(slurm_cluster, f"scancel {job}")
