"""`deployer heal`'s policy and `status`'s reading of health, without a cluster: each node's
record as the master prints it (deployer/health.py), the grace, the daily limit counted
in the ledger, the master only when named, a node whose health stopped reporting."""

from __future__ import annotations

import json
from datetime import timedelta

from deployer import heal, health, ledger
from deployer.cluster import Cluster
from deployer.lifetime import iso, now
from deployer.spec import HealthSpec

NOW = 1_800_000_000.0


def _cluster() -> Cluster:
    nodes = [{"name": f"demo-{r}", "role": "master" if r == "master" else "worker", "id": r, "private_ip": f"10.0.0.{i + 2}",
              "public_ip": None, "gpus": 0} for i, r in enumerate(["master", "worker-1", "worker-2"])]
    return Cluster.parse({"name": "demo", "provider": "local", "ssh_user": "deployer", "shared_dir": "/shared", "nodes": nodes})


def _record(verdict: str, *, failing_for: float = 0, age: float = 5, runs: int = 0, reason: str = "all checks passed") -> dict:
    return {"verdict": verdict, "reason": reason, "at": NOW - age, "consecutive_failures": runs,
            "failing_since": NOW - failing_for if verdict == "fail" else None, "interval": 20, "drained_by_health": runs >= 2}


def _printed(records: dict[str, dict | None], seen: dict[str, float] | None = None) -> str:
    lines = [f"{health._MARK}{health.CLOCK}", str(NOW)]
    for name, rec in records.items():
        lines += [f"{health._MARK}{name}", json.dumps(rec) if rec else ""]
    for name, at in (seen or {}).items():
        lines += [f"{health._MARK}{health.SEEN}{name}", str(at)]
    return "\n".join(lines) + "\n"


def _health(records: dict[str, dict | None], seen: dict[str, float] | None = None) -> dict[str, health.NodeHealth]:
    found, clock = health.parse(_printed(records, seen), list(records))
    assert clock == NOW
    return found


def test_the_masters_printout_reads_as_each_nodes_health():
    found = _health({"demo-master": _record("pass"), "demo-worker-1": _record("fail", failing_for=90, runs=4,
                                                                             reason="shared_dir: /shared is not mounted"),
                     "demo-worker-2": None})
    assert found["demo-master"].verdict == "pass" and not found["demo-master"].stale(NOW)
    w1 = found["demo-worker-1"]
    assert (w1.verdict, w1.consecutive_failures, w1.failing_for(NOW)) == ("fail", 4, 90)
    assert health.describe(w1, NOW) == "fail for 1m 30s (4 runs): shared_dir: /shared is not mounted; drained"
    assert found["demo-worker-2"].verdict is None
    assert health.describe(found["demo-master"], NOW) == "pass 5s ago"


def test_health_that_stopped_reporting_is_said():
    h = health.from_record("n", _record("pass", age=200))  # interval 20 s: stale past 100 s
    assert h.stale(NOW)
    assert health.describe(h, NOW) == "stopped reporting (last run 3m 20s ago: pass)"


def _plan(records, policy=None, done=0, named=()):
    return {d.node: d for d in heal.plan(_health(records), _cluster(), policy or HealthSpec(grace="1m"), NOW, done, list(named))}


def test_a_node_failing_past_the_grace_is_replaced_one_inside_it_waits():
    got = _plan({"demo-master": _record("pass"), "demo-worker-1": _record("fail", failing_for=120, runs=6),
                 "demo-worker-2": _record("fail", failing_for=30, runs=2)})
    assert got["demo-master"].action == "ok"
    assert got["demo-worker-1"].action == "replace"
    assert got["demo-worker-2"].action == "wait" and got["demo-worker-2"].why.startswith("failing for 30s, inside the grace of 1m")


def test_past_the_daily_limit_a_failing_node_is_named_and_left_alone():
    records = {"demo-master": _record("pass"), "demo-worker-1": _record("fail", failing_for=120, runs=6),
               "demo-worker-2": _record("fail", failing_for=600, runs=30)}
    got = _plan(records, HealthSpec(grace="1m", max_replacements_per_day=2), done=1)
    assert [got[n].action for n in ("demo-worker-1", "demo-worker-2")] == ["replace", "limit"]
    assert "2 replacement(s) in 24 h is the limit" in got["demo-worker-2"].why


def test_the_master_only_when_named():
    records = {"demo-master": _record("fail", failing_for=900, runs=40), "demo-worker-1": _record("pass"),
               "demo-worker-2": _record("pass")}
    assert _plan(records)["demo-master"].action == "master"
    assert _plan(records, named=["demo-master"])["demo-master"].action == "replace"


def test_a_stale_failure_is_not_acted_on():
    records = {"demo-master": _record("pass"), "demo-worker-1": _record("fail", failing_for=3600, age=3000, runs=9),
               "demo-worker-2": _record("pass")}
    assert _plan(records)["demo-worker-1"].action == "ok"


def test_replacements_today_count_the_ledgers_heal_lines(tmp_path):
    t = now()
    for hours, event in ((30, "heal"), (5, "heal"), (1, "scale"), (0.5, "heal")):
        ledger.note_event(tmp_path, {"time": iso(t - timedelta(hours=hours)), "cluster": "demo", "nodes": 3, "event": event})
    ledger.note_event(tmp_path, {"time": iso(t), "cluster": "other", "nodes": 2, "event": "heal"})
    assert heal.replacements_today(tmp_path, "demo", t) == 2
    # the heal lines change no size: usage sums 3 nodes throughout
    assert ledger.usage(ledger.entries(tmp_path), t)["clusters"][0]["nodes_now"] == 3


