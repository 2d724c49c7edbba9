"""`deployer bench --data NAME`: time to a target accuracy on real data, per node count.

The real-data companion of deployer.bench.sweep.run_bench, on the same machinery (sweep.Session:
one shell command string per remote step, logged and saved to commands.sh; each run an
mpirun over the hostfile or, with --via slurm, an sbatch job followed on the master).
Order:

  1. the dataset's manifest on the master (<shared>/datasets/<name>/dataset.json): not
     there, a UsageError naming `deployer data fetch NAME`, before anything else is sent
  2. hostfile.N for each N
  3. for each N: benchmarks/resnet_train.py on N nodes until the target top-1 (or its
     last epoch), checkpointing into <run dir>/ckpt-N
  4. on GPU nodes: the non-empty NCCL warning logs, copied back (bench.Session.copy_nccl_logs)
  5. the report (report.training_report): `training` per N, and `results` rows of
     img/s with data loading (mode "train", the median epoch), so E(N) and the
     Pushgateway series read as the synthetic sweep's

A run that ends below the target is a result, not a failure: reached=false, a warning
line, exit 0. A run that crashes fails the sweep as a synthetic run does.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import ui
from ..errors import OperationFailed, UsageError
from ..launch.mpirun import parse_json_line
from . import commands, datasets, profiles, storage_reads
from . import report as bench_report
from . import sweep as bench
from .progress import RunProgress

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..remote import Runner
    from ..state import ClusterState

SCRIPT = "resnet_train.py"
NO_MANIFEST = "deployer: no dataset manifest"


@dataclass(frozen=True)
class TrainOptions:
    nodes: tuple[int, ...]
    dataset: str
    target_acc: float | None  # None (a dataset outside the catalog): its manifest's own target
    epochs: int | None = None  # most epochs per run; None: the dataset's default (its manifest)
    threads: int | None = None  # torch threads per rank; None: resnet_train.py sizes itself
    amp: bool = False
    auto_flags: tuple[str, ...] = ()  # amp chosen by the hardware, not asked for
    run_timeout_s: int = 3600  # wall-clock bound of one training run
    via: str = "mpirun"
    queue_timeout_s: int = 3600
    storage_metrics: bool = True  # ask the master's Prometheus for the shared storage's reads (monitoring on)


def refuse_synthetic_flags(**given: Any) -> None:
    """`bench --data` takes the model and batch from the dataset's manifest: a flag of the
    synthetic benchmark given with it (its value not None) is a mistake, refused by name."""
    flag = next((f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None), None)
    if flag:
        raise UsageError(f"{flag} is for the synthetic benchmark; with --data the dataset's manifest sets "
                         "the model and batch: drop it, or drop --data")


def make_train_options(cluster: Cluster, *, data: str, target_acc: float | None = None, nodes: str | None = None,
                       epochs: int | None = None, threads: int | None = None, amp: bool | None = None,
                       run_timeout_s: int = 3600, via: str = "mpirun", queue_timeout_s: int = 3600,
                       storage_metrics: bool = True) -> TrainOptions:
    """Validate `bench --data` flags before anything runs (UsageError, exit 2). A name outside
    the catalog is a dataset the user imported: its manifest on the master decides (run_train).
    target_acc None: the dataset's own target; threads None: as the synthetic sweep sizes
    them; amp None: on with GPU nodes, off on CPU-only ones."""
    ds = datasets.CATALOG.get(datasets.check_name(data))
    if target_acc is not None:
        target: float | None = datasets.target_accuracy(target_acc)
    else:
        target = ds.training.target_acc if ds else None
    counts = profiles.parse_node_counts(nodes, len(cluster.nodes))
    chosen, auto = profiles.gpu_defaults(cluster, {"amp": amp})
    if epochs is not None and epochs < 1:
        raise UsageError("--epochs must be at least 1")
    if threads is not None and threads < 1:
        raise UsageError("--threads must be at least 1")
    if run_timeout_s < 1:
        raise UsageError("--timeout must be positive")
    if via not in profiles.LAUNCHERS:
        raise UsageError(f"--via {via!r}: use one of {', '.join(profiles.LAUNCHERS)}")
    if queue_timeout_s < 1:
        raise UsageError("--queue-timeout must be positive")
    return TrainOptions(nodes=counts, dataset=data, target_acc=target, epochs=epochs,
                        threads=threads if threads is not None else profiles.threads_per_rank(cluster, counts),
                        amp=chosen["amp"], auto_flags=tuple(a for a in auto if a == "amp"),
                        run_timeout_s=run_timeout_s, via=via, queue_timeout_s=queue_timeout_s,
                        storage_metrics=storage_metrics)


# --- the remote commands ---------------------------------------------------------------
def data_dir(cluster: Cluster, name: str) -> str:
    return datasets.dataset_dir(cluster.shared_dir, name)


def manifest_cmd(cluster: Cluster, name: str) -> str:
    """Print the dataset's manifest on the master, or NO_MANIFEST and the datasets that are
    there (exit 0 both ways, so a failure of the command itself stays an OperationFailed)."""
    path = shlex.quote(f"{data_dir(cluster, name)}/{datasets.MANIFEST}")
    there = shlex.quote(datasets.dataset_dir(cluster.shared_dir, ""))
    return (f"if [ -f {path} ]; then cat {path}; else echo {shlex.quote(NO_MANIFEST)}; "
            f"for m in {there}*/{datasets.MANIFEST}; do [ -f \"$m\" ] && basename \"$(dirname \"$m\")\"; done; true; fi")


def parse_manifest(stdout: str, name: str) -> dict[str, Any]:
    text = stdout.strip()
    if not text or NO_MANIFEST in text:
        if name in datasets.CATALOG:
            raise UsageError(f"dataset {name} is not on the cluster: run `deployer data fetch {name}` first")
        there = sorted(ln.strip() for ln in text.split(NO_MANIFEST, 1)[-1].splitlines() if ln.strip())
        raise UsageError(f"unknown dataset {name!r}: on the cluster are {', '.join(there) or 'none'}; "
                         f"`deployer data fetch` takes {', '.join(sorted(datasets.CATALOG))}, "
                         f"`deployer data import PATH --as {name}` your own")
    try:
        m = json.loads(text[text.index("{"):])
    except (ValueError, json.JSONDecodeError):
        raise OperationFailed(f"the manifest of dataset {name} on the master is not JSON: "
                              f"run `deployer data fetch {name}` again") from None
    if not isinstance(m, dict) or m.get("schema") != datasets.SCHEMA:
        raise OperationFailed(f"dataset {name} on the master has a manifest of another schema "
                              f"({m.get('schema') if isinstance(m, dict) else None}): run `deployer data fetch {name}` again")
    return m


def manifest_summary(m: dict[str, Any]) -> dict[str, Any]:
    """The dataset in the report's versions: what was trained on, and which files exactly."""
    splits = m.get("splits") or {}
    return {"name": m.get("name"), "format": m.get("format"), "shape": m.get("shape"),
            "classes": len(m.get("classes") or []), "train_samples": (splits.get("train") or {}).get("samples"),
            "test_samples": (splits.get("test") or {}).get("samples"), "source": m.get("source"),
            "training": m.get("training"),
            "sha256": {f: (v or {}).get("sha256") for f, v in (m.get("files") or {}).items()}}


