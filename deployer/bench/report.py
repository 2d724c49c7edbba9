"""Benchmark results: the formulas, the aggregate record, files and a console table.

Pure functions over the JSON lines the benchmarks print; the only I/O is writing the
result files. Formulas (numbers a reader can check by hand):

  efficiency  E(N) = T_N / (N * T_1)           T = total img/sec, fixed per-rank batch
  busbw       B = algbw * 2(n-1)/n              n = ranks in the all-reduce
  comm share  1 - T_dp / T_ensemble             at the same N
  link        iperf3 Gbit/s / 8 = GB/s          the same unit as busbw
  of NVIDIA   (img/s per GPU) / NVIDIA's        ResNet-50 on a GPU NVIDIA published a figure for
              published 1-GPU AMP img/s         (deployer/data/nvidia_resnet50_reference.json)
  time to     elapsed training + evaluation     bench --data: resnet_train.py's clock at the first
  accuracy    seconds to the target top-1        epoch whose test top-1 reaches the target
  speed-up    t_b / t_N                          time to accuracy at the smallest N b over N's
  loading     1 - T_data / T_memory              bench --data at one N: the median epoch's img/s
  cost                                           against the same step on a batch held in memory
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from .schema import SCHEMA, validate

if TYPE_CHECKING:
    from rich.console import JustifyMethod


def efficiency(t_n: float, n: int, t_1: float) -> float:
    """Scaling efficiency of N nodes against one: T_N / (N * T_1)."""
    if n < 1 or t_1 <= 0:
        raise ValueError("efficiency needs n >= 1 and T_1 > 0")
    return t_n / (n * t_1)


def busbw(algbw: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce over n ranks (0 for one rank)."""
    if n < 1:
        raise ValueError("busbw needs n >= 1")
    return algbw * 2 * (n - 1) / n


def comm_share(dp_img_per_sec: float, ensemble_img_per_sec: float) -> float:
    """Share of the step time spent exchanging gradients: 1 - T_dp / T_ensemble."""
    if ensemble_img_per_sec <= 0:
        raise ValueError("ensemble throughput must be > 0")
    return 1.0 - dp_img_per_sec / ensemble_img_per_sec


def gbit_to_gbyte(gbit_s: float) -> float:
    return gbit_s / 8.0


# --- NVIDIA's published ResNet-50 training throughput: the yardstick for img/s per GPU -----
REFERENCE_FILE = Path(__file__).parents[1] / "data" / "nvidia_resnet50_reference.json"


@cache
def _references() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(REFERENCE_FILE.read_text())
    return data


def nvidia_reference(model: str | None, gpu: str | None) -> dict[str, Any] | None:
    """NVIDIA's published 1-GPU mixed-precision training img/s for this GPU, with its source;
    None for a model other than the file's (resnet50), a CPU run, or a GPU NVIDIA published
    no figure for. `gpu` is the name torch.cuda.get_device_name() reports."""
    data = _references()
    if not gpu or model != data["model"]:
        return None
    for entry in data["entries"]:
        if re.search(entry["gpu_pattern"], gpu, re.IGNORECASE):
            return {"model": data["model"], "gpu": gpu, **entry}
    return None


