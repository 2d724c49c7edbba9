"""The monitoring stack end to end on 127.0.0.1: node_exporter, Pushgateway and Prometheus.

Prometheus runs with the scrape configuration the prometheus role renders (Ansible's
template module over a one-node inventory whose private_ip is 127.0.0.1) and the real
alerting rules; a benchmark result is pushed with deployer.bench.metrics; then every panel
query of every dashboard is run the way Grafana would (deployer.dashboard). This is
the local stand-in for tests/integration/test_monitoring_live.py. node_exporter also serves
the Slurm series the slurm role's helper renders from recorded sinfo/squeue output, so
the Slurm row is checked here too.

Needs the Debian/Ubuntu packages prometheus, prometheus-node-exporter and
prometheus-pushgateway (binaries only; nothing is installed as a service); skipped
without them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from deployer import credentials, pushgateway
from deployer.bench import metrics
from deployer.check import metrics as check_metrics
from deployer.check.model import CheckReport
from tests import dashboard_checks as dashboard
from tests.unit.test_health_node import nh as health_node
from tests.unit.test_slurm_metrics import REC as SLURM_RECORDED
from tests.unit.test_slurm_metrics import metrics as slurm_metrics

REPO = Path(__file__).resolve().parents[2]
ROLES_DIR = REPO / "ansible" / "roles"
BIN = Path(sys.executable).parent
ANSIBLE_PLAYBOOK = str(BIN / "ansible-playbook") if (BIN / "ansible-playbook").exists() else shutil.which("ansible-playbook")
BINARIES = {
    "prometheus": shutil.which("prometheus"),
    "node_exporter": shutil.which("prometheus-node-exporter") or shutil.which("node_exporter"),
    "pushgateway": shutil.which("prometheus-pushgateway") or shutil.which("pushgateway"),
}
missing = [n for n, path in BINARIES.items() if path is None] + ([] if ANSIBLE_PLAYBOOK else ["ansible-playbook"])
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    bool(missing),
    reason=f"not installed: {', '.join(missing)} (apt-get install prometheus prometheus-node-exporter prometheus-pushgateway)",
)]

RESULT = {
    "run_id": "20250101T120000Z",
    "results": [
        {"nodes": 1, "ranks": 1, "img_per_sec": 50.0, "img_per_sec_per_rank": 50.0, "efficiency": 1.0},
        {"nodes": 2, "ranks": 2, "img_per_sec": 95.0, "img_per_sec_per_rank": 47.5, "efficiency": 0.95},
    ],
    "allreduce": [{"nodes": 2, "bytes": b, "time_us": 10.0 + b / 1e3, "algbw_gb_s": 0.1, "busbw_gb_s": 0.1, "wrong": 0}
                  for b in (1024, 65536, 1048576)],
    "link": {"tool": "iperf3", "gbit_s": 9.4},
    "versions": {"model": "resnet50", "mode": "data-parallel"},
}


# older than RESULT's: Grafana's $run_id (newest first) stays on the synthetic run, $train_run takes this
TRAINING_RUN = "20241231T120000Z"


def training_result(tmp: Path) -> dict:
    """A `bench --data` report as the sweep makes it: recorded resnet_train.py output and
    Prometheus answers replayed (tests/unit/test_bench_train.py)."""
    from deployer.bench import training as bench_train
    from tests.unit.test_bench_train import RUNS, ReplayRunner, make_cluster

    cluster = make_cluster(str(tmp / "shared"))
    opts = bench_train.make_train_options(cluster, data="digits", target_acc=0.9, nodes="1,2")
    return bench_train.run_train(ReplayRunner({1: RUNS["train-1"], 2: RUNS["train-2"]}), cluster, opts,
                                 TRAINING_RUN, tmp / "train")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def wait_ready(url: str, proc: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers (the Pushgateway: 401 without the login)
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what} did not start")
            time.sleep(0.2)


def render_config(tmp: Path, ports: dict[str, int], rules_dir: Path) -> Path:
    """prometheus.yml as the prometheus role renders it, and the Pushgateway's web config
    (pushgateway-web.yml beside it) as the pushgateway role does, from the login in tmp/secrets."""
    inv = {"all": {
        "vars": {"deployer_cluster_name": "stack", "deployer_provider": "local", "deployer_grafana_installable": False,
                 "deployer_shared_storage": "host_bind", "deployer_host_package_sources": True, "deployer_monitoring_retention": "1d",
                 "deployer_repo_dir": str(REPO)},
        "hosts": {"stack-master": {"private_ip": "127.0.0.1", "node_role": "master", "node_index": 0, "gpus": 0}},
        "children": {"master": {"hosts": {"stack-master": {}}}, "workers": {"hosts": {}}, "gpu": {"hosts": {}}},
    }}
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inv))
    out = tmp / "prometheus.yml"
    play = [{"hosts": "master", "gather_facts": False,
             "vars_files": [str(ROLES_DIR / "prometheus" / "defaults" / "main.yml"),
                            str(ROLES_DIR / "pushgateway" / "defaults" / "main.yml")],
             "tasks": [{"ansible.builtin.template": {"src": "{{ prometheus_config_template }}", "dest": str(out),
                                                     "mode": "0644"}},
                       {"ansible.builtin.template": {"src": str(ROLES_DIR / "pushgateway/templates/pushgateway-web.yml.j2"),
                                                     "dest": str(tmp / "pushgateway-web.yml"), "mode": "0644"}}]}]
    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    extra = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "prometheus_port": ports["prometheus"], "prometheus_node_exporter_port": ports["node_exporter"],
             "prometheus_pushgateway_port": ports["pushgateway"], "prometheus_rules_dir": str(rules_dir),
             "prometheus_scrape_interval": "1s", "prometheus_scrape_timeout": "1s",
             "prometheus_evaluation_interval": "1s", "deployer_secrets_dir": str(tmp / "secrets"),
             "prometheus_pushgateway_password_file": str(tmp / "secrets" / "pushgateway_password")}
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp / "at")}
    r = subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml"), "-e", json.dumps(extra)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


class Stack(str):
    """Prometheus's URL, and where the Pushgateway listens."""

    pushgateway_port: int


