"""deployer.bench.report: the formulas by hand, the --json schema, the files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from rich.console import Console

from deployer.bench import report as br

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_efficiency_by_hand():
    # 4 nodes at 360 img/s against 1 node at 100 img/s: 360 / (4 * 100) = 0.9
    assert br.efficiency(360.0, 4, 100.0) == pytest.approx(0.9)
    assert br.efficiency(100.0, 1, 100.0) == pytest.approx(1.0)
    # superlinear is reported as it is, not clipped
    assert br.efficiency(250.0, 2, 100.0) == pytest.approx(1.25)
    with pytest.raises(ValueError):
        br.efficiency(1.0, 0, 1.0)
    with pytest.raises(ValueError):
        br.efficiency(1.0, 2, 0.0)


def test_busbw_by_hand():
    # nccl-tests: busbw = algbw * 2(n-1)/n
    assert br.busbw(3.0, 2) == pytest.approx(3.0)  # factor 1
    assert br.busbw(3.0, 3) == pytest.approx(4.0)  # factor 4/3
    assert br.busbw(1.0, 8) == pytest.approx(1.75)  # factor 14/8
    assert br.busbw(5.0, 1) == 0.0  # one rank moves nothing over a bus
    with pytest.raises(ValueError):
        br.busbw(1.0, 0)


def test_comm_share_and_link_units():
    assert br.comm_share(75.0, 100.0) == pytest.approx(0.25)
    assert br.comm_share(100.0, 100.0) == pytest.approx(0.0)
    assert br.gbit_to_gbyte(10.0) == pytest.approx(1.25)


def resnet_run(world: int, total: float, mode: str = "dp") -> dict:
    return {"benchmark": "resnet_synthetic", "model": "resnet50", "mode": mode, "batch_size": 32,
            "image_size": 224, "world_size": world, "img_per_sec": total, "img_per_sec_per_rank": total / world,
            "versions": {"torch": "2.13.0+cpu"}}


def allreduce_run(n: int) -> dict:
    rows = []
    for size in (1024, 1 << 20, 64 << 20):
        t_us = 50.0 + size / 1.0e3  # ~1 GB/s plus latency
        algbw = size / 1e9 / (t_us / 1e6)
        rows.append({"bytes": size, "count": size // 4, "type": "float", "time_us": t_us,
                     "algbw_gb_s": algbw, "busbw_gb_s": br.busbw(algbw, n), "wrong": 0})
    return {"benchmark": "allreduce", "world_size": n, "rows": rows, "avg_busbw_gb_s": 1.0, "wrong": 0}


@pytest.fixture
def report():
    resnet = [(1, resnet_run(1, 100.0)), (2, resnet_run(2, 190.0)), (3, resnet_run(3, 270.0)),
              (3, resnet_run(3, 300.0, "ensemble"))]
    return br.aggregate("20250101-000000", resnet, [(3, allreduce_run(3))], link_gbit_s=10.0,
                        versions={"provider": "local"}, link_bidir_gbit_s=5.0)


def test_aggregate_schema_and_figures(report):
    assert report["schema"] == 7
    assert set(report) == {"schema", "run_id", "results", "allreduce", "link", "network", "files", "versions", "reference"}
    assert report["reference"] is None  # a CPU run: no GPU to set against NVIDIA's figures
    assert [r["nodes"] for r in report["results"]] == [1, 2, 3]  # ensemble run is not a row
    for row in report["results"]:
        assert {"nodes", "ranks", "img_per_sec", "img_per_sec_per_rank", "efficiency"} <= set(row)
    three = report["results"][2]
    assert three["efficiency"] == pytest.approx(270.0 / (3 * 100.0))
    assert three["ensemble_img_per_sec"] == 300.0
    assert three["comm_share"] == pytest.approx(0.1)
    assert "comm_share" not in report["results"][1]
    assert report["allreduce"][0].keys() == {"nodes", "bytes", "time_us", "algbw_gb_s", "busbw_gb_s", "wrong"}
    assert report["allreduce"][0]["nodes"] == 3
    assert report["link"] == {"tool": "iperf3", "gbit_s": 10.0, "bidir_gbit_s": 5.0}
    json.dumps(report)  # serialisable as it stands


def test_efficiency_baseline_without_one_node():
    rep = br.aggregate("r", [(2, resnet_run(2, 200.0)), (4, resnet_run(4, 360.0))])
    # T_1 estimated as T_2 / 2 = 100: E(4) = 360 / (4 * 100)
    assert [r["efficiency"] for r in rep["results"]] == pytest.approx([1.0, 0.9])
    assert rep["results"][0]["baseline_nodes"] == 2
    assert rep["link"] is None and rep["allreduce"] == []


def test_write_files(report, tmp_path):
    br.write_files(report, tmp_path / "out")
    files = report["files"]
    assert (
        set(files) == {"json", "csv", "plots", "timeline", "nccl_logs", "job_scripts"}
        and files["timeline"] is None
        and files["nccl_logs"] is None
    )
    assert files["job_scripts"] == []  # only --via slurm saves job scripts
    on_disk = json.loads(Path(files["json"]).read_text())
    assert on_disk["files"] == files and on_disk["results"] == report["results"]
    rows = list(csv.DictReader(Path(files["csv"]).read_text().splitlines()))
    assert [r["kind"] for r in rows] == ["scaling"] * 3 + ["allreduce"] * 3
    assert float(rows[2]["comm_share"]) == pytest.approx(0.1)
    names = sorted(p.rsplit("/", 1)[1] for p in files["plots"])
    assert names == ["busbw.png", "efficiency.png", "throughput.png"]
    for p in files["plots"]:
        assert Path(p).read_bytes()[:8] == PNG_MAGIC


def test_tables_render(report):
    console = Console(width=140, record=True)
    console.print(br.results_table(report))
    console.print(br.allreduce_table(report))
    text = console.export_text()
    assert "90.0%" in text  # efficiency of 3 nodes
    assert "10.0%" in text  # comm share at 3 nodes
    assert "link 1.25 GB/s" in text and "0.62 GB/s each way" in text
    assert "107%" in text and "213%" in text  # 1.33 GB/s busbw against 1.25 and 0.625
