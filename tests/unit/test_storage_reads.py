"""deployer.bench.storage_reads: the shared storage's reads during a run, from Prometheus's answers.

The answers are Prometheus's own (tests/fixtures/bench/train_digits/storage_queries.out,
recorded on a local cluster's master); tests/unit/test_monitoring_stack.py runs the command
against a real Prometheus, tests/integration/test_data.py on a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.bench import storage_reads

RECORDED = (Path(__file__).resolve().parents[1] / "fixtures/bench/train_digits/storage_queries.out").read_text()


def answer(value: float | None) -> str:
    result = [] if value is None else [{"metric": {}, "value": [1795468303.884, str(value)]}]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


def test_the_window_covers_the_run_and_the_next_scrape():
    w, at = storage_reads.window(1000.0, 1040.2)
    assert w == 41 + storage_reads.SCRAPE_S and at == 1000.0 + w


def test_the_command_asks_both_series_at_the_windows_end():
    cmd = storage_reads.query_cmd("10.9.0.10", 1000.0, 1040.2)
    w = 41 + storage_reads.SCRAPE_S
    assert cmd.count("curl -sf --max-time 10 http://10.9.0.10:9090/api/v1/query") == 2
    assert f"node_mountstats_nfs_total_read_bytes_total{{job=\"node\"}}[{w}s]" in cmd
    assert f"node_disk_read_bytes_total{{job=\"node\",node_role=\"master\"}}[{w}s]" in cmd
    assert cmd.count(f"time={1000.0 + w:.3f}") == 2 and cmd.count(storage_reads.UNREACHABLE) == 2


def test_the_recorded_local_answer_disk_only():
    got = storage_reads.parse(RECORDED, 0.0, 40.0, "host_bind")
    assert got["master_disk_mb_per_s"] == pytest.approx(53166080 / 40 / 1e6)
    assert got["nfs_clients_mb_per_s"] is None
    assert got["note"] == ("no NFS client counters (the shared dir is a bind mount here, not NFS); "
                           "master_disk is the host's disk (containers share its /proc/diskstats)")


def test_on_nfs_both_figures_and_a_missing_series_is_named():
    got = storage_reads.parse(answer(8e8) + "\n" + answer(2e8) + "\n", 0.0, 100.0, "nfs")
    assert (got["nfs_clients_mb_per_s"], got["master_disk_mb_per_s"], got["note"]) == (8.0, 2.0, None)
    got = storage_reads.parse(answer(None) + "\n" + answer(0) + "\n", 0.0, 100.0, "nfs")
    assert got["nfs_clients_mb_per_s"] is None and got["note"] == "nfs_clients: no series in Prometheus"
    assert got["master_disk_mb_per_s"] == 0.0


def test_no_prometheus_or_a_refused_query_is_a_note_not_a_failure():
    down = storage_reads.parse(f"{storage_reads.UNREACHABLE}\n{storage_reads.UNREACHABLE}\n", 0.0, 10.0, "nfs")
    assert down["nfs_clients_mb_per_s"] is None and down["master_disk_mb_per_s"] is None
    assert "did not answer" in down["note"]
    bad = json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"})
    got = storage_reads.parse(f"{bad}\n{answer(1e6)}\n", 0.0, 1.0, "nfs")
    assert got["note"] == "nfs_clients: parse error" and got["master_disk_mb_per_s"] == 1.0
