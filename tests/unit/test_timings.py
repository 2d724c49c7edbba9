"""Per-stage timings of `up` (deployer/timings.py), the per-role split read from a recorded
ansible-runner event log (a 3-node local `up`, tests/fixtures/ansible/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer import timings

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
    assert json.loads((tmp_path / "timings.json").read_text()) == rec
    line = timings.summary("up", 8, rec)
    assert line.startswith("up 8 nodes in ") and "preflight 0 s · ansible 80 s (training_runtime 41 s)" in line
    assert timings.summary("up", 1, {"total_s": 3, "stages_s": {}, "ansible_roles_s": {}}).startswith("up 1 node in 3 s")


def test_a_failing_stage_still_leaves_its_timings(tmp_path):
    t = timings.Stages()
    t.run_dir = tmp_path
    with pytest.raises(RuntimeError), t.stage("apply"):
        raise RuntimeError("terraform failed")
    rec = json.loads((tmp_path / "timings.json").read_text())
    assert rec["failed_stage"] == "apply" and "apply" in rec["stages_s"]
