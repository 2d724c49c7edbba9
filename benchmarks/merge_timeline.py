#!/usr/bin/env python3
"""Join the per-rank Chrome traces of `resnet_synthetic.py --timeline DIR` into one.

    python merge_timeline.py DIR > timeline.json

Each rank's events keep their timestamps and become one process in the merged trace,
named "rank <r> (<host>)", so chrome://tracing or ui.perfetto.dev shows every rank on
one time axis: where each rank computes, and where it waits in the all-reduce (the
Horovod Timeline's question). Ranks on different machines share a time axis only as
far as the machines' clocks agree (NTP); ranks in local containers share one clock.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

NAME = re.compile(r"^rank(\d+)(?:-(.+))?\.json$")  # rank<r>-<host>.json


def merge(directory: Path) -> dict[str, Any]:
    found = sorted((int(m.group(1)), m.group(2) or "", f) for f in directory.iterdir() if (m := NAME.match(f.name)))
    if not found:
        raise SystemExit(f"no rank<r>-<host>.json in {directory}")
    events: list[dict[str, Any]] = []
    for rank, host, f in found:
        trace = json.loads(f.read_text())
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}" + (f" ({host})" if host else "")}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for ev in trace.get("traceEvents", []):
            if ev.get("ph") == "M" and ev.get("name") in ("process_name", "process_sort_index"):
                continue
            events.append({**ev, "pid": rank})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    json.dump(merge(Path(argv[1])), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
