"""The floors of docs/architecture.md hold: no two rooms import each other (round a circle
or straight), and bench/ and check/ share their toolkit through deployer/launch/ and
deployer/pushgateway.py, never through each other (scripts/import_floors.py reads the graph)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_floors.py"
_spec = importlib.util.spec_from_file_location("import_floors", SCRIPT)
assert _spec and _spec.loader
floors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(floors)


def test_no_room_imports_one_that_imports_it_back():
    assert floors.circles(floors.graph()) == []


def test_bench_and_check_meet_only_in_the_shared_toolkit():
    arrows = floors.graph()
    assert "deployer/bench/" not in arrows["deployer/check/"]
    assert "deployer/check/" not in arrows["deployer/bench/"]
    assert {"deployer/launch/", "deployer/pushgateway.py"} <= arrows["deployer/check/"] & arrows["deployer/bench/"]


def test_a_circle_is_found_and_fails_the_script():
    assert floors.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert floors.floors({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == {"b": 1, "a": 2, "c": 3}
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True).stdout
    assert "0 circle(s)" in out and out.startswith("floor ")
