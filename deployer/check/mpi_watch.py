"""An MPI program of `deployer check`, run from the master with a watch on every rank.

The check's MPI programs (benchmarks/pingpong.py, allreduce.py) print `HEARTBEAT
{"rank", "step"}` every second from a thread of their own (bench_common.Heartbeat): a
rank waiting in a collective keeps beating, a stopped or frozen one does not. A rank
silent for longer than `quiet_s` is named (its node, its rank, the step it was in), and
the run is stopped cleanly: mpirun, then every benchmark process on every node
(bench.commands.cleanup_cmd), so nothing is left running. A hang is a finding, not a wait.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..bench.commands import cleanup_cmd
from ..bench.failure import untag

if TYPE_CHECKING:
    from ..bench.sweep import Runner
    from ..cluster import Cluster


STARTUP_GRACE_S = 60.0


@dataclass(frozen=True)
class Silent:
    rank: int
    node: str
    step: str
    quiet_s: float

    def said(self) -> str:
        return (f"rank {self.rank} on {self.node} silent for {self.quiet_s:.0f} s during {self.step}: stopped there "
                f"(a frozen or stopped process); the run was stopped and nothing is left running")


def run_watched(runner: Runner, cluster: Cluster, cmd: str, ranks: int, *, quiet_s: float,
                timeout: float) -> tuple[int, str, str, Silent | None]:
    """Run `cmd` (an mpirun of `ranks` ranks with --tag-output and --heartbeat) on the
    master; (rc, stdout, stderr, the rank that fell silent or None)."""
    rank_nodes = cluster.rank_nodes(len(cluster.nodes))
    started = time.monotonic()
    # A rank's first beat comes after its imports (torch: seconds, more on a busy node).
    last: dict[int, tuple[float, str]] = {r: (started + STARTUP_GRACE_S, "start") for r in range(ranks)}
    lock = threading.Lock()
    done = threading.Event()
    silent: list[Silent] = []

    def on_line(line: str) -> None:
        rank, _, text = untag(line)
        if rank is not None and text.startswith("HEARTBEAT "):
            try:
                step = str(json.loads(text[len("HEARTBEAT "):]).get("step", "?"))
            except ValueError:
                return
            with lock:
                last[rank] = (time.monotonic(), step)

    def watch() -> None:
        while not done.wait(0.5):
            now = time.monotonic()
            with lock:
                quiet = [(r, s) for r, (t, s) in last.items() if now - t > quiet_s]
            if quiet:
                rank, step = min(quiet)
                node = rank_nodes[rank].name if rank < len(rank_nodes) else "?"
                silent.append(Silent(rank, node, step, quiet_s))
                runner.run(cleanup_cmd(cluster, "KILL"), timeout=60)  # mpirun and every rank, on every node
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        rc, out, err = runner.run(cmd, timeout=timeout, on_line=on_line)
    finally:
        done.set()
        watcher.join(timeout=90)
    return rc, out, err, (silent[0] if silent else None)
