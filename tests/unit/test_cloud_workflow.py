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
           "EXTERNAL_NETWORK": "public", "ADMIN_CIDR": "198.51.100.7/32", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    spec = build_spec(tmp_path / "cluster.yaml")
    assert (spec.name, spec.provider, spec.nodes, spec.ttl, spec.openstack.cloud) == ("e2e-12345678901", "openstack", 2, "2h", "e2e")
    # Issue 43, item 9: set, so the preflight never has to guess a runner's address behind its NAT.
    assert str(spec.openstack.admin_cidr) == "198.51.100.7/32"


def _egress(tmp_path: Path, says: str | None, given: str = "") -> tuple[subprocess.CompletedProcess, str]:
    """The egress step with a stand-in curl answering `says` (None: it fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    curl = bin_dir / "curl"
    curl.write_text("#!/bin/sh\nexit 7\n" if says is None else f"#!/bin/sh\nprintf '%s' '{says}'\n")
    curl.chmod(0o755)
    env_file = tmp_path / "github_env"
    env_file.write_text("")
    env = {"ADMIN_CIDR_GIVEN": given, "GITHUB_ENV": str(env_file), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    r = subprocess.run(["bash", "-e", "-c", _step("egress")["run"]], env=env, capture_output=True, text=True)
    return r, env_file.read_text()


def test_admin_cidr_is_the_runners_egress_address_or_the_one_given(tmp_path):
    """Issue 43, item 9: the cluster spec's admin_cidr comes from this step (the runner's
    egress address as /32, or the input / repository variable), before `up` runs."""
    assert "${ADMIN_CIDR}" in next(s for s in _steps() if s.get("name") == "Cluster spec")["run"]
    names = [s.get("id") or s.get("name") for s in _steps()]
    assert names.index("egress") < names.index("Cluster spec") < names.index("up")
    assert _step("egress")["env"]["ADMIN_CIDR_GIVEN"] == "${{ inputs.admin_cidr || vars.OPENSTACK_ADMIN_CIDR }}"
    r, env = _egress(tmp_path, "20.42.7.9")
    assert r.returncode == 0 and env == "ADMIN_CIDR=20.42.7.9/32\n", r.stderr
    r, env = _egress(tmp_path, "20.42.7.9", given="203.0.113.0/24")
    assert r.returncode == 0 and env == "ADMIN_CIDR=203.0.113.0/24\n"
    for wrong in ("<html>rate limited</html>", None, "2001:db8::1"):
        r, env = _egress(tmp_path, wrong)
        assert r.returncode != 0 and env == "" and "set the admin_cidr input or the OPENSTACK_ADMIN_CIDR variable" in r.stdout


@pytest.mark.parametrize("step_id", ["sweep", "up", "status", "bench", "down"])
def test_the_flags_it_passes_exist(step_id):
    run = _step(step_id)["run"]
    for verb, flags in re.findall(r"deployer (\w+)((?: --?[\w-]+(?: \"?\$?\w+\"?| \d+h)?)*)", run):
        help_text = subprocess.run([sys.executable, "-m", "deployer", verb, "--help"], capture_output=True, text=True).stdout
        for flag in re.findall(r"--[\w-]+", flags):
            assert flag in help_text, f"deployer {verb} has no {flag}"
