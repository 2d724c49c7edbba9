"""Record a `bench --via slurm` sweep on a live local cluster with Slurm, for the fast tier's replay
(tests/fixtures/bench/sweep_slurm_2node_recorded.json, read by tests/unit/test_bench_slurm.py).

    python scripts/record_slurm_sweep.py <state dir> <cluster name> <out.json>

Every command the sweep sends to the master, and what came back, in order; paths under
the shared dir written as {shared} so the replay runs anywhere.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deployer.bench import profiles
from deployer.bench import sweep as bench
from deployer.remote import MasterRunner
from deployer.state import ClusterState


class Recorder:
    calls: list[dict[str, Any]]

    def __init__(self, inner: MasterRunner) -> None:
        self.inner, self.calls = inner, []

    def run(self, cmd: str, *, timeout: float, on_line: Callable[[str], None] | None = None) -> tuple[int, str, str]:
        rc, out, err = self.inner.run(cmd, timeout=timeout, on_line=on_line)
        self.calls.append({"cmd": cmd, "rc": rc, "stdout": out, "stderr": err})
        return rc, out, err


def main(state_dir: str, name: str, dest: str) -> None:
    st = ClusterState(Path(state_dir), name)
    cluster = st.cluster()
    assert cluster is not None, f"no cluster in {state_dir}"
    opts = profiles.make_options(cluster, nodes="1,2", model="resnet18", image_size=32, batch_size=8, num_iters=2,
                              num_batches_per_iter=3, num_warmup_batches=1, allreduce_max="64K", via="slurm")
    rec = Recorder(MasterRunner(st, cluster))
    run_id = "20261123-180000"
    with tempfile.TemporaryDirectory() as out:
        bench.run_bench(rec, cluster, opts, run_id, Path(out))
    shared = cluster.shared_dir
    text = json.dumps({"run_id": run_id, "cluster": {**cluster.to_output(), "shared_dir": "{shared}"}, "calls": rec.calls}, indent=1)
    Path(dest).write_text(text.replace(shared + "/", "{shared}/"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
