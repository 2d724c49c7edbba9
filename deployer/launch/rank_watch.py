"""An MPI program run from the master with a watch on every rank: `deployer check`'s, and
each run of `deployer bench` launched by mpirun.

The benchmark scripts (benchmarks/pingpong.py, allreduce.py, resnet_synthetic.py,
resnet_train.py), given --heartbeat S, print `HEARTBEAT {"rank", "step"}` every S seconds
from a thread of their own (bench_common.Heartbeat): a
rank waiting in a collective keeps beating, a stopped or frozen one does not. A rank
silent for longer than `quiet_s` is named (its node, its rank, the step it was in), and
the run is stopped cleanly: mpirun, then every benchmark process on every node
(launch.mpirun.cleanup_cmd), so nothing is left running. A hang is a finding, not a wait.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .failure import untag
from .mpirun import cleanup_cmd

if TYPE_CHECKING:
    from ..cluster import Cluster, Node
    from ..remote import Runner


QUIET_S = 30.0  # a rank silent this long is named and the run stopped
HEARTBEAT_S = 1.0  # --heartbeat: how often each rank says it lives
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


def run_watched(runner: Runner, cluster: Cluster, cmd: str, rank_nodes: Sequence[Node], *, quiet_s: float,
                timeout: float, on_line: Callable[[str], None] | None = None) -> tuple[int, str, str, Silent | None]:
    """Run `cmd` (an mpirun with --tag-output and --heartbeat; `rank_nodes`: rank -> node)
    on the master; (rc, stdout, stderr, the rank that fell silent or None). Every other
    stdout line goes on to `on_line` as it arrives; the HEARTBEAT lines stay here (they
    are not in the stdout returned either)."""
    ranks = len(rank_nodes)
    started = time.monotonic()
    # A rank's first beat comes after its imports (torch: seconds, more on a busy node).
    last: dict[int, tuple[float, str]] = {r: (started + STARTUP_GRACE_S, "start") for r in range(ranks)}
    lock = threading.Lock()
    done = threading.Event()
    silent: list[Silent] = []

    def beat(line: str) -> None:
        rank, _, text = untag(line)
        if rank is None or not text.startswith("HEARTBEAT "):
            if on_line:
                on_line(line)
            return
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
                quiet = [(t, r, s) for r, (t, s) in last.items() if now - t > quiet_s]
            if quiet:
                _, rank, step = min(quiet)  # silent the longest (a rank waiting for it falls silent later)
                node = rank_nodes[rank].name if rank < len(rank_nodes) else "?"
                silent.append(Silent(rank, node, step, quiet_s))
                runner.run(cleanup_cmd(cluster, "KILL"), timeout=60)  # mpirun and every rank, on every node
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        rc, out, err = runner.run(cmd, timeout=timeout, on_line=beat)
    finally:
        done.set()
        watcher.join(timeout=90)
    out = "".join(line for line in out.splitlines(keepends=True) if not untag(line)[2].startswith("HEARTBEAT "))
    return rc, out, err, (silent[0] if silent else None)
