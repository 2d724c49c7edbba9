"""Grafana dashboards and provisioning files: valid, stable, wired to the "prometheus" data source."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from deployer.bench import metrics
from tests import dashboard_checks as dashboard

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "monitoring" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DS = {"type": "prometheus", "uid": "prometheus"}
# uids are part of the contract: links, bookmarks and the deployer's own checks use them.
EXPECTED_UIDS = {"cluster": "deployer-cluster", "gpu": "deployer-gpu", "benchmarks": "deployer-benchmarks"}
BUILTIN_VARS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_the_three_dashboards_exist_with_stable_unique_uids():
    uids = {p.stem: load(p)["uid"] for p in DASHBOARDS}
    assert uids == EXPECTED_UIDS
    titles = [load(p)["title"] for p in DASHBOARDS]
    assert len(set(titles)) == len(titles)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_provisionable(path):
    d = load(path)
    assert d["id"] is None, "provisioned dashboards carry no database id"
    assert 36 <= d["schemaVersion"] <= 41
    assert "deployer" in d["tags"]
    assert d["editable"] is False
    ids = [p["id"] for p in dashboard.iter_panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_panel_queries_prometheus_by_uid(path):
    d = load(path)
    panels = [p for p in dashboard.iter_panels(d) if p["type"] != "row"]
    assert panels
    for p in panels:
        assert p["datasource"] == DS, p["title"]
        assert p["targets"], f"{p['title']}: no targets"
        for t in p["targets"]:
            assert t["datasource"] == DS, p["title"]
            assert t["expr"].strip(), f"{p['title']}: empty expr"
            assert t["refId"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert p["title"] and p.get("description"), "every panel says what it shows"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panels_fit_the_grid_without_overlapping(path):
    boxes = []
    for p in load(path)["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        boxes.append((g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"], p["title"]))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
            assert not overlap, f"{a[4]!r} overlaps {b[4]!r}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_variables_are_defined_and_use_the_prometheus_uid(path):
    d = load(path)
    defined = set(BUILTIN_VARS)
    for var in d["templating"]["list"]:
        assert var["datasource"] == DS, var["name"]
        # A variable may only use variables defined before it.
        _, missing = dashboard.expand(var["query"], {v: "x" for v in defined})
        assert not missing, f"${var['name']} uses undefined {missing}"
        defined.add(var["name"])
    for q in dashboard.panel_queries(d):
        _, missing = dashboard.expand(q.expr, {v: "x" for v in defined})
        assert not missing, f"{q.panel}: undefined variables {missing}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_benchmark_runs_are_annotated(path):
    annotations = load(path)["annotations"]["list"]
    runs = [a for a in annotations if a["name"] == "Benchmark runs"]
    assert len(runs) == 1
    a = runs[0]
    assert a["datasource"] == DS
    assert "deployer_bench_run_timestamp_seconds" in a["target"]["expr"]
    assert "* 1000" in a["target"]["expr"] and a["useValueForTime"] is True, "the value is the time, in ms"


def test_gpu_dashboard_shows_utilisation_memory_power_temperature():
    exprs = " ".join(q.expr for q in dashboard.panel_queries(load(GRAFANA / "dashboards" / "gpu.json")))
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
                   "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        assert metric in exprs
    # Which panels a vGPU leaves empty, and that they say so: tests/unit/test_dcgm_role.py.


def test_cluster_dashboard_shows_cpu_memory_disk_network():
    exprs = " ".join(q.expr for q in dashboard.panel_queries(load(GRAFANA / "dashboards" / "cluster.json")))
    for metric in ("node_cpu_seconds_total", "node_memory_MemAvailable_bytes", "node_filesystem_avail_bytes",
                   "node_network_receive_bytes_total", "node_network_transmit_bytes_total"):
        assert metric in exprs


def test_benchmark_dashboard_reads_only_series_metrics_py_pushes():
    sample = {"run_id": "r", "results": [{"nodes": 1, "ranks": 1, "img_per_sec": 1, "img_per_sec_per_rank": 1, "efficiency": 1}],
              "allreduce": [{"nodes": 2, "bytes": 8, "time_us": 1, "algbw_gb_s": 1, "busbw_gb_s": 1, "wrong": 0}],
              "link": {"tool": "iperf3", "gbit_s": 1}, "versions": {"model": "resnet50", "mode": "data-parallel"}}
    training = {"run_id": "t", "results": [], "allreduce": [], "training": {"dataset": "digits", "target_acc": 0.9, "runs": [
        {"nodes": 1, "model": "resnet18", "time_to_target_s": 9, "final_top1": 0.91, "compute_img_per_sec": 200,
         "loading_cost": 0.1, "read_mb_per_s": 0.01, "storage": {"nfs_clients_mb_per_s": 1, "master_disk_mb_per_s": 0}}]}}
    pushed = {m.name for r in (sample, training) for m in metrics.bench_registry(r).collect()}
    used = set()
    for path in DASHBOARDS:
        text = path.read_text()
        used |= set(re.findall(r"deployer_bench_[a-z0-9_]+", text))
    assert used, "the benchmarks dashboard reads deployer_bench_* series"
    assert used <= pushed, f"dashboards read series nothing pushes: {sorted(used - pushed)}"
    bench = " ".join(q.expr for q in dashboard.panel_queries(load(GRAFANA / "dashboards" / "benchmarks.json")))
    for metric in ("deployer_bench_img_per_sec", "deployer_bench_efficiency", "deployer_bench_allreduce_busbw_gb_s"):
        assert metric in bench


# ------------------------------------------------------------------------- provisioning


def test_provisioning_yaml_parses():
    files = sorted((GRAFANA / "provisioning").rglob("*.yml"))
    assert {f.parent.name for f in files} == {"datasources", "dashboards"}
    for f in files:
        doc = yaml.safe_load(f.read_text())
        assert doc["apiVersion"] == 1, f


def test_datasource_has_the_uid_the_dashboards_use():
    doc = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "deployer.yml").read_text())
    (ds,) = doc["datasources"]
    assert ds["uid"] == "prometheus" and ds["type"] == "prometheus" and ds["isDefault"] is True
    # Filled by the grafana role's systemd drop-in; see its template.
    assert ds["url"] == "${DEPLOYER_PROMETHEUS_URL}"
    dropin = (REPO / "ansible/roles/grafana/templates/grafana-server.deployer.conf.j2").read_text()
    assert "Environment=DEPLOYER_PROMETHEUS_URL=" in dropin


def test_dashboard_provider_reads_where_the_role_copies():
    doc = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "deployer.yml").read_text())
    (provider,) = doc["providers"]
    defaults = yaml.safe_load((REPO / "ansible/roles/grafana/defaults/main.yml").read_text())
    assert provider["options"]["path"] == defaults["grafana_dashboards_dir"]
    assert provider["type"] == "file"
    assert (GRAFANA / "dashboards" / defaults["grafana_home_dashboard"]).is_file()