def aggregate(
    run_id: str,
    resnet: Iterable[tuple[int, dict[str, Any]]],
    allreduce: Iterable[tuple[int, dict[str, Any]]] = (),
    link_gbit_s: float | None = None,
    versions: dict[str, Any] | None = None,
    mode: str = "dp",
    link_bidir_gbit_s: float | None = None,
    network: dict[str, Any] | None = None,
    hosts: Mapping[int, int | None] | None = None,
) -> dict[str, Any]:
    """Build the --json record from (nodes, benchmark JSON) pairs.

    `resnet` holds runs of resnet_synthetic.py; those in `mode` make the results
    rows, those of the other mode (ensemble beside dp) add ensemble_img_per_sec and
    comm_share to the row of the same node count. link_bidir_gbit_s (iperf3 --bidir,
    per direction) is kept beside the one-way rate as link.bidir_gbit_s. Efficiency is against the smallest
    node count measured: T_1 when 1 is in the sweep, else T_b/b for baseline b. `hosts`:
    node count -> the hosts its run spanned (cluster.hosts_of), kept on each row.
    """
    primary: dict[int, dict[str, Any]] = {}
    other: dict[int, dict[str, Any]] = {}
    for nodes, run in resnet:
        (primary if run.get("mode", "dp") == mode else other)[nodes] = run
    rows = []
    if primary:
        base_n = min(primary)
        per_node_1 = primary[base_n]["img_per_sec"] / base_n  # T_1 (or its estimate T_b / b)
        for nodes in sorted(primary):
            run = primary[nodes]
            row = {
                "nodes": nodes,
                "ranks": run["world_size"],
                "img_per_sec": run["img_per_sec"],
                "img_per_sec_per_rank": run["img_per_sec_per_rank"],
                "efficiency": efficiency(run["img_per_sec"], nodes, per_node_1) if per_node_1 > 0 else None,
                "mode": run.get("mode", mode),
                "model": run.get("model"),
                "batch_size": run.get("batch_size"),
                "image_size": run.get("image_size"),
                "baseline_nodes": base_n,
                "hosts": (hosts or {}).get(nodes),
            }
            if nodes in other and mode == "dp":
                ens = other[nodes]["img_per_sec"]
                row["ensemble_img_per_sec"] = ens
                row["comm_share"] = comm_share(run["img_per_sec"], ens) if ens > 0 else None
            rows.append(row)
    bench_versions = (versions or {}).get("benchmark") or {}
    reference = nvidia_reference(rows[0]["model"], bench_versions.get("gpu")) if rows else None
    if reference and not_comparable(reference, rows[0], (versions or {}).get("flags") or {}):
        reference = None  # the console says why (reference_line)
    ar_rows = [
        {
            "nodes": nodes,
            "bytes": r["bytes"],
            "time_us": r["time_us"],
            "algbw_gb_s": r["algbw_gb_s"],
            "busbw_gb_s": r["busbw_gb_s"],
            "wrong": r["wrong"],
        }
        for nodes, run in allreduce
        for r in run["rows"]
    ]
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "results": rows,
        "allreduce": ar_rows,
        "link": None if link_gbit_s is None else {"tool": "iperf3", "gbit_s": link_gbit_s,
                                                  "bidir_gbit_s": link_bidir_gbit_s},
        "network": network,
        "files": {"json": None, "csv": None, "plots": []},
        "versions": versions or {},
        "reference": reference,
    }


# --- bench --data: training to a target accuracy (benchmarks/resnet_train.py) -----------
def median_img_per_sec(rec: Mapping[str, Any]) -> float:
    """A training run's throughput: the median epoch's training img/s, data loading included
    (the median, so the first epoch's start-up and one slow epoch do not move it)."""
    return _median_of(rec.get("history") or [], "img_per_sec") or 0.0


def loading_cost(img_per_sec: float | None, compute_img_per_sec: float | None) -> float | None:
    """The share of throughput data loading costs: 1 - (img/s reading the dataset) / (img/s of
    the same step on a batch in memory). Near 0: the loaders keep up; below 0 is noise."""
    if not img_per_sec or not compute_img_per_sec:
        return None
    return 1 - img_per_sec / compute_img_per_sec