# A standard check of a 3-node cluster as `deployer check --json` records it: a worker
# warned (the straggler), the network matrix and the straggler's rates.
CHECK = CheckReport.from_record({
    "schema": 1, "cluster": "stack", "level": "standard", "at": "2026-11-25T21:00:00Z", "seconds": 40.2, "verdict": "warn",
    "nodes": [{"name": "stack-master", "findings": [{"check": "clock", "status": "pass", "detail": "+0.01 s"}]},
              {"name": "stack-worker-1", "findings": [{"check": "straggler", "status": "warn", "detail": "57% of the median"}]},
              {"name": "stack-worker-2", "findings": [{"check": "runtime", "status": "pass", "detail": "torch 2.13.0"}]}],
    "cluster_findings": [
        {"check": "network", "status": "pass", "detail": "3 pair(s)", "value": {"pairs": [
            {"src": "stack-master", "dst": "stack-worker-1", "gbit_s": 12.2},
            {"src": "stack-master", "dst": "stack-worker-2", "gbit_s": 12.9},
            {"src": "stack-worker-1", "dst": "stack-worker-2", "gbit_s": 11.8}]}},
        {"check": "straggler", "status": "pass", "detail": "3 node(s) timed",
         "value": {"img_per_sec": {"stack-master": 3.3, "stack-worker-1": 2.0, "stack-worker-2": 3.5}}}]})


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack")
    ports = {name: free_port() for name in BINARIES}
    rules = tmp / "rules"
    rules.mkdir()
    login = credentials.make_pushgateway_login(tmp / "secrets")
    for f in (REPO / "monitoring/prometheus/rules").glob("*.yml"):
        shutil.copy(f, rules)
    config = render_config(tmp, ports, rules)
    fs_exclude = yaml.safe_load((ROLES_DIR / "node_exporter/defaults/main.yml").read_text())["node_exporter_fs_types_exclude"]
    # The Slurm row's series as the master's timer writes them: the role's helper rendering
    # sinfo/squeue output recorded on a real cluster, served by node_exporter's textfile collector.
    textfile = tmp / "textfile"
    textfile.mkdir()
    slurm_metrics.write_atomically(str(textfile / "slurm.prom"), slurm_metrics.render(
        slurm_metrics.parse_sinfo(SLURM_RECORDED["drained"]), slurm_metrics.parse_squeue(SLURM_RECORDED["squeue"])))
    # The Node health row's series as each node's health program writes them (its own writer):
    # a node failing its second run in a row.
    health_node.write_atomic(str(textfile / "deployer_health.prom"), health_node.textfile({
        "verdict": "fail", "consecutive_failures": 2, "failing_since": time.time() - 40, "drained_by_health": True,
        "at": time.time(), "seconds": 0.06, "cpu_seconds": 0.07, "interval": 20,
        "findings": [{"check": "clock", "status": "warn"}, {"check": "shared_dir", "status": "fail"},
                     {"check": "runtime", "status": "pass"}]}))
    cmds = {
        "node_exporter": [BINARIES["node_exporter"], f"--web.listen-address=127.0.0.1:{ports['node_exporter']}",
                          f"--collector.filesystem.fs-types-exclude={fs_exclude}", f"--collector.textfile.directory={textfile}"],
        "pushgateway": [BINARIES["pushgateway"], f"--web.listen-address=127.0.0.1:{ports['pushgateway']}",
                        f"--persistence.file={tmp / 'pg.data'}", f"--web.config.file={tmp / 'pushgateway-web.yml'}"],
        "prometheus": [BINARIES["prometheus"], f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                       "--storage.tsdb.retention.time=1d", f"--web.listen-address=127.0.0.1:{ports['prometheus']}"],
    }
    procs = {}
    try:
        for name, cmd in cmds.items():
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "wb"))
        wait_ready(f"http://127.0.0.1:{ports['node_exporter']}/metrics", procs["node_exporter"], "node_exporter")
        wait_ready(f"http://127.0.0.1:{ports['pushgateway']}/-/ready", procs["pushgateway"], "pushgateway")
        prom = f"http://127.0.0.1:{ports['prometheus']}"
        wait_ready(f"{prom}/-/ready", procs["prometheus"], "prometheus")

        gateway = pushgateway.url("127.0.0.1", ports["pushgateway"])
        metrics.push_bench_results(gateway, RESULT, login=login)
        metrics.push_bench_results(gateway, training_result(tmp), login=login)
        check_metrics.push_report(gateway, CHECK, login=login)
        forge(gateway, login)
        api = dashboard.PrometheusAPI(prom)
        deadline = time.monotonic() + 60
        while True:  # until every target is up, the pushed run is scraped and rates have two samples
            up = api.query("up")
            ready = (up and all(r["value"][1] == "1" for r in up)
                     and api.query("deployer_bench_run_timestamp_seconds")
                     and api.query("deployer_check_node_verdict")
                     and api.query('rate(node_cpu_seconds_total{mode="idle"}[30s])'))
            if ready:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"stack not scraped in time; up={up}")
            time.sleep(1)
        running = Stack(prom)
        running.pushgateway_port = ports["pushgateway"]
        yield running
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_every_target_is_up(stack):
    targets = dashboard.PrometheusAPI(stack).targets()
    assert {t["labels"]["job"] for t in targets} == {"prometheus", "node", "pushgateway"}
    assert all(t["health"] == "up" for t in targets), [(t["scrapeUrl"], t["lastError"]) for t in targets]
    assert {t["labels"]["instance"] for t in targets} == {"stack-master"}


