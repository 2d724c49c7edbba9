"""Monitoring on a live cluster: targets up, benchmark series present, every dashboard panel has data.

Uses the `live_cluster` fixture (tests/integration/conftest.py), which yields an object
with .prometheus_url (a tunnelled or directly reachable http URL of the master's
Prometheus) once a `deployer bench` run has completed; .bench_run_id, when it has one,
names that run. GPU panels are skipped on clusters without dcgm-exporter targets, Slurm
panels on clusters without Slurm (test_slurm.py runs them on its own cluster), training
panels where no `bench --data` run was pushed (test_data.py pushes one, earlier in the
same session), the NFS series on a local cluster (a bind mount), and link-rate panels
are xfailed when the run measured no link rate (link: null).
"""

from __future__ import annotations

import shlex
import time

import pytest

from tests import dashboard_checks as dashboard

pytestmark = pytest.mark.integration

DASHBOARDS = dashboard.load_dashboards()
QUERIES = [q for d in DASHBOARDS.values() for q in dashboard.panel_queries(d) + dashboard.annotation_queries(d)]
# A freshly pushed run shows in Prometheus after one scrape (15s); rate() needs two.
SETTLE_S = 90


def _id(q: dashboard.PanelQuery) -> str:
    return f"{q.dashboard}:{q.panel}:{q.ref_id}".replace(" ", "_")


@pytest.fixture(scope="module")
def prom(live_cluster) -> dashboard.PrometheusAPI:
    return dashboard.PrometheusAPI(live_cluster.prometheus_url, timeout=20)


@pytest.fixture(scope="module")
def run_id(live_cluster, prom) -> str:
    wanted = getattr(live_cluster, "bench_run_id", None)
    deadline = time.monotonic() + SETTLE_S
    while True:
        runs = {r["metric"]["run_id"] for r in prom.query("deployer_bench_run_timestamp_seconds")}
        if runs and (wanted is None or wanted in runs):
            return wanted or max(runs)
        if time.monotonic() > deadline:
            pytest.fail(f"no deployer_bench_* series for run {wanted or '(any)'} in Prometheus; runs seen: {sorted(runs)}")
        time.sleep(5)


@pytest.fixture(scope="module")
def has_gpus(prom) -> bool:
    return any(t["labels"].get("job") == "dcgm" for t in prom.targets())


@pytest.fixture(scope="module")
def variables(prom, run_id) -> dict[str, dict[str, str]]:
    """Per dashboard uid, the value Grafana would pick for each variable; the run under test for $run_id."""
    out = {}
    for d in DASHBOARDS.values():
        values = dashboard.resolve_variables(d, prom.label_values)
        if "run_id" in {v["name"] for v in d["templating"]["list"]}:
            pinned = {**d, "templating": {"list": [
                {**v, "type": "constant", "query": run_id} if v["name"] == "run_id" else v
                for v in d["templating"]["list"]]}}
            values = dashboard.resolve_variables(pinned, prom.label_values)
        out[d["uid"]] = values
    return out


def test_every_target_is_up(prom):
    deadline = time.monotonic() + SETTLE_S
    while True:
        targets = prom.targets()
        down = [(t["labels"].get("job"), t["labels"].get("instance"), t.get("lastError")) for t in targets
                if t["health"] != "up"]
        if targets and not down:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"targets not up: {down}")
        time.sleep(5)
    jobs = {t["labels"]["job"] for t in targets}
    assert {"prometheus", "node", "pushgateway", "jupyterlab"} <= jobs


PUSH_FROM_A_WORKER = r"""
import base64, sys, urllib.error, urllib.request
method, url, login = sys.argv[1:4]
req = urllib.request.Request(url, data=b"intruder_metric 1\n" if method == "PUT" else None, method=method)
if login != "-":
    req.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
try:
    print(urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as e:
    print(e.code)
"""


def test_the_pushgateway_takes_a_push_from_the_cluster_network_only_with_the_login(live_cluster):
    """A worker is on the cluster network, where the Pushgateway listens: without the
    deployer's login its push (or delete) is refused (401); the login the state dir holds works."""
    c = live_cluster.cluster
    master = c.cluster_output().master.private_ip
    url = f"http://{master}:9091/metrics/job/intruder"
    login = "deployer:" + (c.state / "secrets" / "pushgateway_password").read_text().strip()

    def from_worker(method: str, who: str) -> str:
        p = c.deployer("ssh", "worker-1", "--", "python3", "-c", shlex.quote(PUSH_FROM_A_WORKER), method, url, who)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()

    assert [from_worker("PUT", "-"), from_worker("DELETE", "-")] == ["401", "401"]
    assert [from_worker("PUT", login), from_worker("DELETE", login)] == ["200", "202"]


def test_every_node_is_scraped(prom, live_cluster):
    nodes = {r["metric"]["instance"] for r in prom.query('up{job="node"}')}
    expected = getattr(live_cluster, "nodes", None)
    if expected is not None:
        assert len(nodes) == (expected if isinstance(expected, int) else len(expected))
    assert nodes


def test_alert_rules_are_loaded_and_healthy(prom):
    rules = [r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]]
    assert {"NodeDown", "DiskFillingUp", "GpuTooHot", "ScrapeFailing"} <= {r["name"] for r in rules}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]


@pytest.mark.parametrize("metric", [
    "deployer_bench_img_per_sec", "deployer_bench_img_per_sec_per_rank", "deployer_bench_efficiency",
    "deployer_bench_allreduce_busbw_gb_s", "deployer_bench_allreduce_algbw_gb_s", "deployer_bench_run_timestamp_seconds",
])
def test_bench_series_exist(prom, run_id, metric):
    rows = prom.query(f'{metric}{{job="deployer_bench",run_id="{run_id}"}}')
    assert rows, f"{metric} missing for run {run_id}"


@pytest.mark.parametrize("query", QUERIES, ids=_id)
def test_panel_has_data(prom, run_id, has_gpus, variables, query):
    if query.dashboard == "deployer-gpu" and not has_gpus and not query.panel.startswith("annotation:"):
        pytest.skip("CPU cluster: no dcgm-exporter targets, so the GPU dashboard is empty by design")
    if "slurm_" in query.expr and not prom.query("slurm_metrics_success"):
        pytest.skip(
            "no Slurm on this cluster (scheduler: none): the Slurm row is empty by design (tests/integration/test_slurm.py checks it)"
        )
    if "$train_run" in query.expr and not prom.query("deployer_bench_final_top1"):
        pytest.skip("no `bench --data` run pushed to this cluster's Pushgateway (test_data.py pushes one)")
    if "node_mountstats_nfs_" in query.expr and not prom.query("node_mountstats_nfs_total_read_bytes_total"):
        pytest.skip("no NFS client counters: a local cluster's shared dir is a bind mount (the kernel here has no NFS)")
    if "deployer_bench_link_gbit_s" in query.expr and not prom.query(f'deployer_bench_link_gbit_s{{run_id="{run_id}"}}'):
        pytest.xfail(f"run {run_id} measured no link rate (link: null)")
    expr, missing = dashboard.expand(query.expr, variables[query.dashboard])
    assert not missing, f"no value for ${missing} (no series behind the variable query)"
    deadline = time.monotonic() + SETTLE_S
    while True:
        rows = prom.query(expr)
        if rows or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert rows, f"{query.panel} ({query.ref_id}): no data for {expr}"