def _median_of(history: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [e[key] for e in history if e.get(key) is not None]
    return statistics.median(values) if values else None


def training_run(nodes: int, rec: Mapping[str, Any]) -> dict[str, Any]:
    """One `training.runs` entry from resnet_train.py's --json record at N nodes (and the
    shared storage's reads the bench asked Prometheus for, rec["storage"])."""
    keep = ("epoch", "top1", "img_per_sec", "epoch_s", "elapsed_s", "loss", "lr", "data_wait_frac", "read_mb_per_s")
    history = [{k: e.get(k) for k in keep} for e in rec.get("history") or []]
    ips = median_img_per_sec(rec) if history else None
    return {"nodes": nodes, "ranks": rec["world_size"], "epochs": rec["epochs"], "epochs_run": rec["epochs_run"],
            "img_per_sec": ips, "compute_img_per_sec": rec.get("compute_img_per_sec"),
            "loading_cost": loading_cost(ips, rec.get("compute_img_per_sec")),
            "data_wait_frac": _median_of(history, "data_wait_frac"), "read_mb_per_s": _median_of(history, "read_mb_per_s"),
            "storage": rec.get("storage"),
            "reached": bool(rec["reached"]), "time_to_target_s": rec.get("time_to_target_s"),
            "epochs_to_target": rec.get("epochs_to_target"), "final_top1": history[-1]["top1"] if history else None,
            "best_top1": rec.get("best_top1"), "model": rec["model"], "batch_size": rec["batch_size"],
            "global_batch": rec["global_batch"], "base_lr": rec["base_lr"], "peak_lr": rec["peak_lr"], "history": history}


def training_report(run_id: str, manifest: Mapping[str, Any], target_acc: float,
                    runs: Iterable[tuple[int, dict[str, Any]]], versions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report of a `bench --data` sweep: `training` (time to accuracy per N) and `results`
    rows of mode "train" (the median epoch's img/s with data loading, per-rank batch fixed
    across N, so E(N) reads as the synthetic sweep's). No NVIDIA reference: its figures are
    ImageNet at 224 px, not whatever the dataset's images are."""
    runs = list(runs)
    throughput = [(n, {"world_size": rec["world_size"], "img_per_sec": median_img_per_sec(rec),
                       "img_per_sec_per_rank": median_img_per_sec(rec) / rec["world_size"], "mode": "train",
                       "model": rec["model"], "batch_size": rec["batch_size"], "image_size": manifest["shape"][-1]})
                  for n, rec in runs if rec.get("history")]
    report = aggregate(run_id, throughput, versions=versions, mode="train")
    report["reference"] = None
    report["training"] = {"dataset": manifest["name"], "target_acc": target_acc,
                          "runs": [training_run(n, rec) for n, rec in runs]}
    return report


def speedups(training: Mapping[str, Any]) -> dict[int, float | None]:
    """Time-to-accuracy speed-up of each N over the smallest N that reached the target."""
    reached = [r for r in training["runs"] if r["reached"] and r["time_to_target_s"]]
    if not reached:
        return {r["nodes"]: None for r in training["runs"]}
    base = min(reached, key=lambda r: r["nodes"])["time_to_target_s"]
    return {r["nodes"]: (base / r["time_to_target_s"] if r["reached"] and r["time_to_target_s"] else None)
            for r in training["runs"]}


def not_comparable(reference: Mapping[str, Any], row: Mapping[str, Any], flags: Mapping[str, Any]) -> str | None:
    """Why a run cannot be set against NVIDIA's figure (another image size, no AMP), or None."""
    why = []
    if row.get("image_size") != reference.get("image_size", 224):
        why.append(f"{row.get('image_size')} px, NVIDIA's {reference.get('image_size', 224)} px")
    if flags.get("amp") is not True:
        why.append(f"{'no AMP' if flags.get('amp') is False else 'precision not recorded'}, NVIDIA's {reference['precision']}")
    return "; ".join(why) or None


def reference_share(row: Mapping[str, Any], reference: Mapping[str, Any] | None) -> float | None:
    """A row's img/s per GPU as a share of NVIDIA's published figure (ranks are GPUs on GPU runs)."""
    if not reference or not reference.get("img_per_sec_per_gpu"):
        return None
    share: float = row["img_per_sec_per_rank"] / reference["img_per_sec_per_gpu"]
    return share


def reference_line(report: Mapping[str, Any]) -> str | None:
    """'img/s per GPU: X (NVIDIA published: Y for <gpu>, AMP; Z %)' for the smallest node count
    measured, or None where there is no published figure to read it against."""
    ref, rows = report.get("reference"), report.get("results") or []
    if not rows:
        return None
    row = min(rows, key=lambda r: r["nodes"])
    if not ref:  # a figure for this GPU exists, but not for a run like this one: say so
        versions = report.get("versions") or {}
        found = nvidia_reference(row.get("model"), (versions.get("benchmark") or {}).get("gpu"))
        why = found and not_comparable(found, row, versions.get("flags") or {})
        return f"img/s per GPU: {row['img_per_sec_per_rank']:.1f} (no comparable NVIDIA figure: {why})" if why else None
    share = reference_share(row, ref)
    assert share is not None  # a reference's img_per_sec_per_gpu is > 0 (schema.py)
    return (f"img/s per GPU: {row['img_per_sec_per_rank']:.1f} (NVIDIA published: {ref['img_per_sec_per_gpu']:g} "
            f"for {ref['gpu']}, {ref['precision']} at {ref.get('image_size', 224)} px; {share * 100:.0f} %)")


def reference_source(ref: Mapping[str, Any]) -> str:
    """Where NVIDIA's figure comes from and how it was measured, in one line."""
    how = ", ".join(x for x in (f"{ref.get('gpus', 1)} GPU", f"batch {ref['batch_size']}/GPU" if ref.get("batch_size") else "",
                                ref.get("memory_format") or "", ref.get("container") or "") if x)
    return f"NVIDIA's figure: {ref['system']}, {how} — {ref['source']['table']}: {ref['source']['url']}"


def precision_text(flags: Mapping[str, Any]) -> str:
    """'AMP on (auto), channels_last on (auto), fp16 all-reduce off': the values every run used,
    and which the hardware chose (deployer.bench.profiles.gpu_defaults) rather than a flag."""
    auto = set(flags.get("auto_flags") or ())

    def one(key: str, label: str) -> str:
        return f"{label} {'on' if flags.get(key) else 'off'}" + (" (auto)" if key in auto else "")

    return ", ".join((one("amp", "AMP"), one("channels_last", "channels_last"), one("fp16_allreduce", "fp16 all-reduce")))


def gpu_header(report: Mapping[str, Any]) -> str | None:
    """The GPU run's hardware and stack in one line: GPU, per-node count, CUDA, driver, NCCL."""
    v = (report.get("versions") or {}).get("benchmark") or {}
    if not v.get("gpu"):
        return None
    counts = v.get("gpu_count") or {}
    per_node = ""
    if counts:
        per_node = (f", {next(iter(counts.values()))} per node" if len(set(counts.values())) == 1
                    else " (" + ", ".join(f"{h}: {c}" for h, c in counts.items()) + ")")
    names = set((v.get("gpu_names") or {}).values()) - {v["gpu"]}
    parts = [f"GPU {v['gpu']}{per_node}" + (f" (also {', '.join(sorted(names))})" if names else "")]
    parts += [f"{label} {v[key]}" for key, label in (("cuda", "CUDA"), ("driver", "driver"), ("nccl", "NCCL"), ("cudnn", "cuDNN"))
              if v.get(key)]
    return " · ".join(parts)


def network_summary(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """The pairwise iperf3 rates, with the slowest pair and the median: one slow link
    holds every ring all-reduce back, so it is the first thing to look at."""
    rated = [p for p in pairs if p.get("gbit_s") is not None]
    slowest = min(rated, key=lambda p: p["gbit_s"]) if rated else None
    median = statistics.median(p["gbit_s"] for p in rated) if rated else None
    return {"tool": "iperf3", "pairs": pairs, "slowest": slowest, "median_gbit_s": median}


CSV_FIELDS = [
    "kind", "nodes", "ranks", "img_per_sec", "img_per_sec_per_rank", "efficiency",
    "ensemble_img_per_sec", "comm_share", "bytes", "time_us", "algbw_gb_s", "busbw_gb_s", "wrong",
    "epoch", "top1", "epoch_s", "elapsed_s", "time_to_target_s", "reached", "data_wait_frac", "read_mb_per_s",
    "hosts",
]


def write_files(report: dict[str, Any], outdir: Path) -> dict[str, Any]:
    """Write results.json, results.csv and the PNG plots into outdir; fill report["files"].
    The report is checked against the schema (deployer/bench/schema.py) first."""
    validate(report)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    given = report.get("files") or {}
    files: dict[str, Any] = {"json": str(outdir / "results.json"), "csv": str(outdir / "results.csv"), "plots": [],
             "timeline": given.get("timeline"), "nccl_logs": given.get("nccl_logs"),
             "job_scripts": given.get("job_scripts") or []}
    report["files"] = files
    # why one CSV with a "kind" column: the schema names one CSV file; spreadsheet
    # users filter on kind = scaling | allreduce | training (bench --data: a row per N and epoch).
    with open(files["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in report["results"]:
            w.writerow({"kind": "scaling", **row})
        for row in report["allreduce"]:
            w.writerow({"kind": "allreduce", **row})
        for run in (report.get("training") or {}).get("runs") or []:
            for e in run["history"]:
                w.writerow({"kind": "training", "nodes": run["nodes"], "ranks": run["ranks"], **e,
                            "time_to_target_s": run["time_to_target_s"], "reached": run["reached"]})
    files["plots"] = [str(p) for p in plot(report, outdir)]
    report.update(validate(report))
    Path(files["json"]).write_text(json.dumps(report, indent=2) + "\n")
    return report


def plot(report: dict[str, Any], outdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    paths: list[Path] = []
    rows = report["results"]
    if rows:
        nodes = [r["nodes"] for r in rows]
        base = rows[0]["img_per_sec"] / rows[0]["nodes"]
        for name, ys, ideal, ylabel in (
            ("throughput.png", [r["img_per_sec"] for r in rows], [base * n for n in nodes], "images / s (total)"),
            ("efficiency.png", [r["efficiency"] for r in rows], [1.0] * len(nodes), "efficiency T_N / (N T_1)"),
        ):
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.plot(nodes, ys, "o-", label="measured")
            ax.plot(nodes, ideal, "--", color="grey", label="ideal")
            ax.set_xlabel("nodes")
            ax.set_ylabel(ylabel)
            ax.set_xticks(nodes)
            ax.set_title(f"{rows[0].get('model') or ''} {rows[0].get('mode') or ''} — {report['run_id']}".strip())
            ax.grid(alpha=0.3)
            ax.legend()
            paths.append(_save(plt, fig, outdir / name))
    ar = report["allreduce"]
    if ar:
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in sorted({r["nodes"] for r in ar}):
            pts = [r for r in ar if r["nodes"] == n]
            ax.plot([r["bytes"] for r in pts], [r["busbw_gb_s"] for r in pts], "o-", label=f"busbw, {n} nodes")
        if report.get("link"):
            gb = gbit_to_gbyte(report["link"]["gbit_s"])
            ax.axhline(gb, color="red", ls="--", label=f"iperf3 link {gb:.2f} GB/s")
            if report["link"].get("bidir_gbit_s"):
                gb2 = gbit_to_gbyte(report["link"]["bidir_gbit_s"])
                ax.axhline(gb2, color="orange", ls=":", label=f"iperf3 --bidir, each way {gb2:.2f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"all-reduce — {report['run_id']}")
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(_save(plt, fig, outdir / "busbw.png"))
    net = report.get("network")
    if net and net["pairs"]:
        paths.append(_plot_network(plt, net, report["run_id"], outdir / "network.png"))
    if report.get("training") and report["training"]["runs"]:
        paths += _plot_training(plt, report["training"], report["run_id"], outdir)
    return paths


def _save(plt: Any, fig: Any, path: Path) -> Path:
    """Every plot's last step: laid out, written at 100 dpi, its figure freed."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_training(plt: Any, training: dict[str, Any], run_id: str, outdir: Path) -> list[Path]:
    """accuracy.png: test top-1 against training + evaluation time, a curve per N, the target
    dashed; time_to_accuracy.png: time to the target against N (a cross at the last epoch's
    time where the target was not reached)."""
    runs, target = training["runs"], training["target_acc"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        ax.plot([e["elapsed_s"] for e in r["history"]], [e["top1"] for e in r["history"]], "o-",
                label=f"{r['nodes']} node(s), {r['ranks']} rank(s)" + ("" if r["reached"] else " — not reached"))
    ax.axhline(target, color="grey", ls="--", label=f"target {target:g}")
    ax.set_xlabel("training + evaluation time (s)")
    ax.set_xlim(left=0)
    ax.set_ylabel("test top-1")
    ax.set_ylim(0, 1)
    ax.set_title(f"{training['dataset']} {runs[0]['model']} — {run_id}")
    ax.grid(alpha=0.3)
    ax.legend()
    paths = [_save(plt, fig, outdir / "accuracy.png")]

    fig, ax = plt.subplots(figsize=(6, 4))
    nodes = [r["nodes"] for r in runs]
    hit = [r for r in runs if r["reached"]]
    miss = [r for r in runs if not r["reached"] and r["history"]]
    if hit:
        ax.plot([r["nodes"] for r in hit], [r["time_to_target_s"] for r in hit], "o-", label=f"time to top-1 {target:g}")
        base = min(hit, key=lambda r: r["nodes"])
        ax.plot(nodes, [base["time_to_target_s"] * base["nodes"] / n for n in nodes], "--", color="grey", label="ideal (1/N)")
    if miss:
        ax.plot([r["nodes"] for r in miss], [r["history"][-1]["elapsed_s"] for r in miss], "x", color="red", ms=10,
                label="not reached (time of the last epoch)")
    ax.set_xlabel("nodes")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.set_xticks(nodes)
    ax.set_title(f"time to accuracy — {training['dataset']} — {run_id}")
    ax.grid(alpha=0.3)
    ax.legend()
    paths.append(_save(plt, fig, outdir / "time_to_accuracy.png"))
    measured = [r for r in runs if r.get("compute_img_per_sec") and r.get("img_per_sec")]
    if measured:
        paths.append(_plot_data_loading(plt, measured, training["dataset"], run_id, outdir / "data_loading.png"))
    return paths


def _plot_data_loading(plt: Any, runs: list[dict[str, Any]], dataset: str, run_id: str, path: Path) -> Path:
    """data_loading.png: img/s reading the dataset beside img/s on a batch in memory, per N;
    the gap, written over each pair, is what data loading costs."""
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(runs))
    ax.bar([x - 0.2 for x in xs], [r["img_per_sec"] for r in runs], 0.4, label="reading the dataset (median epoch)")
    ax.bar([x + 0.2 for x in xs], [r["compute_img_per_sec"] for r in runs], 0.4, label="one batch in memory")
    for x, r in zip(xs, runs, strict=True):
        ax.annotate(f"cost {r['loading_cost']:+.0%}", (x, max(r["img_per_sec"], r["compute_img_per_sec"])),
                    ha="center", va="bottom")
    ax.set_xticks(list(xs), [f"{r['nodes']} node(s)" for r in runs])
    ax.set_ylabel("training img/s")
    ax.set_title(f"data loading cost — {dataset} — {run_id}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="lower right")
    return _save(plt, fig, path)


def _plot_network(plt: Any, net: dict[str, Any], run_id: str, path: Path) -> Path:
    """The pairwise rates as a matrix (sender rows, receiver columns), values written in."""
    import math

    names = sorted({p["src"] for p in net["pairs"]} | {p["dst"] for p in net["pairs"]},
                   key=lambda n: (not n.endswith("-master"), int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else 0))
    idx = {n: i for i, n in enumerate(names)}
    grid = [[math.nan] * len(names) for _ in names]
    for p in net["pairs"]:
        if p["gbit_s"] is not None:
            grid[idx[p["src"]]][idx[p["dst"]]] = p["gbit_s"]
    fig, ax = plt.subplots(figsize=(1.2 * len(names) + 2.5, 1.0 * len(names) + 1.5))
    im = ax.imshow(grid, cmap="viridis")
    short = [n.split("-", 1)[-1] for n in names]
    ax.set_xticks(range(len(names)), short, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), short)
    ax.set_xlabel("receiver")
    ax.set_ylabel("sender")
    for p in net["pairs"]:
        if p["gbit_s"] is not None:
            ax.text(idx[p["dst"]], idx[p["src"]], f"{p['gbit_s']:.1f}", ha="center", va="center", color="white")
    fig.colorbar(im, ax=ax, label="Gbit/s (iperf3)")
    ax.set_title(f"node to node — {run_id}")
    return _save(plt, fig, path)


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def hosts_line(report: Mapping[str, Any]) -> str | None:
    """How many hosts the sweep's runs spanned (the hostfile puts a host's nodes together,
    so a run on N nodes takes as few as the placement allows); None: not known."""
    spans = [(r["nodes"], r["hosts"]) for r in report.get("results") or [] if r.get("hosts") is not None]
    if not spans:
        return None
    said = ", ".join(f"{n} node(s) on {h}" for n, h in spans)
    return f"hosts: {said} (pairs on one host talk through its bridge, across hosts through the network)"


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """What the numbers were measured with and against: the precision flags, NVIDIA's figure
    for this GPU and where it is from, and where NCCL's warnings went (GPU runs)."""
    versions = report.get("versions") or {}
    lines = [precision_text(versions["flags"])] if versions.get("flags") else []
    if report.get("reference"):
        lines += [reference_line(report) or "", reference_source(report["reference"])]
    else:
        lines.append(reference_line(report) or "")  # "no comparable NVIDIA figure: ..." where one exists
    spans = hosts_line(report)
    if spans:
        lines.append(spans)
    nccl = versions.get("nccl_debug")
    if nccl:
        copied = (report.get("files") or {}).get("nccl_logs")
        lines.append(f"NCCL_DEBUG={nccl['NCCL_DEBUG']}: logs {nccl['NCCL_DEBUG_FILE']} on the master"
                     + (f", warnings copied to {copied}" if copied else ", no warnings"))
    return [line for line in lines if line]


def results_table(report: dict[str, Any]) -> Table:
    """Scaling table for the console; on GPUs the hardware and stack head it, and img/s per GPU
    is set against NVIDIA's published figure where there is one."""
    header = gpu_header(report)
    t = Table(title=f"ResNet synthetic — {report['run_id']}" + (f"\n{header}" if header else ""),
              caption="\n".join(summary_lines(report)) or None, caption_justify="left")
    ref = report.get("reference")
    cols = ["nodes", "hosts", "ranks", "img/s", "img/s per rank", "efficiency", "ensemble img/s", "comm share"]
    for col in cols + (["of NVIDIA"] if ref else []):
        t.add_column(col, justify="right")
    for r in report["results"]:
        hosts = r.get("hosts")
        cells = [str(r["nodes"]), "-" if hosts is None else str(hosts), str(r["ranks"]), _num(r["img_per_sec"], ".1f"),
                 _num(r["img_per_sec_per_rank"], ".1f"), _num(r["efficiency"], ".1%"),
                 _num(r.get("ensemble_img_per_sec"), ".1f"), _num(r.get("comm_share"), ".1%")]
        t.add_row(*cells, *([_num(reference_share(r, ref), ".0%")] if ref else []))
    return t


def training_table(report: dict[str, Any]) -> Table:
    """bench --data: time to the target top-1 per N, its speed-up over the smallest N that
    reached it, and the training throughput (img/s with data loading, E(N) as the synthetic table's)."""
    tr = report["training"]
    ds = (report.get("versions") or {}).get("dataset") or {}
    t = Table(title=f"time to top-1 {tr['target_acc']:g} — {tr['dataset']} — {report['run_id']}",
              caption=(f"{ds.get('train_samples')} training / {ds.get('test_samples')} test images; "
                       "batch: global (per rank x ranks); lr: the peak rate; "
                       "to target: training + evaluation until the first epoch at the target; "
                       "img/s: the median epoch, data loading included") if ds else None, caption_justify="left")
    for col in ("nodes", "ranks", "batch", "lr", "epochs", "to target", "speed-up", "top-1", "img/s", "E(N)"):
        t.add_column(col, justify="right")
    rows = {r["nodes"]: r for r in report["results"]}
    up = speedups(tr)
    for r in tr["runs"]:
        row = rows.get(r["nodes"]) or {}
        t.add_row(str(r["nodes"]), str(r["ranks"]), str(r["global_batch"]), f"{r['peak_lr']:.3g}",
                  f"{r['epochs_to_target'] or r['epochs_run']}/{r['epochs']}",
                  f"{r['time_to_target_s']:.1f}s" if r["reached"] else "not reached",
                  _num(up.get(r["nodes"]), ".2f"), _num(r["final_top1"], ".3f"), _num(row.get("img_per_sec"), ".1f"),
                  _num(row.get("efficiency"), ".1%"))
    return t


def data_loading_table(report: dict[str, Any]) -> Table:
    """bench --data: what reading the dataset costs per N, and the shared storage's reads."""
    runs = report["training"]["runs"]
    notes = sorted({r["storage"]["note"] for r in runs if (r.get("storage") or {}).get("note") is not None})
    t = Table(title=f"data loading — {report['training']['dataset']} — {report['run_id']}",
              caption="\n".join(["img/s: the median epoch, reading the dataset; in memory: the same step on one batch "
                                 "held in memory; cost: 1 - img/s / in memory (below 0: noise); waited: of the training "
                                 "time, a rank waited for its loader; MB/s: the loaders' own count, what the NFS "
                                 "clients pulled and the master's disk reads (node_exporter)", *notes]),
              caption_justify="left")
    for col in ("nodes", "img/s", "in memory", "cost", "waited", "loader MB/s", "NFS MB/s", "disk MB/s"):
        t.add_column(col, justify="right")
    for r in runs:
        st = r.get("storage") or {}
        t.add_row(str(r["nodes"]), _num(r.get("img_per_sec"), ".1f"), _num(r.get("compute_img_per_sec"), ".1f"),
                  _num(r.get("loading_cost"), ".0%"), _num(r.get("data_wait_frac"), ".1%"),
                  _num(r.get("read_mb_per_s"), ".3f"), _num(st.get("nfs_clients_mb_per_s"), ".2f"),
                  _num(st.get("master_disk_mb_per_s"), ".2f"))
    return t


def network_table(report: dict[str, Any]) -> Table:
    """Pairwise iperf3 rates, slowest first."""
    net = report["network"]
    t = Table(title=f"node to node (iperf3; median {_num(net['median_gbit_s'], '.2f')} Gbit/s)")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("sender", "left"), ("receiver", "left"), ("Gbit/s", "right"), ("of median", "right"))
    for col, justify in columns:
        t.add_column(col, justify=justify)
    med = net.get("median_gbit_s")
    for p in sorted(net["pairs"], key=lambda p: (p["gbit_s"] is not None, p["gbit_s"] or 0)):
        t.add_row(p["src"], p["dst"], _num(p["gbit_s"], ".2f"), _num(p["gbit_s"] / med if p["gbit_s"] is not None and med else None, ".0%"))
    return t


def allreduce_table(report: dict[str, Any]) -> Table:
    """All-reduce sweep with busbw as a share of the iperf3 link rate."""
    link = report.get("link") or {}
    gb = gbit_to_gbyte(link["gbit_s"]) if link.get("gbit_s") else None
    gb2 = gbit_to_gbyte(link["bidir_gbit_s"]) if link.get("bidir_gbit_s") else None
    t = Table(title="all-reduce" + (f" (link {gb:.2f} GB/s by iperf3" if gb else "")
              + (f", {gb2:.2f} GB/s each way with --bidir" if gb2 else "") + (")" if gb else ""))
    for col in ("nodes", "size (B)", "time (us)", "algbw GB/s", "busbw GB/s", "of link", "of bidir", "#wrong"):
        t.add_column(col, justify="right")
    for r in report["allreduce"]:
        t.add_row(str(r["nodes"]), str(r["bytes"]), f"{r['time_us']:.1f}", f"{r['algbw_gb_s']:.2f}",
                  f"{r['busbw_gb_s']:.2f}", _num(r["busbw_gb_s"] / gb if gb else None, ".0%"),
                  _num(r["busbw_gb_s"] / gb2 if gb2 else None, ".0%"), str(r["wrong"]))
    return t


def tables(report: dict[str, Any]) -> list[Table]:
    """What `deployer bench` prints: throughput (bench --data: time to accuracy and data
    loading), then all-reduce and the network when measured."""
    out = [training_table(report), data_loading_table(report)] if report.get("training") else [results_table(report)]
    if report.get("allreduce"):
        out.append(allreduce_table(report))
    if report.get("network"):
        out.append(network_table(report))
    return out