def test_rules_are_loaded(stack):
    groups = dashboard.PrometheusAPI(stack).get("/api/v1/rules")["groups"]
    names = {r["name"] for g in groups for r in g["rules"]}
    assert {"NodeDown", "DiskFillingUp", "GpuTooHot", "ScrapeFailing", "NodeHealthFailing", "NodeHealthStale"} <= names
    assert all(r["health"] == "ok" for g in groups for r in g["rules"])


def forge(gateway: str, login) -> None:
    """A push that names another job and instance (what a push with the login could try):
    a node_exporter series of a worker."""
    import base64

    body = b'node_load1{instance="stack-worker-9"} 99\n'
    req = urllib.request.Request(f"{gateway}/metrics/job/node/instance/stack-worker-9", data=body, method="PUT")
    req.add_header("Authorization", "Basic " + base64.b64encode(f"{login.user}:{login.password}".encode()).decode())
    with urllib.request.urlopen(req, timeout=5):
        pass


def test_the_pushgateway_takes_nothing_without_the_login(stack, tmp_path_factory):
    from deployer.errors import OperationFailed

    gateway = f"http://127.0.0.1:{stack.pushgateway_port}"
    with pytest.raises(OperationFailed, match="Unauthorized"):
        metrics.push_bench_results(gateway, {**RESULT, "run_id": "intruder"})
    with pytest.raises(urllib.error.HTTPError) as e:  # nor does it answer a read or a delete
        urllib.request.urlopen(urllib.request.Request(f"{gateway}/metrics/job/deployer_bench/run_id/{RESULT['run_id']}",
                                                      method="DELETE"), timeout=5)
    assert e.value.code == 401


def test_a_forged_job_and_instance_do_not_stick(stack):
    """Whatever a push names, Prometheus gives its series job="deployer_bench" and the
    master as instance: it cannot pass for a node's series."""
    api = dashboard.PrometheusAPI(stack)
    deadline = time.monotonic() + 30
    while not api.query("node_load1 == 99") and time.monotonic() < deadline:
        time.sleep(1)
    rows = api.query("node_load1 == 99")
    assert rows and {(r["metric"]["job"], r["metric"]["instance"]) for r in rows} == {("deployer_bench", "stack-master")}
    assert not any(k.startswith("exported_") for r in rows for k in r["metric"])


