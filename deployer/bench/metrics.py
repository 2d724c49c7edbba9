"""Benchmark results → Prometheus, through the Pushgateway on the master.

`deployer bench` calls push_bench_results() once per run. Every run is its own
Pushgateway group (job="deployer_bench", run_id=<id>), so runs never overwrite each
other and re-pushing a run replaces only that run. The Pushgateway takes only the
deployer's basic-auth login (deployer/pushgateway.py); Prometheus gives every pushed
series job="deployer_bench" whatever the push said, and keeps run_id; the Grafana
"Benchmarks" dashboard (monitoring/grafana/dashboards/benchmarks.json) reads them.

Series (all gauges; run_id comes from the grouping key):

    deployer_bench_img_per_sec{nodes,model,mode}            total images/sec of the job
    deployer_bench_img_per_sec_per_rank{nodes,model,mode}
    deployer_bench_efficiency{nodes,model,mode}             E(N) = T_N / (N · T_1)
    deployer_bench_ranks{nodes,model,mode}
    deployer_bench_allreduce_busbw_gb_s{nodes,bytes}
    deployer_bench_allreduce_algbw_gb_s{nodes,bytes}
    deployer_bench_allreduce_time_us{nodes,bytes}
    deployer_bench_allreduce_errors{nodes,bytes}            the sweep's "wrong" count
    deployer_bench_link_gbit_s{tool}                        iperf3 between two nodes
    deployer_bench_run_timestamp_seconds{model,mode}        when the run happened
    deployer_bench_pair_gbit_s{src, dst}                    with --net: iperf3 between two nodes
    deployer_bench_time_to_target_seconds{nodes,model,dataset,target}   with --data: training + evaluation
                                                            seconds to the target top-1 (absent: not reached)
    deployer_bench_final_top1{nodes,model,dataset,target}   with --data: test top-1 at the run's last epoch
    deployer_bench_info{<versions>}                         1, versions as labels
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from .. import pushgateway
from ..credentials import Login

JOB = "deployer_bench"
PREFIX = "deployer_bench_"

_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
# Labels the Pushgateway or the grouping key own; a version key may not take them.
_RESERVED = {"job", "instance", "run_id"}


def _label(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _number(value: Any) -> float | None:
    """A finite-or-not float, or None for a missing value (which is then not exported)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _run_mode(result: Mapping[str, Any]) -> tuple[str, str]:
    versions = result.get("versions") or {}
    rows = result.get("results") or []
    model = versions.get("model") or next((r.get("model") for r in rows if r.get("model")), "")
    mode = versions.get("mode")
    if not mode:
        modes = sorted({r.get("mode") for r in rows if r.get("mode")})
        mode = ",".join(modes)
    return _label(model), _label(mode)


def _info_labels(versions: Mapping[str, Any]) -> dict[str, str]:
    """deployer_bench_info's labels: the record's scalar fields, and from what the bench
    nests (deployer/bench/sweep.py) the benchmark's software versions (torch, MPI, NCCL, CUDA,
    driver...), the all-reduce backend as allreduce_*, and the profile and threads."""
    flat: dict[str, Any] = {k: v for k, v in versions.items() if not isinstance(v, Mapping)}
    for key, value in (versions.get("benchmark") or {}).items():
        flat.setdefault(key, value)
    for key, value in (versions.get("allreduce") or {}).items():
        flat.setdefault(f"allreduce_{key}", value)
    for key in ("profile", "threads"):
        if (versions.get("flags") or {}).get(key) is not None:
            flat.setdefault(key, versions["flags"][key])
    labels: dict[str, str] = {}
    for key, value in flat.items():
        name = _LABEL_NAME.sub("_", str(key))
        if not name or name[0].isdigit() or name.startswith("__") or name in _RESERVED:
            name = f"v_{name.lstrip('_')}"
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            labels[name] = _label(value)
    return labels


