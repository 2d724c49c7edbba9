"""benchmarks/gpu_check.py's all-reduce under a deadline: a rank that never returns (NCCL
peer-to-peer stalled in a badly virtualised VM) is a finding with its likely cause, and
every process is gone afterwards. Run with CPU processes: the deadline does not care what
the ranks wait for."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_check  # noqa: E402

pytestmark = pytest.mark.slow


def hangs(rank: int) -> None:
    time.sleep(3600)


def fails(rank: int) -> None:
    if rank == 1:
        raise RuntimeError("NCCL error: unhandled system error")


def works(rank: int) -> None:
    pass


def test_a_stalled_all_reduce_is_stopped_and_named():
    t0 = time.monotonic()
    got = gpu_check.spawn_with_deadline(hangs, (), 2, timeout_s=3)
    assert time.monotonic() - t0 < 30
    assert got.startswith("timed out after 3 s: the all-reduce among this node's GPUs stalled"), got
    assert "NCCL_P2P_DISABLE=1" in got


def test_a_failing_rank_and_a_good_run():
    assert "unhandled system error" in gpu_check.spawn_with_deadline(fails, (), 2, timeout_s=60)
    assert gpu_check.spawn_with_deadline(works, (), 2, timeout_s=60) == "ok"
