"""`deployer bench`: the node-count sweep, run on the master, aggregated into results.

Every remote step is one shell command string run on the master through a Runner
(the caller's SSH session); the same strings are saved to commands.sh beside the
results, so each run can be repeated by hand on the master. Order:

  1. hostfile.N for each N (the first N lines of <shared>/hostfile)
  2. for each N: resnet_synthetic.py in --mode (dp), and ensemble at the largest N
     (or at every N with ensemble_every_n) for the communication share
  3. allreduce.py at the largest N (when it is >= 2)
  With --via slurm each run of 2 and 3 is an sbatch job instead of an mpirun: its script
  saved in the run dir (here and on the master), submitted and followed by
  benchmarks/slurm_job.py on the master, which prints the same lines mpirun would.
  3b. on GPU nodes: the non-empty NCCL warning logs the runs left in the run dir, copied back
  4. iperf3 master -> first worker, one way and --bidir: the rates busbw is read against
  5. with --net: iperf3 between every pair of nodes (a ring beyond 8 nodes), one at a
     time, for the matrix and the slowest link

`bench --data` (deployer/bench/training.py: time to a target accuracy on real data) runs its
own sweep on the same Session: the commands log, the launch by mpirun or sbatch, the stop
of every rank after a failure and the NCCL logs are one code path for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import ui
from ..errors import OperationFailed
from ..launch.failure import diagnose, untag
from ..launch.iperf import ALL_PAIRS_UP_TO, iperf_cmd, net_pairs, pair_cmd, parse_iperf
from ..launch.mpirun import parse_json_line
from ..launch.rank_watch import HEARTBEAT_S, QUIET_S, run_watched
from ..remote import Runner
from . import report as bench_report
from .commands import (
    allreduce_args,
    hostfiles_cmd,
    job_name,
    modes_at,
    mpirun_cmd,
    nccl_env,
    nccl_logs_cmd,
    resnet_args,
    run_dir,
    sbatch_script,
    stop_cmd,
    submit_cmd,
)
from .profiles import BenchOptions, Launch, cpu_sharing
from .progress import RunProgress, SweepProgress

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..state import ClusterState


def cluster_record(cluster: Cluster) -> dict[str, Any]:
    """The cluster a sweep ran on, for the report's reproducibility record (both sweeps)."""
    machine = cluster.machine or {}
    return {"provider": cluster.provider, "image": machine.get("image"), "flavor": machine.get("flavor"),
            "cluster_nodes": len(cluster.nodes), "gpus_per_node": [n.gpus for n in cluster.nodes]}


