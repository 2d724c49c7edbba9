"""deployer bench on GPU nodes: AMP and channels_last on unless asked otherwise (off on CPUs),
and NCCL's warnings logged per rank into the run dir; CPU runs keep their commands."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import asdict
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from deployer import cli
from deployer.bench import commands, profiles
from deployer.bench import report as bench_report
from deployer.bench import sweep as bench
from deployer.cluster import Cluster


def cluster(n: int = 2, gpus: int = 0) -> Cluster:
    nodes = [{"name": f"demo-{'master' if i == 0 else f'worker-{i}'}", "role": "master" if i == 0 else "worker",
              "private_ip": f"10.10.0.{10 + i}", "public_ip": None, "gpus": gpus} for i in range(n)]
    return Cluster.parse({"name": "demo", "provider": "openstack", "ssh_user": "ubuntu", "shared_dir": "/shared", "nodes": nodes})


# ---- AMP and channels_last: auto by the hardware, flags win -----------------------------------


def test_gpu_clusters_get_amp_and_channels_last_and_are_told_they_were_automatic():
    o = profiles.make_options(cluster(2, gpus=4), nodes="1,2")
    assert (o.amp, o.channels_last, o.fp16_allreduce) == (True, True, False)  # fp16 all-reduce stays opt-in
    assert o.auto_flags == ("amp", "channels_last")
    args = commands.resnet_args(o, "dp")
    assert "--amp" in args and "--channels-last" in args and "--fp16-allreduce" not in args
    assert bench_report.precision_text(asdict(o)) == "AMP on (auto), channels_last on (auto), fp16 all-reduce off"


def test_cpu_clusters_keep_both_off():
    o = profiles.make_options(cluster(3), nodes="1,2")
    assert (o.amp, o.channels_last) == (False, False) and o.auto_flags == ("amp", "channels_last")
    args = commands.resnet_args(o, "dp")
    assert not {"--amp", "--channels-last", "--fp16-allreduce"} & set(args)


@pytest.mark.parametrize("gpus, asked, want, auto", [
    (4, {"amp": False}, (False, True), ("channels_last",)),
    (4, {"channels_last": False}, (True, False), ("amp",)),
    (4, {"amp": False, "channels_last": False}, (False, False), ()),
    (0, {"amp": True}, (True, False), ("channels_last",)),
    (0, {"amp": True, "channels_last": True}, (True, True), ()),
    (0, {"amp": None, "channels_last": None}, (False, False), ("amp", "channels_last")),  # None: the CLI's "not given"
])
def test_explicit_flags_win_either_way(gpus, asked, want, auto):
    o = profiles.make_options(cluster(2, gpus=gpus), nodes="1", **asked)
    assert (o.amp, o.channels_last) == want and o.auto_flags == auto
    values, chosen = profiles.gpu_defaults(cluster(2, gpus=gpus), asked)
    assert (values["amp"], values["channels_last"]) == want and chosen == auto


def test_one_gpu_node_is_a_gpu_cluster():
    c = cluster(2)
    c = dataclasses.replace(c, nodes=(c.master, dataclasses.replace(c.workers[0], gpus=1)))
    assert c.has_gpus and profiles.make_options(c, nodes="1").amp


def test_the_cli_passes_the_flag_pairs_through(monkeypatch):
    seen = {}
    gpu = cluster(2, gpus=1)
    monkeypatch.setattr(cli, "_state", lambda name, state_dir, config=None: SimpleNamespace(spec=lambda: None))
    monkeypatch.setattr(cli, "_up_cluster", lambda st: gpu)
    monkeypatch.setattr(bench, "push_results", lambda *a: True)

    def run_on_cluster(st, cl, opts):
        seen["opts"] = opts
        return bench_report.aggregate("r1", [])

    monkeypatch.setattr(bench, "run_on_cluster", run_on_cluster)
    for argv, want in ((["bench"], (True, True, False)),
                       (["bench", "--no-amp"], (False, True, False)),
                       (["bench", "--no-channels-last", "--fp16-allreduce"], (True, False, True))):
        res = CliRunner().invoke(cli.app, argv)
        assert res.exit_code == 0, res.output
        o = seen["opts"]
        assert (o.amp, o.channels_last, o.fp16_allreduce) == want, argv


# ---- NCCL_DEBUG per run, GPU clusters only -------------------------------------------------------


def exported(argv: list[str]) -> dict[str, str | None]:
    """mpirun's -x arguments: NAME -> value (None where the name alone passes the caller's value on)."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv[:-1]):
        if a == "-x":
            name, _, value = argv[i + 1].partition("=")
            out[name] = value or None
    return out


@pytest.mark.parametrize("script", ["resnet_synthetic.py", "allreduce.py"])
def test_gpu_runs_log_nccl_warnings_per_rank_into_the_run_dir(script):
    c = cluster(2, gpus=8)
    env = exported(shlex.split(commands.mpirun_cmd(c, "r1", 2, 600, script, ["--json"])))
    assert env["NCCL_DEBUG"] == "WARN"
    assert env["NCCL_DEBUG_FILE"] == "/shared/bench/r1/nccl.%h.%p.log"  # NCCL expands host and pid
    # the login shell's interface settings (/etc/profile.d) still pass through by name
    assert {"PATH": None, "GLOO_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": None}.items() <= env.items()


def test_cpu_runs_have_no_nccl_debug():
    argv = shlex.split(commands.mpirun_cmd(cluster(3), "r1", 2, 600, "resnet_synthetic.py", ["--json"]))
    env = exported(argv)
    assert "NCCL_DEBUG" not in env and "NCCL_DEBUG_FILE" not in env
    assert set(env) == {"PATH", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}
    assert commands.nccl_env(cluster(3), "r1") == {}


def test_the_nccl_log_copy_lists_only_non_empty_logs_of_this_run(tmp_path):
    import subprocess

    c = dataclasses.replace(cluster(1, gpus=1), shared_dir=str(tmp_path))
    d = tmp_path / "bench" / "r1"
    d.mkdir(parents=True)
    (d / "nccl.host-a.11.log").write_text("host-a:11:12 [0] NCCL WARN something")  # no final newline
    (d / "nccl.host-b.12.log").write_text("")  # NCCL opens one per process; most stay empty
    (d / "nccl.host-c.13.log").write_text("host-c:13:14 [1] NCCL WARN other\n")
    p = subprocess.run(["bash", "-c", commands.nccl_logs_cmd(c, "r1")], capture_output=True, text=True, check=True)
    assert [ln for ln in p.stdout.splitlines() if ln.startswith("==> ")] == ["==> nccl.host-a.11.log <==", "==> nccl.host-c.13.log <=="]
    assert "NCCL WARN something" in p.stdout and "host-b" not in p.stdout
    empty = subprocess.run(["bash", "-c", commands.nccl_logs_cmd(dataclasses.replace(c, shared_dir=str(tmp_path / "none")), "r1")],
                           capture_output=True, text=True)
    assert empty.returncode == 0 and empty.stdout == ""