def test_a_node_heal_drained_and_could_not_prove_is_proved_again_once_it_passes():
    records = {"demo-master": _record("pass"), "demo-worker-1": _record("pass"), "demo-worker-2": _record("fail", failing_for=5, runs=1)}
    got = {d.node: d for d in heal.plan(_health(records), _cluster(), HealthSpec(grace="1m"), NOW, 0, [],
                                        frozenset({"demo-worker-1", "demo-worker-2"}))}
    assert got["demo-worker-1"].action == "prove"
    assert got["demo-worker-2"].action == "wait"  # failing again: the policy as for any node
    assert got["demo-master"].action == "ok"


def test_the_spec_health_section():
    import pytest
    from pydantic import ValidationError

    from deployer.spec import ClusterSpec

    assert ClusterSpec().health.enabled and ClusterSpec().health.interval_s == 300 and ClusterSpec().health.grace_s == 600
    assert ClusterSpec.model_validate({"health": False}).health.enabled is False
    assert ClusterSpec.model_validate({"health": None}).health.interval == "5m"
    assert ClusterSpec.model_validate({"health": {"interval": "20s", "grace": "1h"}}).health.grace_s == 3600
    with pytest.raises(ValidationError, match="at least 10s"):
        ClusterSpec.model_validate({"health": {"interval": "5s"}})
    with pytest.raises(ValidationError):
        ClusterSpec.model_validate({"health": {"interval": "5 minutes"}})


def test_drain_waits_for_the_nodes_jobs_unless_now(monkeypatch):
    said = []
    answers = iter(["", "101 102", "102", ""])  # the drain, then squeue until the node is empty

    def fake(state, cluster, cmd, timeout=60):
        said.append(cmd)
        return 0, next(answers)

    monkeypatch.setattr(heal, "_slurm", fake)
    monkeypatch.setattr(heal.time, "sleep", lambda s: None)
    heal.drain(None, _cluster(), "demo-worker-1", "shared_dir: gone", wait_jobs=True)
    assert said[0] == "sudo -n scontrol update nodename=demo-worker-1 state=drain reason='deployer heal: replacing: shared_dir: gone'"
    assert sum("squeue" in c for c in said) == 3
    said.clear()
    answers = iter([""])
    heal.drain(None, _cluster(), "demo-worker-1", "x", wait_jobs=False)  # --now
    assert len(said) == 1


def test_resume_waits_until_slurmctld_hears_from_the_node_and_restarts_its_slurmd_once(monkeypatch):
    # sinfo's "idle*" (not responding: no job goes there) right after the resume, as a CI
    # run saw after a replacement; slurmd's restart makes it register at once.
    clock = [0.0]
    said: list[str] = []
    responding_after_restart = []

    def fake(state, cluster, cmd, timeout=60):
        said.append(cmd)
        if cmd.startswith("sinfo"):
            return 0, "demo-worker-1 idle" if responding_after_restart else "demo-worker-1 idle*"
        if "systemctl restart slurmd" in cmd:
            responding_after_restart.append(True)
        return 0, ""

    monkeypatch.setattr(heal, "_slurm", fake)
    monkeypatch.setattr(heal.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(heal.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    assert heal.resume(None, _cluster(), "demo-worker-1") == "resumed in Slurm"
    assert said[0] == "sudo -n scontrol update nodename=demo-worker-1 state=resume"
    restarts = [c for c in said if "restart slurmd" in c]
    assert restarts == ["ssh -o BatchMode=yes demo-worker-1 sudo -n systemctl restart slurmd"]
    assert said.index(restarts[0]) > 5  # not before 10 s of waiting: a ping usually clears it first

    # A node that never answers: heal says so in its result, after RESPOND_WAIT_S, and goes on.
    said.clear()
    clock[0] = 0.0
    monkeypatch.setattr(heal, "_slurm", lambda state, cluster, cmd, timeout=60: (
        said.append(cmd), (0, "demo-worker-1 down*" if cmd.startswith("sinfo") else ""))[1])
    warned: list[str] = []
    monkeypatch.setattr(heal.ui, "warn", warned.append)
    assert heal.resume(None, _cluster(), "demo-worker-1") == "resumed in Slurm, not responding yet (demo-worker-1: down*)"
    assert clock[0] > heal.RESPOND_WAIT_S and sum("restart slurmd" in c for c in said) == 1
    assert len(warned) == 1 and "systemctl status slurmd" in warned[0]


def test_a_write_the_master_does_not_see_fails_shared_dir_since_the_last_one_it_saw():
    # worker-1's /shared is a node-local directory since NOW - 300: its writes stop reaching the master
    records = {"demo-master": _record("pass") | {"shared_written_at": NOW - 10},
               "demo-worker-1": _record("pass") | {"shared_written_at": NOW - 8},
               "demo-worker-2": _record("pass") | {"shared_written_at": NOW - 6}}
    found = _health(records, {"demo-master": NOW - 10, "demo-worker-1": NOW - 300, "demo-worker-2": NOW - 1})
    assert found["demo-master"].verdict == "pass" and found["demo-worker-2"].verdict == "pass"  # a newer write seen: shared
    w1 = found["demo-worker-1"]
    assert w1.verdict == "fail" and w1.reason.startswith("shared_dir: its file in the shared dir is not seen from the master")
    assert w1.failing_for(NOW) == 300
    got = {d.node: d for d in heal.plan(found, _cluster(), HealthSpec(grace="1m"), NOW, 0, [])}
    assert got["demo-worker-1"].action == "replace"
