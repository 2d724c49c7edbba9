"""The report schema: what the bench writes is checked; other versions are refused clearly."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from deployer.bench import report as bench_report
from deployer.bench import schema as bench_schema
from deployer.errors import RecordError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "results_local_3node.json"


def test_a_report_the_bench_wrote_loads():
    # Recorded with schema 1 (before `network`): still readable.
    r = bench_schema.load(FIXTURE)
    assert r["schema"] == 1 and [x["nodes"] for x in r["results"]] == [1, 2, 3] and r["network"] is None


def test_aggregate_builds_a_valid_current_report(tmp_path):
    run = {"world_size": 2, "img_per_sec": 90.0, "img_per_sec_per_rank": 45.0, "mode": "dp", "model": "resnet18"}
    one = {**run, "world_size": 1, "img_per_sec": 50.0, "img_per_sec_per_rank": 50.0}
    rep = bench_report.aggregate("r1", [(1, one), (2, run)], [], 9.4, {"torch": "2.13.0"})
    rep = bench_report.write_files(rep, tmp_path)
    again = bench_schema.load(tmp_path / "results.json")
    assert again == rep and again["schema"] == bench_schema.SCHEMA


def test_a_malformed_report_is_refused_before_any_file(tmp_path):
    rep = bench_report.aggregate("r1", [], [], None, {})
    rep["results"] = [{"nodes": 0}]
    with pytest.raises(ValidationError, match="results.0.ranks"):
        bench_report.write_files(rep, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content, fragment", [
    ('{"schema": 9, "run_id": "x"}', "schema 9 is not one of (1, 2, 3, 4, 5, 6, 7)"),
    ('{"schema": 2', "not a readable benchmark report"),
    ('{"schema": 2, "run_id": "x"}', "results: Field required"),
])
def test_other_versions_and_damage_are_one_line(tmp_path, content, fragment):
    f = tmp_path / "results.json"
    f.write_text(content)
    with pytest.raises(RecordError) as e:
        bench_schema.load(f)
    assert fragment in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)
    json.dumps(str(e.value))
