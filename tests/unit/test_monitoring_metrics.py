"""deployer.bench.metrics: benchmark results as deployer_bench_* series, pushed to a real Pushgateway.

The push tests start prometheus-pushgateway (Debian/Ubuntu package of that name) on
127.0.0.1 with a free port; they are skipped when the binary is not installed.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployer.bench import metrics
from deployer.errors import OperationFailed

PUSHGATEWAY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")

RESULT = {
    "run_id": "20250101T120000Z",
    "results": [
        {"nodes": 1, "ranks": 1, "img_per_sec": 50.0, "img_per_sec_per_rank": 50.0, "efficiency": 1.0},
        {"nodes": 2, "ranks": 2, "img_per_sec": 95.0, "img_per_sec_per_rank": 47.5, "efficiency": 0.95},
        {"nodes": 2, "ranks": 2, "img_per_sec": 99.0, "img_per_sec_per_rank": 49.5, "efficiency": 0.99, "mode": "ensemble"},
    ],
    "allreduce": [
        {"nodes": 2, "bytes": 1024, "time_us": 120.0, "algbw_gb_s": 0.0085, "busbw_gb_s": 0.0085, "wrong": 0},
        {"nodes": 2, "bytes": 1048576, "time_us": 9000.0, "algbw_gb_s": 0.1165, "busbw_gb_s": 0.1165, "wrong": 0},
    ],
    "link": {"tool": "iperf3", "gbit_s": 9.4},
    "versions": {"model": "resnet50", "mode": "data-parallel", "torch": "2.3.1", "python": "3.11.2"},
}


def samples(registry_or_text) -> dict[tuple[str, tuple], float]:
    if isinstance(registry_or_text, str):
        families = text_string_to_metric_families(registry_or_text)
    else:
        families = registry_or_text.collect()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_registry_has_every_series_with_labels():
    got = samples(metrics.bench_registry(RESULT, now=1700000000.0))
    dp = (("mode", "data-parallel"), ("model", "resnet50"))
    assert got[("deployer_bench_img_per_sec", (("mode", "data-parallel"), ("model", "resnet50"), ("nodes", "2")))] == 95.0
    assert got[("deployer_bench_img_per_sec", (("mode", "ensemble"), ("model", "resnet50"), ("nodes", "2")))] == 99.0
    assert got[("deployer_bench_img_per_sec_per_rank", (("mode", "data-parallel"), ("model", "resnet50"), ("nodes", "1")))] == 50.0
    assert got[("deployer_bench_efficiency", (("mode", "data-parallel"), ("model", "resnet50"), ("nodes", "2")))] == 0.95
    assert got[("deployer_bench_ranks", (("mode", "data-parallel"), ("model", "resnet50"), ("nodes", "2")))] == 2
    assert got[("deployer_bench_allreduce_busbw_gb_s", (("bytes", "1048576"), ("nodes", "2")))] == 0.1165
    assert got[("deployer_bench_allreduce_algbw_gb_s", (("bytes", "1024"), ("nodes", "2")))] == 0.0085
    assert got[("deployer_bench_allreduce_time_us", (("bytes", "1024"), ("nodes", "2")))] == 120.0
    assert got[("deployer_bench_allreduce_errors", (("bytes", "1024"), ("nodes", "2")))] == 0
    assert got[("deployer_bench_link_gbit_s", (("tool", "iperf3"),))] == 9.4
    assert got[("deployer_bench_run_timestamp_seconds", dp)] == 1700000000.0
    info = [k for k in got if k[0] == "deployer_bench_info"]
    assert info and dict(info[0][1])["torch"] == "2.3.1"
    # run_id is the Pushgateway grouping key, not a metric label (they would conflict).
    assert all("run_id" not in dict(labels) for _, labels in got)


def test_missing_parts_are_left_out_not_zero():
    result = {"run_id": "r1", "results": [{"nodes": 1, "ranks": 1, "img_per_sec": 10.0, "img_per_sec_per_rank": 10.0,
                                           "efficiency": None}],
              "allreduce": [], "link": None, "versions": {}}
    names = {name for name, _ in samples(metrics.bench_registry(result))}
    assert "deployer_bench_efficiency" not in names
    assert "deployer_bench_link_gbit_s" not in names
    assert "deployer_bench_img_per_sec" in names and "deployer_bench_run_timestamp_seconds" in names


def test_timestamp_from_result_wins():
    got = samples(metrics.bench_registry({**RESULT, "timestamp": 1234.5}, now=99.0))
    assert [v for (n, _), v in got.items() if n == "deployer_bench_run_timestamp_seconds"] == [1234.5]


def test_version_keys_become_valid_label_names():
    got = samples(metrics.bench_registry({**RESULT, "versions": {"nccl-version": "2.18", "job": "x", "2x": "y"}}))
    (labels,) = [dict(lb) for n, lb in got if n == "deployer_bench_info"]
    assert labels == {"nccl_version": "2.18", "v_job": "x", "v_2x": "y"}


def test_info_carries_the_versions_of_a_report_the_bench_wrote():
    # tests/fixtures/bench/results_local_3node.json: results.json of the default
    # `deployer bench --nodes 1,2,3` on a local 3-node cluster; record a new one with
    # `scripts/bench_default_sweep.py --save-fixture tests/fixtures/bench/results_local_3node.json`.
    import json
    from pathlib import Path

    report = json.loads((Path(__file__).resolve().parents[1] / "fixtures/bench/results_local_3node.json").read_text())
    got = samples(metrics.bench_registry(report))
    (labels,) = [dict(lb) for n, lb in got if n == "deployer_bench_info"]
    assert labels["torch"] == "2.13.0+cpu" and labels["mpi"].startswith("Open MPI v4.1")
    assert labels["mpi4py"] == "4.1.2" and labels["python"] == "3.11.2"
    assert labels["allreduce_library"] == "gloo" and labels["provider"] == "local"
    assert labels["profile"] == "quick" and labels["threads"] == "1"
    assert ("deployer_bench_img_per_sec", (("mode", "dp"), ("model", "resnet18"), ("nodes", "3"))) in got


def test_run_id_is_required():
    with pytest.raises(ValueError):
        metrics.bench_registry({"results": []})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_gateway_is_one_line_operation_failed():
    with pytest.raises(OperationFailed) as e:
        metrics.push_bench_results(f"http://127.0.0.1:{_free_port()}", RESULT, timeout=2)
    assert "Pushgateway" in str(e.value) and "\n" not in str(e.value)


@pytest.fixture
def pushgateway(tmp_path):
    if PUSHGATEWAY is None:
        pytest.skip("prometheus-pushgateway not installed (apt-get install prometheus-pushgateway)")
    port = _free_port()
    proc = subprocess.Popen([PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{port}",
                             f"--persistence.file={tmp_path / 'pg.data'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("prometheus-pushgateway did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        return r.read().decode()


def test_push_shows_series_on_the_gateway(pushgateway):
    metrics.push_bench_results(pushgateway, RESULT)
    got = samples(scrape(pushgateway))
    key = ("deployer_bench_img_per_sec", (("instance", ""), ("job", "deployer_bench"), ("mode", "data-parallel"),
                                          ("model", "resnet50"), ("nodes", "2"), ("run_id", RESULT["run_id"])))
    assert got[key] == 95.0
    bus = [v for (n, lb), v in got.items() if n == "deployer_bench_allreduce_busbw_gb_s" and ("bytes", "1048576") in lb]
    assert bus == [0.1165]
    assert any(n == "deployer_bench_run_timestamp_seconds" for n, _ in got)
    assert any(n == "deployer_bench_link_gbit_s" for n, _ in got)


def test_runs_do_not_overwrite_each_other_and_repush_replaces(pushgateway):
    metrics.push_bench_results(pushgateway, RESULT)
    second = {**RESULT, "run_id": "20250102T120000Z", "results": RESULT["results"][:1], "allreduce": [], "link": None}
    metrics.push_bench_results(pushgateway, second)
    got = samples(scrape(pushgateway))
    runs = {dict(lb)["run_id"] for n, lb in got if n == "deployer_bench_img_per_sec"}
    assert runs == {RESULT["run_id"], second["run_id"]}
    # Re-pushing a run replaces its group: the link rate it no longer has is gone.
    metrics.push_bench_results(pushgateway, {**RESULT, "link": None})
    got = samples(scrape(pushgateway))
    assert not [lb for n, lb in got if n == "deployer_bench_link_gbit_s"]
    assert {dict(lb)["run_id"] for n, lb in got if n == "deployer_bench_img_per_sec"} == runs
