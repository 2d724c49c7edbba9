"""Where an `up` spends its time: each stage timed, Ansible split per role.

Every run writes `timings.json` to its run directory, `--json` carries the same record,
and the last line says it in one breath:

    up 3 nodes in 112 s: preflight 1 s · apply 14 s · boot 9 s · ansible 80 s (training_runtime 41 s) · smoke 3 s
    · pulled from outside: master 812 MB, workers ≤ 2.1 MB

Ansible's per-role times come from ansible-runner's own event log (ansible-events.jsonl):
a task's time runs from its start event to the next task's, and counts to its role (or,
for tasks outside a role, to its play). Concurrent hosts share a task, so the sum is wall
time, not CPU time.

What each node received from outside the cluster since it booted (package mirrors, PyPI)
comes from the byte counter its user-data sets up (deployer/pipeline/boot.py): the master fetches
the runtime and fills the package cache, so a worker's figure stays small; a large one
says a worker downloaded on its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import records
from ..ui import human_bytes

# Events that open a span of wall time in the log; the next one closes it.
_SPAN_EVENTS = ("playbook_on_start", "playbook_on_play_start", "playbook_on_task_start", "playbook_on_stats")


class Stages:
    """Wall time per named stage of one run, in the order the stages ran."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.seconds: dict[str, float] = {}
        self.roles: dict[str, float] = {}
        self.pulled: dict[str, int | None] = {}  # bytes from outside the cluster, per node
        self.failed: str | None = None
        self.run_dir: Path | None = None  # once set, a failing stage still leaves timings.json

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        except BaseException:
            self.failed = name
            raise
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - start
            if self.failed == name and self.run_dir:
                self.write(self.run_dir)

    def total(self) -> float:
        return time.monotonic() - self.t0

    def record(self) -> dict[str, Any]:
        rec = {"total_s": round(self.total(), 1), "stages_s": {k: round(v, 1) for k, v in self.seconds.items()},
               "ansible_roles_s": {k: round(v, 1) for k, v in self.roles.items()}}
        if self.pulled:
            rec["bytes_from_outside"] = dict(self.pulled)
        return {**rec, "failed_stage": self.failed} if self.failed else rec

    def write(self, run_dir: Path) -> dict[str, Any]:
        rec = self.record()
        records.write(run_dir / TIMINGS_FILE, rec)
        return rec


TIMINGS_FILE = "timings.json"


def read(run_dir: Path) -> dict[str, Any] | None:
    """The timings a run wrote (Stages.record's shape); None when it wrote none."""
    return records.read(run_dir / TIMINGS_FILE)


def ansible_roles(events_log: Path) -> dict[str, float]:
    """Seconds per role (or play, for tasks outside roles) from ansible-runner's event log,
    slowest first; {} when there is no log (Ansible did not run)."""
    if not events_log.exists():
        return {}
    spans: list[tuple[str | None, datetime]] = []
    for line in events_log.read_text().splitlines():
        if "playbook_on_" not in line:  # every span event is one; most lines are the hosts' results
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash: the rest still counts
        if ev.get("event") not in _SPAN_EVENTS or "created" not in ev:
            continue
        data = ev.get("event_data", {})
        owner = (data.get("role") or data.get("play")) if ev["event"] == "playbook_on_task_start" else None
        spans.append((owner, datetime.fromisoformat(ev["created"])))
    roles: dict[str, float] = {}
    for (owner, start), (_, end) in zip(spans, spans[1:], strict=False):
        if owner:
            roles[owner] = roles.get(owner, 0.0) + (end - start).total_seconds()
    return dict(sorted(roles.items(), key=lambda kv: -kv[1]))


def counter_bytes(text: str) -> int | None:
    """The bytes of the counter in one `nft --json list counter` output; None if there is none."""
    try:
        return next(int(i["counter"]["bytes"]) for i in json.loads(text)["nftables"] if "counter" in i)
    except (ValueError, KeyError, TypeError, StopIteration):
        return None


def bytes_from_outside(stats: dict[str, Any]) -> dict[str, int | None]:
    """Bytes per node from the play's `bytes_from_outside` stats (each node's counter
    output); None for a node whose counter could not be read."""
    return {node: counter_bytes(text) for node, text in sorted((stats.get("bytes_from_outside") or {}).items())}


def _pulled_part(pulled: dict[str, int | None]) -> str:
    counted = {n: b for n, b in pulled.items() if b is not None}
    if not counted:
        return "pulled from outside: not counted (no nft on the nodes)"
    # The master is `<cluster>-master` (nodes.node_names); its figure includes the runtime.
    master = [counted.pop(n) for n in list(counted) if n.endswith("-master")]
    parts = [f"master {human_bytes(master[0], si=True)}"] if master else []
    if counted:
        parts.append(f"workers ≤ {human_bytes(max(counted.values()), si=True)}" if len(counted) > 1
                     else f"{next(iter(counted))} {human_bytes(next(iter(counted.values())), si=True)}")
    return "pulled from outside: " + ", ".join(parts)


def summary(verb: str, nodes: int, rec: dict[str, Any]) -> str:
    """One line: the total, every stage, the slowest role inside the ansible stage, and
    what the nodes pulled from outside (when Ansible ran and read the counters)."""
    parts = []
    for name, s in rec["stages_s"].items():
        part = f"{name} {s:.0f} s"
        if name == "ansible" and rec.get("ansible_roles_s"):
            role, rs = next(iter(rec["ansible_roles_s"].items()))
            part += f" ({role} {rs:.0f} s)"
        parts.append(part)
    if rec.get("bytes_from_outside"):
        parts.append(_pulled_part(rec["bytes_from_outside"]))
    return f"{verb} {nodes} node{'s' if nodes != 1 else ''} in {rec['total_s']:.0f} s: " + " · ".join(parts)