# --- the sweep -----------------------------------------------------------------------
class Session:
    """The remote steps of one bench run, shared by every sweep: each command appended to
    commands.sh in outdir and logged to <name>.log; a failed one stops every rank (stop_cmd)
    and raises OperationFailed naming its log. `launch` makes the command of one benchmark
    run: an mpirun over the hostfile, or (--via slurm) a job script saved here, then
    written, submitted and followed on the master."""

    def __init__(self, runner: Runner, cluster: Cluster, opts: Launch, run_id: str, outdir: Path):
        self.runner, self.cluster, self.opts, self.run_id = runner, cluster, opts, run_id
        self.outdir = Path(outdir)
        self.outdir.mkdir(parents=True, exist_ok=True)
        self.script = self.outdir / "commands.sh"
        self.script.write_text(f"# deployer bench {run_id}: the same runs, typed by hand on the master\n")
        self.nccl = nccl_env(cluster, run_id)  # GPU nodes: where every rank's NCCL warnings go
        self.job_scripts: list[str] = []
        # the runner waits past timeout's --kill-after; under Slurm also for the queue
        self.limit = opts.run_timeout_s + 60 + (opts.queue_timeout_s + 60 if opts.via == "slurm" else 0)

    def remote(self, name: str, cmd: str, timeout: float, *, cleanup: bool = True,
               on_line: Callable[[str], None] | None = None, nodes: int = 0) -> str:
        """Run one command on the master (`nodes`: a benchmark run on the first so many
        nodes, launched by launch()); its stdout."""
        with self.script.open("a") as f:
            f.write(cmd + "\n")
        log = self.outdir / f"{name}.log"
        relay = (lambda line: on_line(untag(line)[2])) if on_line else None
        if nodes and self.opts.via != "slurm":
            # Every rank watched: one silent for QUIET_S is named and the run stopped, a
            # hang is a finding, not a wait until the run's timeout (rank_watch.py).
            rc, out, err, silent = run_watched(self.runner, self.cluster, cmd, self.cluster.rank_nodes(nodes),
                                               quiet_s=QUIET_S, timeout=timeout, on_line=relay)
        else:
            (rc, out, err), silent = self.runner.run(cmd, timeout=timeout, on_line=relay), None
        log.write_text(f"$ {cmd}\n# exit {rc}\n{out}\n# --- stderr ---\n{err}")
        if silent is not None:
            raise OperationFailed(f"{name} failed: {silent.said()}", log=log)
        if rc != 0:
            if cleanup:
                self.runner.run(stop_cmd(self.cluster, self.run_id, self.opts), timeout=60)  # leave no rank running
            why = diagnose(rc, out, err, self.cluster.rank_nodes(nodes), self.opts.run_timeout_s)
            if nodes and self.nccl:  # the sweep stops here, so the logs stay on the master: name them
                why += f"; NCCL warnings, if any: {self.nccl['NCCL_DEBUG_FILE']} on the master"
            raise OperationFailed(f"{name} failed: {why}", log=log)
        return out

    def launch(self, name: str, n: int, script: str, args: list[str]) -> str:
        opts = self.opts
        if opts.via != "slurm":  # Slurm's jobs are followed by slurm_job.py, not watched rank by rank
            return mpirun_cmd(self.cluster, self.run_id, n, opts.run_timeout_s, script, [*args, f"--heartbeat {HEARTBEAT_S:g}"])
        job = sbatch_script(self.cluster, self.run_id, n, opts.run_timeout_s, name, script, args)
        saved = self.outdir / f"{name}.sbatch"
        saved.write_text(job)
        self.job_scripts.append(str(saved))
        return submit_cmd(self.cluster, self.run_id, name, job, opts.queue_timeout_s)

    def copy_nccl_logs(self) -> Path | None:
        """GPU nodes: the non-empty NCCL warning logs the runs left in the run dir, copied to
        outdir/nccl.log (None: no GPUs, or no warnings). A failure to copy is a warning."""
        if not self.nccl:
            return None
        try:
            logs = self.remote("nccl-logs", nccl_logs_cmd(self.cluster, self.run_id), 120, cleanup=False)
        except OperationFailed as e:  # results stand without it; the files stay on the master
            logs = ""
            ui.warn(f"NCCL logs not copied ({e}); they are on the master: {self.nccl['NCCL_DEBUG_FILE']}")
        count = sum(1 for line in logs.splitlines() if line.startswith("==> "))
        if not count:
            ui.ok("NCCL wrote no warnings")
            return None
        copy = self.outdir / "nccl.log"
        copy.write_text(logs)
        ui.warn(f"NCCL wrote warnings in {count} log(s): {copy} (on the master: {self.nccl['NCCL_DEBUG_FILE']})")
        return copy


    def versions(self, benchmark: dict[str, Any], node_counts: list[int], flags: dict[str, Any], cpu_sharing: Any,
                 **extra: Any) -> dict[str, Any]:
        """The report's reproducibility record, the same for every sweep: the benchmark's own
        versions, the cluster, the node counts, the flags, how ranks shared cores, NCCL's debug
        settings; `extra`: what only one sweep has (allreduce's versions, the dataset)."""
        return {"benchmark": benchmark, **extra, **cluster_record(self.cluster), "node_counts": node_counts,
                "flags": flags, "cpu_sharing": cpu_sharing, "nccl_debug": self.nccl or None}

    def publish(self, report: dict[str, Any], nccl_copy: Path | None, timeline: Path | None = None) -> dict[str, Any]:
        """Write the report's files (results.json, results.csv, plots; deployer/bench/report.py)
        with what this session left beside them named in it: the timeline, the NCCL logs,
        the job scripts."""
        report["files"] |= {"timeline": str(timeline) if timeline else None, "nccl_logs": str(nccl_copy) if nccl_copy else None,
                            "job_scripts": self.job_scripts}
        if self.job_scripts:
            ui.ok(f"job scripts, templates for your own sbatch jobs: {self.outdir}/*.sbatch")
        bench_report.write_files(report, self.outdir)
        ui.ok(f"results in {self.outdir}")
        return report


