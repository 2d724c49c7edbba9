"""The shared storage's read throughput during a `bench --data` run, from node_exporter.

Asked of Prometheus on the master after the sweep (one curl on the master per run, through
the bench's runner: Prometheus listens on the cluster network only). Two views:

  nfs_clients   sum over the nodes of node_mountstats_nfs_total_read_bytes_total: what
                the NFS clients pulled from the server (OpenStack clusters; the role
                node_exporter turns on the mountstats collector where the shared dir is NFS)
  master_disk   sum of node_disk_read_bytes_total on the master: what the storage's disks
                read (page-cache hits are not reads). On a local cluster the containers
                see the host's /proc/diskstats, so this is the host's disk, whoever read.

Each is increase(counter[W]) at the end of W, divided by the run's length: W spans the run
plus one scrape interval, so the first scrape after the run ends is inside it (the bench
waits for it). A series Prometheus does not have is None, with the reason in `note`:
the local cluster's shared dir is a bind mount, not NFS. Figures are MB/s (10^6 bytes).

The training script's own count (resnet_train.py: bytes its data loaders read / training
seconds) is the application's view beside these; it includes page-cache hits.
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

from .. import ports

PROMETHEUS_PORT = ports.prometheus()
SCRAPE_S = 15  # keep in step with prometheus_scrape_interval (ansible/roles/prometheus/defaults)

QUERIES = {
    "nfs_clients": 'sum(increase(node_mountstats_nfs_total_read_bytes_total{{job="node"}}[{w}s]))',
    "master_disk": 'sum(increase(node_disk_read_bytes_total{{job="node",node_role="master"}}[{w}s]))',
}
UNREACHABLE = "deployer: prometheus unreachable"


def window(started_at: float, ended_at: float) -> tuple[int, float]:
    """(W seconds, the query's evaluation time) for a run from started_at to ended_at."""
    w = math.ceil(ended_at - started_at) + SCRAPE_S
    return w, started_at + w


def query_cmd(master_ip: str, started_at: float, ended_at: float, port: int = PROMETHEUS_PORT) -> str:
    """One line of Prometheus's JSON answer per query in QUERIES (in its order), or
    UNREACHABLE in its place; exit 0 either way."""
    w, at = window(started_at, ended_at)
    url = shlex.quote(f"http://{master_ip}:{port}/api/v1/query")
    parts = []
    for expr in QUERIES.values():
        q = shlex.quote(f"query={expr.format(w=w)}")
        parts.append(f"{{ curl -sf --max-time 10 {url} --data-urlencode {q} --data-urlencode time={at:.3f} "
                     f"|| printf %s {shlex.quote(UNREACHABLE)}; }}; echo")
    return "; ".join(parts)


def scalar(answer: str) -> float | None:
    """The one sample of an instant-vector answer, or None where there is none (no such series)."""
    data = json.loads(answer)
    if data.get("status") != "success":
        raise ValueError(data.get("error") or "query failed")
    result = data["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def parse(stdout: str, started_at: float, ended_at: float, shared_storage: str) -> dict[str, Any]:
    """The report's `storage` entry of one run from query_cmd's output."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    seconds = max(ended_at - started_at, 1e-9)
    out: dict[str, Any] = {"window_s": window(started_at, ended_at)[0], "run_s": round(ended_at - started_at, 3),
                           "nfs_clients_mb_per_s": None, "master_disk_mb_per_s": None, "note": None}
    if len(lines) != len(QUERIES) or any(ln.strip() == UNREACHABLE for ln in lines):
        out["note"] = f"Prometheus on the master did not answer (port {PROMETHEUS_PORT}): is monitoring on?"
        return out
    notes = []
    for name, line in zip(QUERIES, lines, strict=True):
        try:
            value = scalar(line)
        except (ValueError, KeyError, IndexError, TypeError) as e:
            notes.append(f"{name}: {e}")
            continue
        if value is None:
            notes.append("no NFS client counters (the shared dir is a bind mount here, not NFS)"
                         if name == "nfs_clients" and shared_storage != "nfs" else f"{name}: no series in Prometheus")
        else:
            out[f"{name}_mb_per_s"] = value / seconds / 1e6
    if shared_storage != "nfs" and out["master_disk_mb_per_s"] is not None:
        notes.append("master_disk is the host's disk (containers share its /proc/diskstats)")
    out["note"] = "; ".join(notes) or None
    return out