def train_args(cluster: Cluster, run_id: str, opts: TrainOptions, n: int) -> list[str]:
    args = ["--data", data_dir(cluster, opts.dataset), "--target-acc", f"{opts.target_acc:g}",
            "--checkpoint-dir", f"{commands.run_dir(cluster, run_id)}/ckpt-{n}", "--json", "--progress"]
    if opts.epochs:
        args += ["--epochs", str(opts.epochs)]
    if opts.amp:
        args.append("--amp")
    if opts.threads:
        args += ["--threads", str(opts.threads)]
    return args


# --- the sweep ---------------------------------------------------------------------------
def run_train(runner: Runner, cluster: Cluster, opts: TrainOptions, run_id: str,
              outdir: Path) -> dict[str, Any]:
    """Train to the target at every N; write results into outdir; return the --json record."""
    # before the session: a dataset that is not there changes nothing, here or on the master
    rc, out, err = runner.run(manifest_cmd(cluster, opts.dataset), timeout=60)
    if rc != 0:
        raise OperationFailed(f"reading dataset {opts.dataset}'s manifest on the master failed (exit {rc}): "
                              f"{(err.strip().splitlines() or ['no output'])[-1]}")
    manifest = parse_manifest(out, opts.dataset)
    if opts.target_acc is None:  # an imported dataset: its manifest's target, else resnet_train.py's own default
        opts = dataclasses.replace(opts, target_acc=float((manifest.get("training") or {}).get("target_acc") or 0.9))
    assert opts.target_acc is not None  # the catalog's or the manifest's (just above)
    session = bench.Session(runner, cluster, opts, run_id, outdir)
    with session.script.open("a") as f:
        f.write(manifest_cmd(cluster, opts.dataset) + "\n")
    ui.step(f"bench {run_id}: {manifest['name']} to top-1 {opts.target_acc:g}, nodes {','.join(map(str, opts.nodes))}"
            + (f", {opts.threads} thread(s) per rank" if opts.threads else "")
            + (", each run an sbatch job" if opts.via == "slurm" else ""))
    t = manifest.get("training") or {}
    ui.info(f"  the dataset's training defaults: {t.get('model', '?')}, batch {t.get('batch_size', '?')} per rank, "
            f"base lr {t.get('base_lr', '?')} per 256 images, up to {opts.epochs or t.get('epochs', '?')} epochs; "
            f"AMP {'on' if opts.amp else 'off'}" + (" (auto)" if opts.auto_flags else ""))
    session.remote("hostfiles", commands.hostfiles_cmd(cluster, run_id, opts.nodes), 60, cleanup=False)

    runs: list[tuple[int, dict[str, Any]]] = []
    for i, n in enumerate(opts.nodes, 1):
        ui.step(f"resnet_train on {n} node(s) (run {i}/{len(opts.nodes)})")
        name = f"train-{n}"
        cmd = session.launch(name, n, SCRIPT, train_args(cluster, run_id, opts, n))
        with RunProgress(f"{n} node(s) train", target=opts.target_acc) as progress:
            out = session.remote(name, cmd, session.limit, on_line=progress, nodes=n)
        rec = parse_json_line(out, f"resnet_train ({n} nodes)")
        runs.append((n, rec))
        last = rec["history"][-1]["top1"] if rec["history"] else None
        if rec["reached"]:
            ui.ok(f"{n} node(s): top-1 {opts.target_acc:g} reached in {rec['time_to_target_s']:.1f}s "
                  f"(epoch {rec['epochs_to_target']}), {bench_report.median_img_per_sec(rec):.1f} img/s")
        else:
            ui.warn(f"{n} node(s): target top-1 {opts.target_acc:g} not reached in {rec['epochs_run']} epoch(s) "
                    f"(last {last if last is None else format(last, '.4f')}, best {rec['best_top1']}); "
                    f"reported with reached=false: more --epochs or a lower --target-acc")

    nccl_copy = session.copy_nccl_logs()  # GPU nodes: every rank's NCCL warnings, back from the run dir
    if opts.storage_metrics:
        storage_during(session, cluster, runs)
    versions = session.versions(runs[0][1].get("versions", {}) if runs else {}, list(opts.nodes),
                                {**asdict(opts), "ranks": {str(n): len(cluster.rank_nodes(n)) for n in opts.nodes}},
                                profiles.cpu_sharing(cluster, opts), dataset=manifest_summary(manifest))
    versions = json.loads(json.dumps(versions))  # tuples as lists: the record returned is the one on disk
    report = bench_report.training_report(run_id, manifest, opts.target_acc, runs, versions)
    return session.publish(report, nccl_copy)