def run_bench(runner: Runner, cluster: Cluster, opts: BenchOptions, run_id: str,
              outdir: Path) -> dict[str, Any]:
    """Run the sweep on the cluster; write results into outdir; return the --json record."""
    session = Session(runner, cluster, opts, run_id, outdir)
    outdir, remote, launch, nccl, limit = session.outdir, session.remote, session.launch, session.nccl, session.limit

    top = max(opts.nodes)
    ui.step(f"bench {run_id}: profile {opts.profile}: {opts.model}, batch {opts.batch_size}/rank, {opts.image_size}px, "
            f"mode {opts.mode}, nodes {','.join(map(str, opts.nodes))}"
            + (f", {opts.threads} thread(s) per rank" if opts.threads else "")
            + (", each run an sbatch job" if opts.via == "slurm" else ""))
    if opts.profile_reason != "--profile":
        ui.info(f"  profile {opts.profile}: {opts.profile_reason}")
    ui.info(f"  {bench_report.precision_text(asdict(opts))}"
            + (f" — auto: {'on with GPU nodes' if cluster.has_gpus else 'off on CPU-only nodes'}; "
               "--[no-]amp and --[no-]channels-last choose" if opts.auto_flags else ""))
    if nccl:
        ui.info(f"  NCCL_DEBUG={nccl['NCCL_DEBUG']}: each rank's NCCL warnings go to {nccl['NCCL_DEBUG_FILE']}")
    sharing = cpu_sharing(cluster, opts)
    if sharing:
        ui.info(f"  the nodes share this machine's {sharing['shared_cpus']} cores: {opts.threads} thread(s) per rank at every N, "
                f"so E(N) cannot pass {', '.join(f'{v:.2f} at N={k}' for k, v in sharing['efficiency_ceiling'].items())}")
    remote("hostfiles", hostfiles_cmd(cluster, run_id, opts.nodes), 60, cleanup=False)

    resnet: list[tuple[int, dict[str, Any]]] = []
    timeline: Path | None = None
    runs = [(n, mode) for n in opts.nodes for mode in modes_at(opts, n, top)]
    took: list[float] = []
    for i, (n, mode) in enumerate(runs, 1):
        # The sweep's ETA from the runs so far: rough (a larger N takes longer), said so.
        eta = f", sweep ETA about {sum(took) / len(took) * (len(runs) - i + 1):.0f}s" if took else ""
        ui.step(f"resnet_synthetic on {n} node(s), {mode} (run {i}/{len(runs)}{eta})")
        started = time.monotonic()
        extra = ["--progress"]
        profiled = opts.timeline and n == top and mode == opts.mode
        if profiled:
            extra += ["--timeline", f"{run_dir(cluster, run_id)}/timeline"]
        cmd = launch(f"resnet-{mode}-{n}", n, "resnet_synthetic.py", resnet_args(opts, mode) + extra)
        with RunProgress(f"{n} node(s) {mode}") as progress:
            out = remote(f"resnet-{mode}-{n}", cmd, limit, on_line=progress, nodes=n)
        res = parse_json_line(out, f"resnet_synthetic ({mode}, {n} nodes)")
        took.append(time.monotonic() - started)
        resnet.append((n, res))
        ui.ok(f"{n} node(s) {mode}: {res['img_per_sec']:.1f} img/s total, {res['img_per_sec_per_rank']:.1f} per rank")
        if profiled:
            merged = remote(
                "timeline", f"python {cluster.shared_dir}/benchmarks/merge_timeline.py {run_dir(cluster, run_id)}/timeline", 300
            )
            timeline = outdir / "timeline.json"
            timeline.write_text(merged)
            ui.ok(f"timeline of every rank at {n} node(s): {timeline} (open in ui.perfetto.dev or chrome://tracing)")

    allreduce: list[tuple[int, dict[str, Any]]] = []
    if top >= 2:
        ui.step(f"all-reduce sweep on {top} nodes ({opts.allreduce_min}..{opts.allreduce_max})")
        cmd = launch(f"allreduce-{top}", top, "allreduce.py", allreduce_args(opts))
        ar = parse_json_line(remote(f"allreduce-{top}", cmd, limit, nodes=top, on_line=SweepProgress()), "allreduce")
        allreduce.append((top, ar))
        ui.ok(f"all-reduce: avg busbw {ar['avg_busbw_gb_s']:.3f} GB/s, "
              f"max {max(r['busbw_gb_s'] for r in ar['rows']):.3f} GB/s, {ar['wrong']} wrong")
    else:
        ui.info("all-reduce skipped: it needs 2 or more nodes")

    nccl_copy = session.copy_nccl_logs()

    link = bidir = None
    workers = [n for n in cluster.nodes if n.role != "master"]
    if workers:
        ui.step(f"iperf3 link rate: master -> {workers[0].name}")
        ip = workers[0].private_ip
        try:
            link = parse_iperf(remote("iperf3", iperf_cmd(ip), 60, cleanup=False))
            # why also --bidir: a ring all-reduce sends and receives at once; where the
            # CPU moves the bytes (LXC veth) that halves what each direction gets
            bidir = parse_iperf(remote("iperf3-bidir", iperf_cmd(ip, bidir=True), 60, cleanup=False))
        except (OperationFailed, ValueError, KeyError) as e:  # results stand without it
            ui.warn(f"iperf3 failed ({e}); busbw is reported without a link rate")
        if link:
            ui.ok(f"link {link:.2f} Gbit/s = {bench_report.gbit_to_gbyte(link):.3f} GB/s one way"
                  + (f", {bidir:.2f} Gbit/s each way with --bidir" if bidir else ""))

    network = None
    if opts.net and len(cluster.nodes) > 1:
        pairs = net_pairs(cluster)
        ui.step(f"iperf3 between {'every pair of nodes' if len(cluster.nodes) <= ALL_PAIRS_UP_TO else 'neighbours in a ring'} "
                f"({len(pairs)} pair(s), one at a time)")
        measured = []
        for i, (a, b) in enumerate(pairs, 1):
            try:
                rate = parse_iperf(remote(f"net-{a.name}-{b.name}", pair_cmd(a.private_ip, b.private_ip), 60, cleanup=False))
                ui.info(f"  [{i}/{len(pairs)}] {a.name} -> {b.name}: {rate:.2f} Gbit/s")
            except (OperationFailed, ValueError, KeyError) as e:
                rate = None
                ui.warn(f"{a.name} -> {b.name}: no rate ({e})")
            measured.append({"src": a.name, "dst": b.name, "gbit_s": rate})
        network = bench_report.network_summary(measured)
        if network["slowest"]:
            ui.ok(f"slowest link {network['slowest']['src']} -> {network['slowest']['dst']}: "
                  f"{network['slowest']['gbit_s']:.2f} Gbit/s (median {network['median_gbit_s']:.2f})")

    versions = session.versions(resnet[0][1].get("versions", {}) if resnet else {}, list(opts.nodes), asdict(opts), sharing,
                                allreduce=allreduce[0][1].get("versions", {}) if allreduce else None)
    report = bench_report.aggregate(run_id, resnet, allreduce, link, versions, mode=opts.mode,
                                    link_bidir_gbit_s=bidir, network=network,
                                    hosts={n: cluster.hosts_of(n) for n in opts.nodes} | {n: spanned(cluster, n, run) for n, run in resnet})
    return session.publish(report, nccl_copy, timeline)


