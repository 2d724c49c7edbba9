"""Each node's last health run, read from the master (`status` and `heal` read it).

The health program (benchmarks/node_health.py, role health) keeps its last run in
/var/lib/deployer-health/last.json on each node's own disk. The master reads its own and,
over the cluster's SSH mesh, every worker's, in one SSH session from here: the path
every verb has to a cluster (workers may be reachable only through the master).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import Cluster
    from .state import ClusterState

LAST_RUN = "/var/lib/deployer-health/last.json"
# Health stopped reporting: no run in two intervals and a minute (the NodeHealthStale alert's
# rule, monitoring/prometheus/rules/deployer.rules.yml).
STALE_INTERVALS, STALE_SLACK_S = 2, 60
_MARK = "==deployer-health== "
CLOCK = "@clock"  # the master's clock: the records' times are the nodes', ages are taken from it
SEEN = "@seen:"  # what the master reads in <shared>/.deployer-health/<node>


@dataclass(frozen=True)
class NodeHealth:
    node: str
    verdict: str | None  # pass, warn, fail; None: no run recorded (or the node did not answer)
    reason: str
    at: float | None  # when the last run ended (the node's clock)
    failing_since: float | None
    consecutive_failures: int = 0
    interval: float = 300
    drained_by_health: bool = False
    shared_written_at: float | None = None  # the node's last write to the shared dir, as it saw it
    shared_seen_at: float | None = None  # the newest of its writes the master sees

    def unseen(self) -> bool:
        """The node's last write to the shared dir is not what the master reads there: its
        /shared is a node-local directory (a mount of its own, writable, not shared)."""
        return self.shared_written_at is not None and (self.shared_seen_at or 0) < self.shared_written_at

    def age(self, now: float) -> float | None:
        return None if self.at is None else max(0.0, now - self.at)

    def stale(self, now: float) -> bool:
        """Health stopped reporting (or never did): no run in two intervals."""
        age = self.age(now)
        return age is None or age > STALE_INTERVALS * self.interval + STALE_SLACK_S

    def failing_for(self, now: float) -> float:
        """Seconds the node has failed without a pass between (0 while it passes)."""
        return max(0.0, now - self.failing_since) if self.verdict == "fail" and self.failing_since else 0.0

    def to_json(self, now: float) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "at": self.at, "age_s": _round(self.age(now)),
                "stale": self.stale(now), "failing_since": self.failing_since, "failing_for_s": round(self.failing_for(now)),
                "consecutive_failures": self.consecutive_failures, "interval_s": self.interval,
                "drained_by_health": self.drained_by_health, "shared_written_at": self.shared_written_at,
                "shared_seen_at": self.shared_seen_at}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v)


def command(cluster: Cluster) -> str:
    """One shell line for the master: its own record, then each worker's over SSH, each
    after a marker line naming the node (a node that does not answer prints nothing)."""
    parts = [f"echo {shlex.quote(_MARK + CLOCK)}; date +%s.%N",
             f"echo {shlex.quote(_MARK + cluster.master.name)}; cat {LAST_RUN} 2>/dev/null; echo"]
    for n in cluster.workers:
        parts.append(f"echo {shlex.quote(_MARK + n.name)}; timeout 15 ssh -o BatchMode=yes -o ConnectTimeout=5 "
                     f"{shlex.quote(n.private_ip)} cat {LAST_RUN} 2>/dev/null; echo")
    # After every record: a write newer than a record is seen, never one older.
    for n in cluster.nodes:
        seen = shlex.quote(f"{cluster.shared_dir}/.deployer-health/{n.name}")
        parts.append(f"echo {shlex.quote(_MARK + SEEN + n.name)}; timeout 10 cat {seen} 2>/dev/null; echo")
    return "; ".join(parts)


def parse(out: str, names: list[str]) -> tuple[dict[str, NodeHealth], float | None]:
    """The records `command` printed, one per node, and the master's clock; a node with
    none (no run yet, not answering, health off) has verdict None."""
    chunks: dict[str, list[str]] = {}
    current: str | None = None
    for line in out.splitlines():
        if line.startswith(_MARK):
            current = line[len(_MARK):].strip()
            chunks[current] = []
        elif current is not None:
            chunks[current].append(line)
    found: dict[str, NodeHealth] = {}
    for name in names:
        try:
            rec = json.loads("\n".join(chunks.get(name, [])) or "null")
        except ValueError:
            rec = None
        found[name] = from_record(name, rec if isinstance(rec, dict) else None)
    for name in names:
        try:
            seen: float | None = float("".join(chunks.get(SEEN + name, [])).strip())
        except ValueError:
            seen = None
        found[name] = seen_from_master(found[name], seen)
    try:
        clock: float | None = float("".join(chunks.get(CLOCK, [])).strip())
    except ValueError:
        clock = None
    return found, clock


def seen_from_master(h: NodeHealth, seen: float | None) -> NodeHealth:
    """The node's health with what the master sees of its shared-dir file: a node whose
    write the master does not see fails shared_dir, failing since its last write the master
    saw (the node alone cannot tell, so Slurm does not drain it; `heal` replaces it)."""
    from dataclasses import replace

    h = replace(h, shared_seen_at=seen)
    if not h.unseen() or h.verdict == "fail":
        return h
    return replace(h, verdict="fail", failing_since=seen or h.shared_written_at,
                   reason="shared_dir: its file in the shared dir is not seen from the master (a node-local directory "
                          "over the shared storage?)")


def from_record(name: str, rec: dict[str, Any] | None) -> NodeHealth:
    if rec is None:
        return NodeHealth(name, None, "no health run recorded", None, None)
    return NodeHealth(
        node=name, verdict=rec.get("verdict"), reason=str(rec.get("reason", "")),
        at=float(rec["at"]) if rec.get("at") else None,
        failing_since=float(rec["failing_since"]) if rec.get("failing_since") else None,
        consecutive_failures=int(rec.get("consecutive_failures") or 0),
        interval=float(rec.get("interval") or 300), drained_by_health=bool(rec.get("drained_by_health")),
        shared_written_at=float(rec["shared_written_at"]) if rec.get("shared_written_at") else None,
    )


def read(state: ClusterState, cluster: Cluster, timeout: float = 60) -> tuple[dict[str, NodeHealth], float | None]:
    """Every node's last run and the master's clock, read through the master in one SSH
    session; the master not answering is every node unknown (verdict None)."""
    from .remote import MasterRunner

    rc, out, _ = MasterRunner(state, cluster).run(command(cluster), timeout=timeout)
    return parse(out if rc == 0 else "", cluster.names)


def describe(h: NodeHealth, now: float) -> str:
    """One cell: `pass 12s ago`, `fail 3m: shared_dir: ...`, `stopped reporting (last 9m ago)`."""
    from .lifetime import human

    age = h.age(now)
    if h.verdict is None or age is None:
        return "no health run (health off, or the node does not answer)"
    if h.stale(now):
        return f"stopped reporting (last run {human(age)} ago: {h.verdict})"
    if h.verdict == "fail":
        return f"fail for {human(h.failing_for(now))} ({h.consecutive_failures} runs): {h.reason}" + (
            "; drained" if h.drained_by_health else "")
    return f"{h.verdict} {human(age)} ago" + (f": {h.reason}" if h.verdict == "warn" else "")