def epochs_run_now(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The epochs this run trained (a resumed run's history starts with the earlier ones)."""
    return (rec.get("history") or [])[rec.get("resumed_from_epoch") or 0:]


def storage_during(session: bench.Session, cluster: Cluster, runs: list[tuple[int, dict[str, Any]]]) -> None:
    """Each run's shared-storage reads from the master's Prometheus (storage_reads), into
    rec["storage"]: after the sweep, once the first scrape after the last run is due."""
    windows = {n: (e[0]["started_at"], e[-1]["ended_at"]) for n, rec in runs
               if (e := epochs_run_now(rec)) and "started_at" in e[0]}
    if not windows:
        return
    due = max(end for _, end in windows.values()) + storage_reads.SCRAPE_S + 1 - time.time()
    if due > 0:
        ui.info(f"  waiting {due:.0f} s for Prometheus's next scrape (the shared storage's reads during each run)")
        time.sleep(due)
    ip = cluster.master.private_ip
    for n, rec in runs:
        if n in windows:
            out = session.remote(f"storage-{n}", storage_reads.query_cmd(ip, *windows[n]), 60, cleanup=False)
            rec["storage"] = storage_reads.parse(out, *windows[n], cluster.shared_storage)
    notes = {r["storage"]["note"] for _, r in runs if r.get("storage", {}).get("note")}
    for note in sorted(notes):
        ui.info(f"  shared storage reads: {note}")


def run_on_cluster(state: ClusterState, cluster: Cluster, opts: TrainOptions) -> dict[str, Any]:
    """The training sweep on the master, as bench.run_on_cluster runs the synthetic one."""
    return bench.run_on_cluster(state, cluster, opts, sweep=run_train)

