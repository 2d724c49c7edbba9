"""Health that keeps watch, on one real local cluster of its own (`scheduler: slurm`, 2
nodes, monitoring on, no notebook, health every 20 s, a grace of 30 s, one replacement a
day): a worker whose shared dir turns read-only is drained by health with that reason
after two runs while an administrator's drain of the master stays, and resumed by the
timer when fixed by hand; a worker failing one run only is never drained; the shared dir
unmounted on a worker is drained with that reason within two intervals and the
NodeHealthFailing alert fires in the cluster's Prometheus; `status` names it; `heal`
refuses in one line while another verb holds the cluster's lock, then `heal --yes`
replaces the worker, the standard check passes on it, Slurm resumes it (sinfo idle) and
the ledger has the line; the next failure, past the daily limit, is named and left alone.

The scenarios run in order on the one cluster (each leaves it as the next expects):
about 5 minutes beside the cluster's `up` and `down`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import time

import pytest

from tests.integration.conftest import cluster_up

NAME = "ihealth"
SUBNET = "10.84.0.0/24"
MASTER, WORKER = f"{NAME}-master", f"{NAME}-worker-1"
INTERVAL = 20
LAST = "/var/lib/deployer-health/last.json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = (f"name: {NAME}\nnodes: 2\njupyter: false\nscheduler: slurm\n"
            f"health:\n  interval: {INTERVAL}s\n  grace: 30s\n  max_replacements_per_day: 1\n"
            f"local:\n  subnet: {SUBNET}\n")
    with cluster_up(tmp_path_factory, NAME, spec) as c:
        yield c


def on_master(cluster, cmd: str, timeout: float = 120) -> str:
    p = cluster.deployer("ssh", "--", cmd, timeout=timeout)
    assert p.returncode == 0, f"{cmd}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p.stdout


def on_worker(cluster, cmd: str) -> str:
    return on_master(cluster, f"ssh -o BatchMode=yes {WORKER} {shlex.quote(cmd)}")


def slurm_state(cluster, node: str) -> tuple[str, str]:
    out = on_master(cluster, f"sinfo --noheader --Node --nodes={node} --format='%T|%E'").strip().splitlines()[0]
    state, _, reason = out.partition("|")
    return state.strip(), reason.strip()


def last_run(cluster) -> dict:
    return json.loads(on_worker(cluster, f"cat {LAST}"))


def wait_for(what: str, probe, timeout: float, every: float = 2):
    t0 = time.monotonic()
    while True:
        got = probe()
        if got:
            return got, time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


def test_read_only_shared_dir_is_drained_with_its_reason_an_admins_drain_stays_and_the_timer_resumes_the_fixed_node(cluster):
    on_master(cluster, f"sudo scontrol update nodename={MASTER} state=drain reason='maintenance: admin'")
    on_worker(cluster, "sudo mount -o remount,bind,ro,nosuid,nodev /shared")
    try:
        (state, reason), took = wait_for(
            "the worker drained", lambda: (s := slurm_state(cluster, WORKER))[0].startswith("drain") and s, 3 * INTERVAL + 15)
        assert reason.startswith("deployer health: shared_dir: /shared: cannot write"), reason
        assert slurm_state(cluster, MASTER) == ("drained", "maintenance: admin")
    finally:
        on_worker(cluster, "sudo mount -o remount,bind,rw,nosuid,nodev /shared")  # fixed by hand
    (state, _), took = wait_for("the fixed worker resumed", lambda: (s := slurm_state(cluster, WORKER))[0] == "idle" and s,
                                2 * INTERVAL + 15)
    # Health never touched the master's drain, through every run since.
    assert slurm_state(cluster, MASTER) == ("drained", "maintenance: admin")
    on_master(cluster, f"sudo scontrol update nodename={MASTER} state=resume")


def test_a_node_failing_once_is_not_drained(cluster):
    before = last_run(cluster)["at"]
    wait_for("a run", lambda: last_run(cluster)["at"] != before, 2 * INTERVAL)  # just after a run: 20 s to the next
    on_worker(cluster, "sudo mount -o remount,bind,ro,nosuid,nodev /shared")
    try:
        wait_for("one failed run", lambda: last_run(cluster)["consecutive_failures"] == 1, 2 * INTERVAL, every=1)
    finally:
        on_worker(cluster, "sudo mount -o remount,bind,rw,nosuid,nodev /shared")
    assert slurm_state(cluster, WORKER)[0] == "idle"
    wait_for("a passing run", lambda: last_run(cluster)["verdict"] != "fail", 2 * INTERVAL)
    assert slurm_state(cluster, WORKER)[0] == "idle"


def test_shared_dir_unmounted_is_drained_within_two_intervals_and_the_alert_fires(cluster):
    on_worker(cluster, "sudo umount /shared")
    (_, reason), took = wait_for(
        "the worker drained", lambda: (s := slurm_state(cluster, WORKER))[0].startswith("drain") and s, 3 * INTERVAL)
    assert reason.startswith("deployer health: shared_dir: /shared is not mounted"), reason
    assert took <= 2 * INTERVAL + 10, f"drained after {took:.0f} s"
    master_ip = cluster.cluster_output().master.private_ip

    def firing():
        out = on_master(cluster, f"curl -s --fail http://{master_ip}:9090/api/v1/alerts")
        alerts = json.loads(out)["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "NodeHealthFailing" and a["state"] == "firing"]

    alerts, _ = wait_for("NodeHealthFailing firing", firing, 60, every=5)
    assert {a["labels"]["instance"] for a in alerts} == {WORKER}
    status = cluster.deployer("status")
    assert f"health {WORKER}: fail for" in status.stderr and "shared_dir: /shared is not mounted" in status.stderr


def test_heal_refuses_in_one_line_while_another_verb_holds_the_lock(cluster):
    fd = os.open(cluster.state / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"bench by pid 1", 0)
        p = cluster.deployer("heal", "--yes", timeout=60)
    finally:
        os.close(fd)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [f"error: cluster {NAME!r} is busy (bench by pid 1); wait for it to finish, "
                                              "then run this again"]


def test_heal_replaces_the_failing_worker_proves_it_and_resumes_it(cluster):
    old_id = next(n.id for n in cluster.cluster_output().nodes if n.name == WORKER)
    wait_for("past the grace", lambda: last_run(cluster)["failing_since"] and
             time.time() - last_run(cluster)["failing_since"] > 35, 60, every=5)
    p = cluster.deployer("heal", "--yes", "--json", timeout=1200)
    assert p.returncode == 0, p.stderr[-4000:]
    result = {d["node"]: d for d in json.loads(p.stdout)["nodes"]}
    assert result[WORKER]["action"] == "replace"
    assert result[WORKER]["result"] == "replaced, standard check passed, resumed in Slurm"
    # No node failed: the check's verdict is pass, or warn where a measurement (the network
    # matrix, latency, stragglers) read the CI machine's 2 busy cores as a slow node; a CI
    # run beside the cloud tier once said warn here. Heal's promise is no failure.
    assert re.search(r"check \(standard\): (pass|warn) on \d+ node\(s\)", p.stderr), p.stderr[-4000:]
    assert next(n.id for n in cluster.cluster_output().nodes if n.name == WORKER) != old_id
    assert slurm_state(cluster, WORKER)[0] == "idle"
    lines = [json.loads(x) for x in (cluster.workdir / ".deployer" / "ledger.jsonl").read_text().splitlines()]
    heal_line = [x for x in lines if x.get("event") == "heal"][-1]
    assert heal_line["cluster"] == NAME and heal_line["node"] == WORKER and heal_line["proved"] is True
    assert 0 < heal_line["node_hours_lost"] < 1


def test_a_failure_past_the_daily_limit_is_named_and_left_alone(cluster):
    on_worker(cluster, "sudo umount /shared")
    wait_for("failing past the grace", lambda: (r := last_run(cluster))["failing_since"] and
             time.time() - r["failing_since"] > 35, 3 * INTERVAL + 40, every=5)
    p = cluster.deployer("heal", "--yes", "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    result = {d["node"]: d for d in json.loads(p.stdout)["nodes"]}
    assert result[WORKER]["action"] == "limit" and result[WORKER]["result"] is None
    assert f"heal: {WORKER}: failing for" in p.stderr and "1 replacement(s) in 24 h is the limit" in p.stderr
    assert slurm_state(cluster, WORKER)[0].startswith("drain")  # health's drain, left as it is
