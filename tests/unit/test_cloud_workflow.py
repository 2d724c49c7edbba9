"""The weekly real-cloud workflow (.github/workflows/cloud-e2e.yml) cannot run here (no
cloud): it is checked against GitHub's workflow schema (check-jsonschema's vendored
copy, offline), every `run:` script with `bash -n`, the spec it writes with the
deployer's own validation, and the flags it passes with each verb's --help."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deployer.spec import build_spec

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "cloud-e2e.yml"
CHECK_JSONSCHEMA = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
EXPR = re.compile(r"\$\{\{.*?\}\}")


def _workflow() -> dict:
    return yaml.load(WORKFLOW.read_text(), Loader=yaml.BaseLoader)  # BaseLoader: `on` stays a string key


def _steps() -> list[dict]:
    return _workflow()["jobs"]["e2e"]["steps"]


def _step(step_id: str) -> dict:
    return next(s for s in _steps() if s.get("id") == step_id)


@pytest.mark.skipif(CHECK_JSONSCHEMA is None, reason="check-jsonschema not installed (make deps)")
def test_the_workflow_matches_githubs_schema():
    r = subprocess.run([CHECK_JSONSCHEMA, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_weekly_and_on_demand_opt_in_and_bounded():
    wf = _workflow()
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]
    job = wf["jobs"]["e2e"]
    assert job["if"] == "vars.OPENSTACK_E2E == 'true'", "forks without a cloud run nothing"
    assert int(job["timeout-minutes"]) <= 180 and wf["permissions"] == {"contents": "read"}


@pytest.mark.parametrize(
    "step",
    [
        s.get("name") or s.get("id") or s.get("uses")
        for s in yaml.load(WORKFLOW.read_text(), Loader=yaml.BaseLoader)["jobs"]["e2e"]["steps"]
        if "run" in s
    ],
)
def test_every_run_script_is_valid_bash(step):
    s = next(x for x in _steps() if (x.get("name") or x.get("id") or x.get("uses")) == step)
    assert "`" not in s["run"], "a backtick in a run script runs a command (use $(...) where one is meant)"
    script = EXPR.sub("placeholder", s["run"])
    r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_teardown_and_artefacts_always_run_and_carry_no_secret():
    assert _step("down")["if"] == "always()"
    upload = next(s for s in _steps() if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    paths = upload["with"]["path"].split()
    assert "bench.json" in paths and ".deployer/*/runs/" in paths
    assert not any(part in p for p in paths for part in ("secrets", "ssh", "boot", "clouds.yaml")), paths
    assert "failure()" == next(s for s in _steps() if s.get("name") == "Name the failed stage")["if"]


def test_the_spec_it_writes_is_valid(tmp_path):
    step = next(s for s in _steps() if s.get("name") == "Cluster spec")
    env = {"CLUSTER": "e2e-12345678901", "NODES": "2", "FLAVOR": "m1.large", "IMAGE": "Ubuntu 22.04",
           "EXTERNAL_NETWORK": "public", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spec = build_spec(tmp_path / "cluster.yaml")
    assert (spec.name, spec.provider, spec.nodes, spec.ttl, spec.openstack.cloud) == ("e2e-12345678901", "openstack", 2, "2h", "e2e")


@pytest.mark.parametrize("step_id", ["sweep", "up", "status", "bench", "down"])
def test_the_flags_it_passes_exist(step_id):
    run = _step(step_id)["run"]
    for verb, flags in re.findall(r"deployer (\w+)((?: --?[\w-]+(?: \"?\$?\w+\"?| \d+h)?)*)", run):
        help_text = subprocess.run([sys.executable, "-m", "deployer", verb, "--help"], capture_output=True, text=True).stdout
        for flag in re.findall(r"--[\w-]+", flags):
            assert flag in help_text, f"deployer {verb} has no {flag}"