def spanned(cluster: Cluster, n: int, run: dict[str, Any]) -> int | None:
    """How many hosts the run on `n` nodes spanned: the cluster record's host of each node
    its ranks ran on (their hostnames, which are the node names: boot.py sets them). Under
    Slurm (--via slurm) those are the nodes the job was given, not the hostfile's first n;
    where the run names no node of the record, the hostfile's first n (mpirun's nodes)."""
    names = (run.get("versions") or {}).get("hosts") or []
    host_of = {node.name: node.host for node in cluster.nodes}
    if not names or any(name not in host_of for name in names):
        return cluster.hosts_of(n)
    hosts = {host_of[name] for name in names}
    return None if None in hosts else len(hosts)


Sweep = Callable[[Runner, "Cluster", Any, str, Path], dict[str, Any]]


def run_on_cluster(state: ClusterState, cluster: Cluster, opts: Launch, sweep: Sweep | None = None) -> dict[str, Any]:
    """A sweep on the master (run_bench, or training.run_train for --data), under the
    cluster's bench lock (one benchmark at a time); on Ctrl-C no rank is left running on any node."""
    from ..remote import MasterRunner

    runner = MasterRunner(state, cluster)
    with state.lock("bench"):
        run_id = time.strftime("%Y%m%d-%H%M%S")
        try:
            run: Sweep = sweep or run_bench
            return run(runner, cluster, opts, run_id, state.bench_dir / run_id)
        except KeyboardInterrupt:
            if opts.via == "slurm":
                ui.warn(f"interrupted: cancelling this bench's Slurm jobs (scancel --name={job_name(run_id)})")
            runner.run(stop_cmd(cluster, run_id, opts), timeout=60)
            raise


def push_results(state: ClusterState, cluster: Cluster, report: dict[str, Any]) -> bool:
    """The report -> the Pushgateway on the master, through an SSH tunnel (-> Grafana's
    Benchmarks dashboard). A failure is a warning: the results are in the state dir."""
    from ..pushgateway import push_to_master
    from . import metrics

    try:
        push_to_master(state, cluster, lambda url, login: metrics.push_bench_results(url, report, login=login))
    except (OperationFailed, OSError) as e:
        ui.warn(f"results not pushed to the Pushgateway ({e}); they are saved in the state dir")
        return False
    ui.ok("results pushed to the Pushgateway (deployer_bench_* series; Grafana: Benchmarks dashboard)")
    return True
