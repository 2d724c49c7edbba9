"""The health timer's own program (benchmarks/node_health.py), run here on recorded outputs
(tests/fixtures/gpu/health/health-timer/README.md names each source) and on a node's
files made in a temporary directory: its GPU readings, its Slurm policy (two failures in a
row, only its own drains resumed), the series it writes, and a check that hangs."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests" / "fixtures" / "gpu" / "health"
TIMER = GPU / "health-timer"


def _health():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("node_health", ROOT / "benchmarks" / "node_health.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nh = _health()


def test_row_remap_xid_warns_and_names_it():
    got = nh.xid_findings((TIMER / "kernel_xid-63_row-remap_stas00.txt").read_text())
    assert got["status"] == "warn"
    assert got["detail"].startswith("Xid 63 since the last run")
    assert got["value"]["xids"][0]["bus"] == "0000:10:1c"


def test_a_fatal_xid_among_application_ones_fails():
    got = nh.xid_findings((TIMER / "syslog_xid-32-69-62_kohsuke-gist.txt").read_text())
    assert got["status"] == "fail"
    assert got["detail"].startswith("Xid 62 since the last run (GPU 0000:01:00: 0096(1c54)")
    assert [x["xid"] for x in got["value"]["xids"]] == [32, 69, 69, 62]


def test_a_gpu_fallen_off_the_bus_without_an_xid_line_fails():
    got = nh.xid_findings((TIMER / "kernel_fallen-off-bus_570_nvsentinel-155.txt").read_text())
    assert got["status"] == "fail"
    assert got["value"]["off_bus"] == ["0000:b3:00.0"]
    assert "fell off the bus" in got["detail"]


def test_the_xid_79_line_is_fallen_off_the_bus_too():
    # The line NVSentinel #155's reporter gives as the Xid form of the same event.
    got = nh.xid_findings("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n")
    assert got["status"] == "fail" and got["value"]["off_bus"] == ["0000:44:00"]


def test_no_kernel_message_passes():
    assert nh.xid_findings("")["status"] == "pass"


@pytest.mark.parametrize(("fixture", "count"), [
    ("nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt", 8),
    ("nvidia-smi-q_a100-sxm4-40gb-x8_healthy_460.txt", 8),
    ("nvidia-smi-q_v100-pcie-16gb-x4_healthy_legacy-ecc.txt", 4),
])
def test_healthy_gpus_pass(fixture, count):
    got = nh.ecc_findings((GPU / fixture).read_text(), count)
    assert got["status"] == "pass", got["detail"]
    assert got["value"]["gpus"] == count


def test_a_missing_gpu_fails():
    got = nh.ecc_findings((GPU / "nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt").read_text(), 9)
    assert got["status"] == "fail" and got["detail"].startswith("8 of 9 GPU(s) answer")


def test_a_pending_row_remap_warns():
    got = nh.ecc_findings((GPU / "nvidia-smi-q_a100-sxm4-80gb-x4_remap-pending.txt").read_text(), 4)
    assert got["status"] == "warn" and "row remap waits for a GPU reset" in got["detail"]


def test_volatile_uncorrectable_ecc_fails():
    # The published excerpt is the ECC block alone: a GPU line is put over it to read it.
    text = "GPU 00000000:07:00.0\n" + (GPU / "nvidia-smi-q_excerpt_ecc-sram-uncorrectable.txt").read_text()
    got = nh.ecc_findings(text, 1)
    assert got["status"] == "fail"
    assert got["detail"] == "GPU 00000000:07:00.0: 1 uncorrectable ECC error(s) since the driver loaded"


def test_rev_ff_in_lspci_is_off_the_bus():
    healthy = (GPU / "lspci-vvv_h100-sxm-x8_gpu-stanzas_healthy.txt").read_text()
    assert nh.off_bus_in_lspci(healthy) == []
    first = healthy.splitlines()[0]
    gone = first.replace(first[first.index("(rev"):first.index(")", first.index("(rev")) + 1], "(rev ff)")
    assert nh.off_bus_in_lspci(gone) == [first.split()[0]]


def test_dcgm_health_healthy_passes():
    got = nh.dcgm_health_findings((TIMER / "dcgmi-health-c-j_healthy_virtualclient.json").read_text())
    assert got["status"] == "pass" and got["detail"] == "DCGM: Healthy"


def test_dcgm_health_failure_names_the_incident():
    # No unhealthy `dcgmi health -c -j` was found recorded: this document is built the way
    # NVIDIA/DCGM dcgmi/Health.cpp CheckWatches builds it (README.md of the fixtures).
    doc = {"body": {"Overall Health": {"value": "Failure"},
                    "GPU": {"children": {"0": {"value": "Failure", "children": {"Errors": {"children": {
                        "Memory system": {"value": "Failure",
                                          "overflow": ["A DBE error occurred on GPU 0"]}}}}}}}},
           "header": ["Health Monitor Report"]}
    got = nh.dcgm_health_findings(json.dumps(doc))
    assert got["status"] == "fail"
    assert got["detail"] == "DCGM: Failure: A DBE error occurred on GPU 0"


def test_dcgm_health_without_watches_is_skipped_once():
    got = nh.dcgm_health_findings("Error: Health watches not enabled. Please enable watches. \n")
    assert got["status"] == "skip"


@pytest.mark.parametrize(("verdict", "consecutive", "state", "reason", "action"), [
    ("fail", 1, "IDLE", "", None),  # once is not enough
    ("fail", 2, "IDLE", "", "drain"),
    ("fail", 2, "MIXED", "", "drain"),
    ("fail", 3, "IDLE+DRAIN", "deployer health: shared_dir: gone", None),  # already drained
    ("pass", 0, "IDLE+DRAIN", "deployer health: shared_dir: gone", "resume"),
    ("warn", 0, "IDLE+DRAIN", "deployer health: shared_dir: gone", "resume"),
    ("pass", 0, "IDLE+DRAIN", "maintenance: new PSU", None),  # an administrator's drain
    ("fail", 5, "IDLE+DRAIN", "maintenance: new PSU", None),
    ("pass", 0, "IDLE", "", None),
])
def test_slurm_policy(verdict, consecutive, state, reason, action):
    assert nh.slurm_action(verdict, consecutive, state, reason) == action


def test_slurm_node_reads_state_and_reason(monkeypatch):
    line = ("NodeName=demo-worker-1 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 "
            "Reason=deployer health: shared_dir: /shared is not mounted [root@2026-11-27T10:00:00] Comment=(null)")
    monkeypatch.setattr(nh, "run", lambda argv, timeout: (0, line))
    assert nh.slurm_node("demo-worker-1", 5) == ("IDLE+DRAIN", "deployer health: shared_dir: /shared is not mounted")


def test_a_check_that_hangs_fails_by_name():
    t0 = time.monotonic()
    got = nh.bounded("shared_dir", lambda: time.sleep(30), 0.2)
    assert time.monotonic() - t0 < 2
    assert got == [{"check": "shared_dir", "status": "fail", "detail": "no answer in 0 s (a hung mount or device)"}]


def test_a_run_writes_the_series_and_counts_failures(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()  # a directory, not a mount: shared_dir fails
    monkeypatch.setattr(nh, "check_runtime", lambda timeout: nh.result("runtime", "pass", "ok"))
    monkeypatch.setattr(nh, "check_clock", lambda timeout: nh.result("clock", "pass", "ok"))
    args = ["--shared", str(shared), "--state", str(tmp_path / "state"), "--textfile", str(tmp_path / "tf" / "h.prom"),
            "--interval", "20"]
    nh.main(args)
    nh.main(args)
    last = json.loads((tmp_path / "state" / "last.json").read_text())
    assert last["verdict"] == "fail" and last["consecutive_failures"] == 2
    assert last["reason"].startswith(f"shared_dir: {shared} is not mounted")
    prom = (tmp_path / "tf" / "h.prom").read_text()
    assert 'deployer_health_check_status{check="shared_dir"} 2' in prom
    assert "deployer_health_consecutive_failures 2" in prom
    assert "deployer_health_interval_seconds 20" in prom
    assert "deployer_health_failing 1" in prom
    assert f"deployer_health_failing_since_timestamp_seconds {last['failing_since']:g}" in prom or \
        "deployer_health_failing_since_timestamp_seconds " in prom


def test_a_gpu_nodes_run_reads_each_tool_once(monkeypatch):
    """The GPU checks wired to their commands (recorded outputs for each): a healthy H100
    node with an Xid 62 in the kernel log since the last run, DCGM's watches off at first."""
    smi = (GPU / "nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt").read_text()
    kernel = (TIMER / "syslog_xid-32-69-62_kohsuke-gist.txt").read_text()
    calls = []

    def fake_run(argv, timeout):
        calls.append(argv)
        if argv[0] == "nvidia-smi":
            return 0, smi
        if argv[0] == "journalctl":
            return 0, kernel
        if argv[:3] == ["dcgmi", "health", "-c"]:
            return 255, "Error: Health watches not enabled. Please enable watches. \n"
        return 0, ""

    monkeypatch.setattr(nh, "run", fake_run)
    monkeypatch.setattr(nh.node_check, "lspci_gpus", lambda timeout: "")
    monkeypatch.setattr(nh.shutil, "which", lambda name: f"/usr/bin/{name}")
    got = {f["check"]: f for f in nh.check_gpu_health(8, since=1_795_000_000, timeout=5)}
    assert got["gpus"]["status"] == "pass"
    assert got["xid"]["status"] == "fail" and got["xid"]["detail"].startswith("Xid 62")
    assert got["dcgm_health"]["status"] == "skip"
    assert ["journalctl", "-k", "-q", "--no-pager", "-o", "short-iso", "--since", "@1795000000"] in calls
    assert ["dcgmi", "health", "-s", "a"] in calls  # the watches on, for the next run


# The node's reading of `nvidia-smi -q` is a copy of deployer/gpu_facts.py's: the health
# program runs on nodes with the standard library alone, where the deployer package is not
# installed (a wheel ships only benchmarks/ to the roles). This holds the two together.
@pytest.mark.parametrize("fixture", sorted(p.name for p in GPU.glob("nvidia-smi-q*.txt")) +
                         sorted(f"../{p.name}" for p in GPU.parent.glob("nvidia-smi-q*.txt")))
def test_the_node_reads_nvidia_smi_as_the_controller_does(fixture):
    import node_health_gpu  # on sys.path beside node_health (_health above)

    from deployer.gpu_facts import smi_gpus

    text = (GPU / fixture).read_text()
    assert node_health_gpu.smi_sections(text) == smi_gpus(text)
