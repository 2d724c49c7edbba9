"""Slurm on a real local cluster of its own (`scheduler: slurm`, 2 nodes, no monitoring or
notebook): every node idle in sinfo, `srun -N 2 hostname` on both, an sbatch job running
an mpi4py program across two nodes with `srun --mpi=pmix` and one with mpirun inside the
allocation; then `up --nodes 3` adds a node that comes up idle, while a job running on
the master through the reconfiguration keeps running."""

from __future__ import annotations

import re
import time

import pytest

from tests.integration.conftest import cluster_up

NAME = "islurm"
SUBNET = "10.81.0.0/24"
MASTER, WORKER_1, WORKER_2 = f"{NAME}-master", f"{NAME}-worker-1", f"{NAME}-worker-2"

MPI_HELLO = "from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; print(f'rank {c.rank} of {c.size} on {socket.gethostname()}', flush=True)"


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    spec = (f"name: {NAME}\nnodes: 2\nmonitoring: false\njupyter: false\nscheduler: slurm\n"
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


def test_scale_out_adds_an_idle_node_and_keeps_a_running_job(slurm_cluster):
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
    finally:
        on_master(slurm_cluster, f"scancel {job}")
