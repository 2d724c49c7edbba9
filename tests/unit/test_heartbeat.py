"""benchmarks/bench_common.Heartbeat: the line every rank prints from a thread of its own,
while the rank's main thread prints its own lines (progress, its JSON record)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

# A rank's main thread printing 20 kB records while its heartbeat beats as fast as it can:
# print() writes a line's text and its newline apart, and a large write releases the GIL.
RANK = f"""
import json, sys
sys.path.insert(0, {str(BENCH)!r})
from bench_common import Heartbeat
record = json.dumps({{"benchmark": "x", "rows": ["y" * 100] * 200}})
with Heartbeat(0, 0.0001) as beat:
    beat.step = "iter 1"
    for i in range(2000):
        print(record, flush=True)
"""


def test_a_heartbeat_never_lands_inside_another_line():
    out = subprocess.run([sys.executable, "-c", RANK], capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.splitlines()
    beats = [x for x in lines if x.startswith("HEARTBEAT ")]
    records = [x for x in lines if not x.startswith("HEARTBEAT ")]
    assert beats, "the heartbeat beat"
    steps = {(b["rank"], b["step"]) for b in (json.loads(x[len("HEARTBEAT "):]) for x in beats)}
    assert steps <= {(0, "start"), (0, "iter 1")}, steps
    assert len(records) == 2000 and all(json.loads(x)["benchmark"] == "x" for x in records), \
        [x[:80] for x in records if not x.startswith("{") or not x.endswith("}")][:3]