def test_pushed_series_keep_job_and_run_id(stack):
    rows = dashboard.PrometheusAPI(stack).query("deployer_bench_img_per_sec")
    assert {(r["metric"]["job"], r["metric"]["run_id"], r["metric"]["nodes"], r["metric"]["mode"]) for r in rows} == {
        ("deployer_bench", RESULT["run_id"], "1", "data-parallel"), ("deployer_bench", RESULT["run_id"], "2", "data-parallel"),
        ("deployer_bench", TRAINING_RUN, "1", "train"), ("deployer_bench", TRAINING_RUN, "2", "train")}


def test_every_panel_query_is_valid_promql(stack):
    checks = dashboard.check_dashboards(stack, rate_interval="30s")
    assert checks
    bad = [(c.query.dashboard, c.query.panel, c.expr, c.error) for c in checks
           if c.error and not (c.query.dashboard == "deployer-gpu" and c.unresolved)]
    assert not bad


# Panels of services this stand-in does not run; test_monitoring_live checks them
# against the real JupyterLab on the local cluster's master.
# node_mountstats_nfs_*: no NFS mount on this machine (its kernel has no NFS client); the
# panel's query is checked as valid PromQL above, and storage_reads on a real cluster.
NOT_IN_THIS_STACK = ('job="jupyterlab"', "node_mountstats_nfs_")


def test_cluster_and_benchmark_panels_have_data(stack):
    checks = dashboard.check_dashboards(stack, rate_interval="30s")
    empty = [(c.query.dashboard, c.query.panel, c.expr, c.error) for c in checks
             if c.query.dashboard != "deployer-gpu" and not c.has_data and not any(k in c.expr for k in NOT_IN_THIS_STACK)]
    assert not empty


def test_gpu_panels_are_empty_on_a_cpu_node(stack):
    checks = [c for c in dashboard.check_dashboards(stack, rate_interval="30s") if c.query.dashboard == "deployer-gpu"]
    panels = [c for c in checks if not c.query.panel.startswith("annotation:")]
    assert panels and not any(c.has_data for c in panels)
    # The benchmark-run markers show on every dashboard, the GPU one included.
    assert all(c.has_data for c in checks if c.query.panel.startswith("annotation:"))


def test_the_bench_reads_the_shared_storage_throughput_from_this_prometheus(stack):
    """storage_reads' command run here (curl against the real Prometheus, as on the master):
    the master's disk counter answers with a figure; NFS has no series, and the note says why."""
    from deployer.bench import storage_reads

    port = int(stack.rsplit(":", 1)[1])
    end = time.time() - 1
    cmd = storage_reads.query_cmd("127.0.0.1", end - 20, end, port=port)
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = storage_reads.parse(r.stdout, end - 20, end, "host_bind")
    assert got["master_disk_mb_per_s"] is not None and got["master_disk_mb_per_s"] >= 0, (r.stdout, got)
    assert got["nfs_clients_mb_per_s"] is None and "bind mount here, not NFS" in got["note"]
    assert got["window_s"] == 20 + storage_reads.SCRAPE_S and got["run_s"] == 20
    # nothing listening: a note, not a failure of the bench
    dead = storage_reads.query_cmd("127.0.0.1", end - 20, end, port=free_port())
    r = subprocess.run(["bash", "-c", dead], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "did not answer" in storage_reads.parse(r.stdout, end - 20, end, "host_bind")["note"]


def test_the_cluster_health_row_reads_the_pushed_check(stack):
    """The Cluster dashboard's "Cluster health" row, answered by this Prometheus from a
    check pushed as `deployer check` pushes it."""
    api = dashboard.PrometheusAPI(stack)
    assert [r["value"][1] for r in api.query("max by (level) (deployer_check_verdict)")] == ["1"]
    verdicts = {r["metric"]["node"]: r["value"][1] for r in api.query("deployer_check_node_verdict")}
    assert verdicts == {"stack-master": "0", "stack-worker-1": "1", "stack-worker-2": "0"}
    assert [(r["metric"]["node"], r["metric"]["check"]) for r in api.query("deployer_check_status > 0")] == [
        ("stack-worker-1", "straggler")]
    assert len(api.query("deployer_check_pair_gbit_s")) == 3 and len(api.query("deployer_check_node_img_per_sec")) == 3
