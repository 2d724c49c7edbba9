"""The Slurm metrics helper (ansible/roles/slurm/files/slurm-metrics): node states and the
queue from sinfo and squeue, as node_exporter's textfile collector reads them.

tests/fixtures/slurm/sinfo_states.txt is sinfo's and squeue's output recorded on a real
local 2-node cluster while its nodes were put through mixed, allocated, drained, down and
back (scontrol update). promtool (Prometheus's own checker, from Debian) checks the text.
The integration test (tests/integration/test_slurm.py) reads the same series from the
cluster's Prometheus.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "ansible" / "roles" / "slurm" / "files" / "slurm-metrics"


def _load():
    loader = importlib.machinery.SourceFileLoader("slurm_metrics", str(HELPER))  # no .py suffix
    spec = importlib.util.spec_from_loader("slurm_metrics", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


metrics = _load()


def sections() -> dict[str, str]:
    out, name = {}, None
    for line in (ROOT / "tests" / "fixtures" / "slurm" / "sinfo_states.txt").read_text().splitlines():
        if line.startswith("## "):
            name = line[3:]
            out[name] = ""
        else:
            out[name] += line + "\n"
    return out


REC = sections()


@pytest.mark.parametrize(("section", "want"), [
    ("mixed (a 1-CPU job on a 2-CPU node)", {"sdev-master": "mixed", "sdev-worker-1": "idle"}),
    ("allocated", {"sdev-master": "alloc", "sdev-worker-1": "idle"}),
    ("drained", {"sdev-master": "alloc", "sdev-worker-1": "drain"}),
    ("set down while drained (sinfo still says drained)", {"sdev-master": "alloc", "sdev-worker-1": "drain"}),
    ("down", {"sdev-master": "idle", "sdev-worker-1": "down"}),
])
def test_recorded_node_states(section, want):
    assert metrics.parse_sinfo(REC[section]) == want


@pytest.mark.parametrize(("text", "state"), [
    ("idle*", "down"),  # not responding: down whatever the state word says
    ("draining", "drain"), ("completing", "alloc"), ("idle~", "idle"), ("mixed-", "mixed"),
    ("maint", "other"), ("future", "other"),
])
def test_state_words_and_suffixes(text, state):
    assert metrics.node_state(text) == state


def test_a_node_in_two_partitions_is_counted_once():
    assert metrics.parse_sinfo("n1 idle\nn1 idle\nn2 allocated\n") == {"n1": "idle", "n2": "alloc"}


def test_the_queue_counts_pending_and_running_and_zeros_stay():
    assert metrics.parse_squeue(REC["squeue"]) == {"pending": 1, "running": 1}
    assert metrics.parse_squeue("") == {"pending": 0, "running": 0}


def test_rendered_text_has_every_state_and_counts():
    text = metrics.render(metrics.parse_sinfo(REC["drained"]), metrics.parse_squeue(REC["squeue"]))
    assert 'slurm_node_state{node="sdev-worker-1",state="drain"} 1' in text
    assert 'slurm_nodes{state="drain"} 1' in text and 'slurm_nodes{state="alloc"} 1' in text
    assert 'slurm_nodes{state="down"} 0' in text and 'slurm_jobs{state="pending"} 1' in text
    assert "slurm_metrics_success 1" in text


def test_when_slurm_does_not_answer_only_the_failure_is_said():
    text = metrics.render(None, None)
    assert "slurm_metrics_success 0" in text and "slurm_nodes" not in text


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: make deps installs prometheus")
@pytest.mark.parametrize("section", ["drained", "down"])
def test_promtool_accepts_the_text(section):
    text = metrics.render(metrics.parse_sinfo(REC[section]), metrics.parse_squeue(REC["squeue"]))
    p = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_file_is_replaced_whole(tmp_path):
    out = tmp_path / "slurm.prom"
    out.write_text("old\n")
    metrics.write_atomically(str(out), "slurm_metrics_success 1\n")
    assert out.read_text() == "slurm_metrics_success 1\n" and [p.name for p in tmp_path.iterdir()] == ["slurm.prom"]
