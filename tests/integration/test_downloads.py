"""Downloads once per cluster (issue 17): what each node pulled from outside, the
training runtime installed once on the shared dir, distribution packages through the
master's cache; torch downloaded and installed once per machine (issue 42). On the shared
3-node cluster (workers reached through the master)."""

from __future__ import annotations

import re

import pytest

from deployer.pipeline import boot, timings
from deployer.providers.local import runtime_env

pytestmark = pytest.mark.integration

WORKERS = ("worker-1", "worker-2")


def _ssh(cluster, node: str, cmd: str) -> str:
    p = cluster.deployer("ssh", node, "--", cmd)
    assert p.returncode == 0, f"{node}: {cmd}: {p.stderr[-2000:]}"
    return p.stdout


def _pulled(cluster, node: str) -> int:
    got = timings.counter_bytes(
        _ssh(cluster, node, f"sudo -n nft --json list counter inet {boot.ACCOUNTING_TABLE} {boot.ACCOUNTING_COUNTER}")
    )
    assert got is not None, node
    return got


def test_up_reports_what_every_node_pulled_from_outside(local_cluster):
    first = sorted((local_cluster.state / "runs").glob("*-up"))[0]  # the up whose output up_log holds
    pulled = timings.read(first)["bytes_from_outside"]
    assert sorted(pulled) == ["itest-master", "itest-worker-1", "itest-worker-2"]
    assert all(isinstance(b, int) for b in pulled.values()), pulled
    line = next(ln for ln in local_cluster.up_log.splitlines() if "up 3 nodes in " in ln)
    assert re.search(r"pulled from outside: master [\d.]+ [kMG]?B, workers ≤ [\d.]+ [kMG]?B", line), line
    # A worker installs no runtime of its own (PyPI's torch wheel alone is ~900 MB).
    assert max(pulled["itest-worker-1"], pulled["itest-worker-2"]) < 20e6, pulled


def test_the_runtime_is_installed_once_on_the_shared_dir(local_cluster):
    for node in WORKERS:
        out = _ssh(local_cluster, node, "python -c 'import sys, torch; print(sys.prefix, torch.__file__)'; "
                                        "/usr/bin/python3 -c 'import torch' 2>/dev/null && echo own-torch || echo no-own-torch")
        prefix, torch_file, own = out.split()
        assert prefix == "/shared/venv" and torch_file.startswith("/shared/venv/"), out
        assert own == "no-own-torch", out  # nothing installed beside the shared environment


def test_torch_is_downloaded_and_installed_once_per_machine(local_cluster):
    """The cluster's environment is hard links to the one this machine prepared, and
    neither torch's wheel nor its CUDA wheels crossed the uplink for this cluster."""
    rt = runtime_env.runtime_for("/shared")
    [torch_init] = (local_cluster.state / "shared" / "venv").glob("lib/python3*/site-packages/torch/__init__.py")
    prepared = rt.dir / "venv" / torch_init.relative_to(local_cluster.state / "shared" / "venv")
    assert torch_init.stat().st_ino == prepared.stat().st_ino, (torch_init, prepared)
    wheel = next(runtime_env.WHEELHOUSE.glob("torch-*.whl")).stat().st_size
    first = sorted((local_cluster.state / "runs").glob("*-up"))[0]
    pulled = timings.read(first)["bytes_from_outside"]["itest-master"]
    assert pulled < wheel / 4, (pulled, wheel)


def test_distribution_packages_are_downloaded_once_through_the_masters_cache(local_cluster):
    size = int(re.search(r"^Size: (\d+)", _ssh(local_cluster, "master", "apt-cache show hello"), re.M).group(1))
    _ssh(local_cluster, "master", "sudo -n find /var/cache/apt-cacher-ng -name 'hello_*' -delete")  # a cold cache
    fetch = "cd $(mktemp -d) && apt-get download -q hello && ls hello_*.deb"
    before = {n: _pulled(local_cluster, n) for n in ("master", *WORKERS)}
    _ssh(local_cluster, "worker-1", fetch)
    middle = {n: _pulled(local_cluster, n) for n in ("master", *WORKERS)}
    _ssh(local_cluster, "worker-2", fetch)
    after = {n: _pulled(local_cluster, n) for n in ("master", *WORKERS)}
    # worker-1's request: the master fetched the package from the mirror, the worker got it from the master.
    assert middle["master"] - before["master"] >= size, (before, middle, size)
    assert middle["worker-1"] - before["worker-1"] < size / 2, (before, middle, size)
    # worker-2's: a hit in the master's cache, nothing from outside on either.
    assert after["master"] - middle["master"] < size / 2, (middle, after, size)
    assert after["worker-2"] - middle["worker-2"] < size / 2, (middle, after, size)