def bench_registry(result: Mapping[str, Any], *, now: float | None = None) -> CollectorRegistry:
    """The gauges of one benchmark run, in a registry of their own (ready to push).

    `result` follows the bench result schema: run_id, results[], allreduce[], link,
    versions. A row's own "model"/"mode" win over versions["model"/"mode"]. Missing or
    null numbers are left out rather than exported as 0. The run's timestamp is
    result["timestamp"] (Unix seconds) when present, else `now` or the current time.
    """
    if not result.get("run_id"):
        raise ValueError("bench result has no run_id")
    reg = CollectorRegistry()
    run_model, run_mode = _run_mode(result)
    versions = result.get("versions") or {}

    row_labels = ("nodes", "model", "mode")
    img = Gauge(PREFIX + "img_per_sec", "Total images/sec of the benchmark at this node count", row_labels, registry=reg)
    per_rank = Gauge(PREFIX + "img_per_sec_per_rank", "Images/sec of one rank", row_labels, registry=reg)
    eff = Gauge(PREFIX + "efficiency", "Scaling efficiency E(N) = T_N / (N * T_1), 1 = linear", row_labels, registry=reg)
    ranks = Gauge(PREFIX + "ranks", "Ranks (processes) the benchmark ran at this node count", row_labels, registry=reg)
    for row in result.get("results") or []:
        labels: tuple[str, ...] = (
            _label(row.get("nodes")),
            _label(row.get("model") or run_model),
            _label(row.get("mode") or run_mode),
        )
        for gauge, key in (
            (img, "img_per_sec"),
            (per_rank, "img_per_sec_per_rank"),
            (eff, "efficiency"),
            (ranks, "ranks"),
        ):
            value = _number(row.get(key))
            if value is not None:
                gauge.labels(*labels).set(value)

    ar_labels = ("nodes", "bytes")
    busbw = Gauge(PREFIX + "allreduce_busbw_gb_s", "Allreduce bus bandwidth, GB/s (algbw * 2(n-1)/n)", ar_labels, registry=reg)
    algbw = Gauge(PREFIX + "allreduce_algbw_gb_s", "Allreduce algorithm bandwidth, GB/s (bytes / time)", ar_labels, registry=reg)
    ar_time = Gauge(PREFIX + "allreduce_time_us", "Allreduce time per call, microseconds", ar_labels, registry=reg)
    wrong = Gauge(PREFIX + "allreduce_errors", "Allreduce results that failed the correctness check", ar_labels, registry=reg)
    for row in result.get("allreduce") or []:
        labels = (_label(row.get("nodes")), _label(row.get("bytes")))
        for gauge, key in ((busbw, "busbw_gb_s"), (algbw, "algbw_gb_s"), (ar_time, "time_us"), (wrong, "wrong")):
            value = _number(row.get(key))
            if value is not None:
                gauge.labels(*labels).set(value)

    link = result.get("link") or {}
    link_rate = _number(link.get("gbit_s"))
    if link_rate is not None:
        Gauge(PREFIX + "link_gbit_s", "Point-to-point link rate between two nodes, Gbit/s", ("tool",), registry=reg).labels(
            _label(link.get("tool") or "iperf3")
        ).set(link_rate)

    net = result.get("network") or {}
    if net.get("pairs"):
        pair = Gauge(PREFIX + "pair_gbit_s", "iperf3 rate from one node to another, Gbit/s", ("src", "dst"), registry=reg)
        for p in net["pairs"]:
            rate = _number(p.get("gbit_s"))
            if rate is not None:
                pair.labels(_label(p["src"]), _label(p["dst"])).set(rate)

    training = result.get("training") or {}
    if training.get("runs"):
        tr_labels = ("nodes", "model", "dataset", "target")
        to_target = Gauge(PREFIX + "time_to_target_seconds", "Training + evaluation seconds to the target top-1 "
                          "(bench --data; absent where it was not reached)", tr_labels, registry=reg)
        final = Gauge(PREFIX + "final_top1", "Test top-1 at the training run's last epoch (bench --data)", tr_labels, registry=reg)
        in_memory = Gauge(PREFIX + "compute_img_per_sec", "Training img/s of the same step on one batch held in memory "
                          "(bench --data: the figure without data loading)", tr_labels, registry=reg)
        cost = Gauge(PREFIX + "loading_cost", "1 - img/s reading the dataset / img/s on a batch in memory "
                     "(bench --data)", tr_labels, registry=reg)
        reads = Gauge(PREFIX + "data_read_mb_per_s", "Shared storage reads during the training run, MB/s: source "
                      "loader (the data loaders' own count), nfs_clients, master_disk (node_exporter)",
                      (*tr_labels, "source"), registry=reg)
        for run in training["runs"]:
            labels = (_label(run.get("nodes")), _label(run.get("model")), _label(training.get("dataset")),
                      _label(training.get("target_acc")))
            for gauge, key in ((to_target, "time_to_target_s"), (final, "final_top1"),
                               (in_memory, "compute_img_per_sec"), (cost, "loading_cost")):
                value = _number(run.get(key))
                if value is not None:
                    gauge.labels(*labels).set(value)
            storage = run.get("storage") or {}
            for source, value in (("loader", run.get("read_mb_per_s")), ("nfs_clients", storage.get("nfs_clients_mb_per_s")),
                                  ("master_disk", storage.get("master_disk_mb_per_s"))):
                rate = _number(value)
                if rate is not None:
                    reads.labels(*labels, source).set(rate)

    stamp = _number(result.get("timestamp"))
    if stamp is None:
        stamp = time.time() if now is None else now
    Gauge(
        PREFIX + "run_timestamp_seconds",
        "When the benchmark run happened (Unix seconds)",
        ("model", "mode"),
        registry=reg,
    ).labels(run_model, run_mode).set(stamp)

    info_labels = _info_labels(versions)
    if info_labels:
        names = sorted(info_labels)
        Gauge(PREFIX + "info", "Software versions of the benchmark run (value 1)", names, registry=reg).labels(
            *(info_labels[n] for n in names)
        ).set(1)
    return reg


def push_bench_results(gateway_url: str, result: dict[str, Any], *, login: Login | None = None, timeout: float = 10.0) -> None:
    """Push one run's results to the Pushgateway at `gateway_url` ("http://10.77.0.10:9091"),
    with `login` (basic auth) when given.

    Replaces the group job="deployer_bench", run_id=<run_id> and nothing else.
    Raises OperationFailed (one line, no traceback) when the Pushgateway cannot be
    reached or refuses the push; ValueError when `result` has no run_id.
    """
    pushgateway.push(gateway_url, JOB, bench_registry(result), {"run_id": str(result["run_id"])}, "benchmark results",
         login=login, timeout=timeout)
