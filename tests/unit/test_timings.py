"""Per-stage timings of `up` (deployer/pipeline/timings.py), the per-role split read from a recorded
ansible-runner event log (a 3-node local `up`, tests/fixtures/ansible/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.pipeline import timings

EVENTS = Path(__file__).resolve().parents[1] / "fixtures" / "ansible" / "events_3node_up_recorded.jsonl"


def test_roles_from_the_recorded_event_log():
    roles = timings.ansible_roles(EVENTS)
    assert list(roles)[:2] == ["training_runtime", "jupyterlab"]  # slowest first
    assert roles["training_runtime"] == pytest.approx(65.7, abs=0.1)
    events = [json.loads(line) for line in EVENTS.read_text().splitlines()]
    first = min(e["created"] for e in events)
    last = max(e["created"] for e in events)
    from datetime import datetime

    wall = (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()
    # Every span between the first task and the stats belongs to a role or play: nothing lost, nothing twice.
    assert sum(roles.values()) <= wall and sum(roles.values()) > 0.95 * wall


def test_no_log_no_roles_and_a_torn_line_is_skipped(tmp_path):
    assert timings.ansible_roles(tmp_path / "none.jsonl") == {}
    log = tmp_path / "ev.jsonl"
    log.write_text(EVENTS.read_text() + '{"event": "playbook_on_task_st')
    assert timings.ansible_roles(log) == timings.ansible_roles(EVENTS)


def test_summary_line_and_record(tmp_path):
    t = timings.Stages()
    with t.stage("preflight"):
        pass
    with t.stage("ansible"):
        pass
    t.roles = {"training_runtime": 41.2, "mpi": 3.0}
    t.seconds.update(ansible=80.4)
    rec = t.write(tmp_path)
    assert timings.read(tmp_path) == rec
    line = timings.summary("up", 8, rec)
    assert line.startswith("up 8 nodes in ") and "preflight 0 s · ansible 80 s (training_runtime 41 s)" in line
    assert timings.summary("up", 1, {"total_s": 3, "stages_s": {}, "ansible_roles_s": {}}).startswith("up 1 node in 3 s")


def test_a_failing_stage_still_leaves_its_timings(tmp_path):
    t = timings.Stages()
    t.run_dir = tmp_path
    with pytest.raises(RuntimeError), t.stage("apply"):
        raise RuntimeError("terraform failed")
    rec = timings.read(tmp_path)
    assert rec["failed_stage"] == "apply" and "apply" in rec["stages_s"]


# What site.yml's last play hands over (set_stats, per_host false): each node's
# `nft --json list counter` output, '' where the command failed (no nft on that node).
NFT = '{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}}, ' \
      '{"counter": {"family": "inet", "name": "from_outside", "table": "deployer_acct", "handle": 2, "packets": %d, "bytes": %d}}]}'
STATS = {"bytes_from_outside": {"c-master": NFT % (9000, 812_345_678), "c-worker-1": NFT % (40, 2_100_000),
                                "c-worker-2": NFT % (12, 31_000), "c-worker-3": ""}}


def test_bytes_from_outside_per_node_from_the_plays_stats():
    pulled = timings.bytes_from_outside(STATS)
    assert pulled == {"c-master": 812_345_678, "c-worker-1": 2_100_000, "c-worker-2": 31_000, "c-worker-3": None}
    assert timings.bytes_from_outside({}) == {}
    assert timings.bytes_from_outside({"bytes_from_outside": {"n": '{"nftables": []}'}}) == {"n": None}


def test_summary_says_what_the_master_and_the_workers_pulled(tmp_path):
    t = timings.Stages()
    t.seconds = {"ansible": 80.0}
    t.pulled = timings.bytes_from_outside(STATS)
    rec = t.write(tmp_path)
    assert timings.read(tmp_path)["bytes_from_outside"]["c-worker-3"] is None
    line = timings.summary("up", 4, rec)
    assert line.endswith("ansible 80 s · pulled from outside: master 812.3 MB, workers ≤ 2.1 MB"), line
    one = {"total_s": 1, "stages_s": {}, "bytes_from_outside": {"c-master": 5}}
    assert timings.summary("up", 1, one).endswith("pulled from outside: master 5 B")
    none = {"total_s": 1, "stages_s": {}, "bytes_from_outside": {"c-master": None}}
    assert "not counted" in timings.summary("up", 1, none)
    assert "pulled" not in timings.summary("up", 1, {"total_s": 1, "stages_s": {}})  # Ansible skipped: nothing read
