"""Node-hours and GPU-hours per cluster: an append-only JSON-lines ledger in the state root.

`up` appends an entry when a cluster's size changes (made, scaled out or in), `down` one
with no nodes. Usage is the node (and GPU) count integrated over the time between
entries; a cluster still up counts until now. The file is the only record: a cluster's
state dir goes with `down`, its ledger lines stay.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .lifetime import iso, now, parse_iso

if TYPE_CHECKING:
    from .cluster import Cluster
    from .state import ClusterState

LEDGER_FILE = "ledger.jsonl"


def path(root: Path) -> Path:
    return Path(root) / LEDGER_FILE


def entries(root: Path) -> list[dict[str, Any]]:
    """Every entry, oldest first; a line that does not parse (a crash mid-write) is skipped."""
    p = path(root)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and {"time", "cluster", "nodes"} <= entry.keys():
            out.append(entry)
    return out


def _append(root: Path, entry: dict[str, Any]) -> None:
    Path(root).mkdir(parents=True, exist_ok=True)
    # One write of one line to a file opened for appending: entries never interleave.
    fd = os.open(path(root), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def _last(root: Path, cluster: str) -> dict[str, Any] | None:
    mine = [e for e in entries(root) if e["cluster"] == cluster]
    return mine[-1] if mine else None


def note(state: "ClusterState", cluster: Cluster, at: datetime | None = None) -> dict[str, Any] | None:
    """After an apply: an entry if the cluster was made or changed size; the entry or None."""
    size = len(cluster.nodes)
    gpu_count = cluster.gpus
    last = _last(state.root, state.name)
    if last and last["nodes"] == size and last.get("gpus", 0) == gpu_count:
        return None
    entry = {
        "time": iso(at or now()), "cluster": state.name, "provider": cluster.provider,
        "event": "create" if not last or last["nodes"] == 0 else "scale",
        "nodes": size, "gpus": gpu_count, "flavor": cluster.machine.get("flavor"),
    }
    _append(state.root, entry)
    return entry


def note_event(root: Path, entry: dict[str, Any]) -> None:
    """A line that changes no size (`heal`'s replacement): `usage` sums the sizes as before,
    the line keeps what happened and what it cost (heal.py)."""
    _append(root, entry)


def note_down(state: "ClusterState", provider: str | None, at: datetime | None = None) -> dict[str, Any] | None:
    """After a destroy that left nothing: the cluster's usage stops here."""
    last = _last(state.root, state.name)
    if not last or last["nodes"] == 0:
        return None
    entry = {"time": iso(at or now()), "cluster": state.name, "provider": provider or last.get("provider"),
             "event": "destroy", "nodes": 0, "gpus": 0, "flavor": last.get("flavor")}
    _append(state.root, entry)
    return entry


def _month_start(t: datetime) -> datetime:
    return datetime(t.year, t.month, 1, tzinfo=UTC)


def _next_month(t: datetime) -> datetime:
    return datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=UTC)


def _split_by_month(a: datetime, b: datetime) -> list[tuple[str, float]]:
    """[(YYYY-MM, hours)] of the interval [a, b)."""
    out = []
    while a < b:
        end = min(b, _next_month(_month_start(a)))
        out.append((a.strftime("%Y-%m"), (end - a).total_seconds() / 3600))
        a = end
    return out


def usage(all_entries: list[dict[str, Any]], at: datetime | None = None) -> dict[str, Any]:
    """Totals per cluster and per month, from the entries (oldest first)."""
    at = at or now()
    clusters: dict[str, dict[str, Any]] = {}
    months: dict[str, dict[str, float]] = defaultdict(lambda: {"node_hours": 0.0, "gpu_hours": 0.0})
    by_cluster: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in all_entries:
        by_cluster[e["cluster"]].append(e)
    for name, es in by_cluster.items():
        es = sorted(es, key=lambda e: parse_iso(e["time"]))
        node_h = gpu_h = 0.0
        for cur, nxt in zip(es, es[1:] + [None], strict=True):
            start = parse_iso(cur["time"])
            end = parse_iso(nxt["time"]) if nxt else at
            if cur["nodes"] <= 0 or end <= start:
                continue
            for month, hours in _split_by_month(start, end):
                months[month]["node_hours"] += hours * cur["nodes"]
                months[month]["gpu_hours"] += hours * cur.get("gpus", 0)
                node_h += hours * cur["nodes"]
                gpu_h += hours * cur.get("gpus", 0)
        last = es[-1]
        clusters[name] = {
            "cluster": name, "provider": last.get("provider"),
            "flavor": next((e.get("flavor") for e in reversed(es) if e.get("flavor")), None),
            "first": es[0]["time"], "live": last["nodes"] > 0, "nodes_now": last["nodes"],
            "destroyed": None if last["nodes"] > 0 else last["time"],
            "node_hours": round(node_h, 3), "gpu_hours": round(gpu_h, 3),
        }
    return {
        "at": iso(at),
        "clusters": sorted(clusters.values(), key=lambda c: c["first"]),
        "months": [
            {"month": m, "node_hours": round(v["node_hours"], 3), "gpu_hours": round(v["gpu_hours"], 3)} for m, v in sorted(months.items())
        ],
    }


def show(use: dict[str, Any]) -> None:
    """`deployer ledger` for a person: per cluster, then per month."""
    from rich.table import Table

    from . import ui

    def when(iso_time: str) -> str:
        return iso_time.replace("T", " ")[:16]

    t = Table(title=f"usage until {use['at']}")
    for col in ("cluster", "provider", "flavor", "from", "until", "node-hours", "GPU-hours"):
        t.add_column(col, justify="right" if col.endswith("hours") else "left")
    for c in use["clusters"]:
        t.add_row(c["cluster"], c["provider"] or "-", c["flavor"] or "-", when(c["first"]),
                  f"up ({c['nodes_now']} nodes)" if c["live"] else when(c["destroyed"]), f"{c['node_hours']:.2f}", f"{c['gpu_hours']:.2f}")
    ui.out.print(t)
    m = Table(title="per month")
    for col in ("month", "node-hours", "GPU-hours"):
        m.add_column(col, justify="left" if col == "month" else "right")
    for row in use["months"]:
        m.add_row(row["month"], f"{row['node_hours']:.2f}", f"{row['gpu_hours']:.2f}")
    ui.out.print(m)
