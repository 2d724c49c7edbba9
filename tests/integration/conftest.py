"""A real local cluster for the integration tests: up once per session, down at the end.

Needs root, LXC and debootstrap (`make deps`); skipped with the reason otherwise.
Uses its own cluster name, subnet and state dir, so it never touches a user's cluster.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deployer.cluster import Cluster as ClusterOutput

NAME = "itest"
SUBNET = "10.79.0.0/24"
NODES = 3
# Planted in the shared cluster's environment (every `up` of it, a node made anew included):
# a credential in a pip option's URL, which the local driver carries from the host's pip
# configuration to each node. `index` is `pip search`'s: no install ever contacts it.
# tests/integration/test_node_secrets.py looks for it where an unprivileged user reads.
PIP_MARKER = f"itest-pip-token-{secrets.token_hex(6)}"
PLANTED_ENV = {"PIP_INDEX": f"https://itest:{PIP_MARKER}@pypi.invalid/pypi"}


@dataclass
class Cluster:
    workdir: Path
    name: str = NAME
    up_log: str = ""
    bench: dict = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # added to every verb's environment

    def deployer(self, *args: str, timeout: float = 1800, input: str | None = None,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        # The workdir's cluster.yaml names the cluster, as a user's would.
        extra = {**self.env, **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "deployer", *args],
            cwd=self.workdir, text=True, capture_output=True, timeout=timeout, input=input,
            env={**os.environ, **extra} if extra else None,
        )

    @property
    def state(self) -> Path:
        return self.workdir / ".deployer" / self.name

    def cluster_output(self) -> ClusterOutput:
        """The cluster as `up` recorded it (typed, as every verb reads it)."""
        return ClusterOutput.parse(json.loads((self.state / "cluster.json").read_text()))


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (LXC containers, bridges)"
    for tool in ("lxc-start", "debootstrap", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} missing: run `make deps`"
    return None


def leftovers(name: str) -> list[str]:
    """What of local cluster `name` is still on this machine: containers, bridge, table."""
    containers = subprocess.run(["lxc-ls", "-1"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return ([c for c in containers if c.startswith(f"{name}-")]
            + [w for w in links.split() if w == f"dpl-{name}"]
            + [t for t in tables.split() if t == f"deployer_{name}"])


@contextmanager
def cluster_up(tmp_path_factory, name: str, spec: str, *up_args: str, workdir: str | None = None,
               env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A real local cluster from `spec` (cluster.yaml text), up for the block, down after it;
    run from a new directory named `workdir` (default: the cluster's name), every verb with
    `env` added to its environment."""
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    c = Cluster(tmp_path_factory.mktemp(workdir or name), name=name, env=dict(env or {}))
    (c.workdir / "cluster.yaml").write_text(spec)
    p = c.deployer("up", *up_args, timeout=2400)
    c.up_log = p.stderr
    try:
        assert p.returncode == 0, f"deployer up failed:\n{p.stderr[-4000:]}"
        yield c
    finally:
        # A no-op if a test already removed it; a verb a failed test left running holds the
        # cluster's lock for a while: wait for it rather than leave the cluster behind.
        for _ in range(36):
            d = c.deployer("down", "--yes", timeout=600)
            if d.returncode == 0 or "is busy" not in d.stderr:
                break
            time.sleep(5)
        print(d.stderr[-2000:])


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory):
    # access: via_master — the host reaches the master only and workers through it, the
    # path every OpenStack cluster takes, so CI runs the cloud's first boot and hop.
    spec = f"name: {NAME}\nnodes: {NODES}\nlocal:\n  subnet: {SUBNET}\n  memory_mb: 2048\n  access: via_master\n"
    with cluster_up(tmp_path_factory, NAME, spec, env=PLANTED_ENV) as c:
        yield c


@dataclass
class LiveCluster:
    """The local cluster after one `deployer bench` run (for the bench and monitoring tests)."""

    cluster: Cluster
    bench: dict
    bench_run_id: str
    prometheus_url: str
    nodes: int = NODES
    bench_stderr: str = ""


# The integration run's benchmark: a tiny model so it fits a 2-core CI machine.
BENCH_ARGS = ["bench", "--nodes", "1,2", "--model", "resnet18", "--image-size", "32", "--batch-size", "8",
              "--num-iters", "2", "--num-batches-per-iter", "3", "--num-warmup-batches", "1",
              "--allreduce-max", "4M", "--net", "--timeline", "--json"]


@pytest.fixture(scope="session")
def live_cluster(local_cluster) -> LiveCluster:
    p = local_cluster.deployer(*BENCH_ARGS, timeout=1800)
    assert p.returncode == 0, f"deployer bench failed:\n{p.stderr[-4000:]}"
    report = json.loads(p.stdout)
    master_ip = local_cluster.cluster_output().master.private_ip
    # Locally this machine sits on the cluster bridge, so Prometheus is reachable directly.
    return LiveCluster(local_cluster, report, report["run_id"], f"http://{master_ip}:9090", bench_stderr=p.stderr)
