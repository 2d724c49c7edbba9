"""`deployer check` on GPU nodes, read from recorded outputs of real machines published in
public repositories (tests/fixtures/gpu/health/README.md names each source): no GPU runs
here. nvidia-smi -q read as its tree; DCGM's diagnostics table read test by test."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.check import analyse
from deployer.check.model import Finding, NodeReport
from deployer.gpu_facts import dcgm_results, gpu_problems, pcie_links, pcie_problems, same_bus, smi_gpus

HEALTH = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "health"


def smi(name: str) -> str:
    return (HEALTH / name).read_text()


@pytest.mark.parametrize(("fixture", "count", "model"), [
    ("nvidia-smi-q_h100-80gb-hbm3-x8_healthy_565.txt", 8, "NVIDIA H100 80GB HBM3"),
    ("nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt", 8, "NVIDIA H100 80GB HBM3"),
    ("nvidia-smi-q_h100-nvl-x2_healthy.txt", 2, "NVIDIA H100 NVL"),
    ("nvidia-smi-q_l40s_healthy.txt", 1, "NVIDIA L40S"),  # idle at Gen1 of 4: not judged
    ("nvidia-smi-q_a100-sxm4-40gb-x8_healthy_460.txt", 8, "A100-SXM4-40GB"),
    ("nvidia-smi-q_v100-pcie-16gb-x4_healthy_legacy-ecc.txt", 4, "Tesla V100-PCIE-16GB"),  # Single/Double Bit ECC
])
def test_healthy_gpus_have_no_problem(fixture, count, model):
    gpus = smi_gpus(smi(fixture))
    assert len(gpus) == count and {t["Product Name"] for _, t in gpus} == {model}
    assert [gpu_problems(t) for _, t in gpus] == [[]] * count


def test_the_problems_a_node_check_names():
    remap = [gpu_problems(t) for _, t in smi_gpus(smi("nvidia-smi-q_a100-sxm4-80gb-x4_remap-pending.txt"))]
    assert remap == [[], [("warn", "a row remap is pending: reset the GPU (or reboot the node) to apply it")], [], []]
    [(_, a10)] = smi_gpus(smi("nvidia-smi-q_a10_remap-pending-uncorrectable.txt"))
    assert gpu_problems(a10) == [("warn", "a row remap is pending: reset the GPU (or reboot the node) to apply it")]
    [(_, l4)] = smi_gpus(smi("nvidia-smi-q_l4_link-width-x8-of-x16.txt"))
    assert gpu_problems(l4) == [("warn", "PCIe link x8 of x16: a card or riser seated badly, or a slot narrower than the card")]
    # The ECC block of a GPU with an SRAM error since the driver loaded (an excerpt: put under a GPU).
    [(_, sram)] = smi_gpus("GPU 00000000:07:00.0\n" + smi("nvidia-smi-q_excerpt_ecc-sram-uncorrectable.txt"))
    assert gpu_problems(sram) == [("fail", "1 uncorrectable ECC error(s) since the driver loaded")]


def _gpu_node(name: str, fixture: str) -> NodeReport:
    return NodeReport(name, [Finding("gpus", "pass", "nvidia-smi answered", {"smi_q": smi(fixture)})])


def test_gpu_nodes_against_the_cluster_and_each_other():
    nodes = [_gpu_node("a", "nvidia-smi-q_h100-80gb-hbm3-x8_healthy_565.txt"),
             _gpu_node("b", "nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt"),
             _gpu_node("c", "nvidia-smi-q_h100-nvl-x2_healthy.txt"),
             _gpu_node("d", "nvidia-smi-q_a100-sxm4-80gb-x4_remap-pending.txt")]
    analyse.gpus(nodes, {"a": 8, "b": 8, "c": 8, "d": 4})
    assert nodes[0].verdict == nodes[1].verdict == "pass"
    assert nodes[0].reason() == "all checks passed" and nodes[0].findings[0].value["count"] == 8
    assert nodes[2].verdict == "fail" and nodes[2].reason() == "gpus: 2 GPU(s) answer, the cluster promises 8"
    assert nodes[3].verdict == "warn" and "GPU 00000000:9E:00.0: a row remap is pending" in nodes[3].reason()
    assert "smi_q" not in nodes[0].findings[0].value, "the record keeps what was read, not the whole output"
    odd = [_gpu_node("a", "nvidia-smi-q_h100-nvl-x2_healthy.txt"), _gpu_node("b", "nvidia-smi-q_h100-nvl-x2_healthy.txt"),
           _gpu_node("c", "nvidia-smi-q_l40s_healthy.txt")]
    analyse.gpus(odd, {"a": 2, "b": 2, "c": 1})
    assert odd[2].reason() == "gpus: NVIDIA L40S here, NVIDIA H100 NVL on the other GPU nodes"


def test_dcgm_diagnostics_read_test_by_test():
    passed = dcgm_results(smi("dcgmi-diag-r2_a100-sxm4-80gb-x8_p4de_pass.txt"))
    assert [t for t, s, _ in passed if s != "pass"] == [] and ("GPU Memory", "pass", "Pass - All") in passed
    assert "DCGM Version" not in [t for t, _, _ in passed], "metadata rows are not tests"
    [(test, status, said)] = dcgm_results(smi("dcgmi-diag-r2_fragment_gpu-memory-fail.txt"))
    assert (test, status) == ("GPU Memory", "fail") and "Fail - GPU: 0" in said and "Thermal violations" in said
    # A hardware test DCGM skips (as printed where the GPUs are not supported by its plugins).
    skipped = dcgm_results("| PCIe                      | Pass - All        |\n| GPU Memory                | Skip - All        |")
    assert skipped == [("PCIe", "pass", "Pass - All"), ("GPU Memory", "skip", "Skip - All")]
    [(test, status, said)] = dcgm_results(smi("dcgmi-diag_fragment_row-remap-pending-error.txt"))
    assert status == "fail" and "uncorrectable memory errors" in said

    nodes = [NodeReport(n, [Finding("dcgm", "pass", "answered", {"level": 2, "text": smi(f)})]) for n, f in
             (("a", "dcgmi-diag-r2_a100-sxm4-80gb-x8_p4de_pass.txt"), ("b", "dcgmi-diag-r2_fragment_gpu-memory-fail.txt"))]
    some_skipped = {"level": 3, "text": "| PCIe | Pass - All |\n| EUD | Skip - All |"}
    nodes.append(NodeReport("c", [Finding("dcgm", "pass", "answered", some_skipped)]))
    analyse.dcgm(nodes)
    assert [n.verdict for n in nodes] == ["pass", "fail", "pass"]
    assert nodes[0].findings[0].detail == "level 2: 11 test(s) passed"
    assert nodes[1].reason().startswith("dcgm: GPU Memory: Pass - GPUs: 1, 2, 3, 4, 5, 6, 7 Fail - GPU: 0")
    assert "skipped" in nodes[2].findings[0].detail


def test_an_nvswitch_fabric_not_trained_fails_the_node():
    """The Fabric section as an H100 node prints it before Fabric Manager trained the
    fabric (tests/fixtures/gpu/, recorded), under a GPU of its own."""
    fixtures = HEALTH.parent
    head = "GPU 00000000:18:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n"
    for name, verdict in (("nvidia-smi-q-fabric.in-progress.txt", "fail"), ("nvidia-smi-q-fabric.completed.txt", "pass")):
        node = NodeReport("a", [Finding("gpus", "pass", "", {"smi_q": head + (fixtures / name).read_text()})])
        analyse.gpus([node], {"a": 1})
        assert node.verdict == verdict, node.reason()
    assert "the NVSwitch fabric is not trained (In Progress/N/A)" in analyse_reason("nvidia-smi-q-fabric.in-progress.txt")


def analyse_reason(fixture: str) -> str:
    head = "GPU 00000000:18:00.0\n    Product Name                          : NVIDIA H100 80GB HBM3\n"
    node = NodeReport("a", [Finding("gpus", "pass", "", {"smi_q": head + (HEALTH.parent / fixture).read_text()})])
    analyse.gpus([node], {"a": 1})
    return node.reason()


LSPCI = "lspci-vvv_h100-sxm-x8_gpu-stanzas_healthy.txt"


def test_lspci_reads_each_gpus_link_and_a_healthy_node_has_no_problem():
    links = pcie_links(smi(LSPCI))
    assert [g["bdf"] for g in links] == ["19:00.0", "3b:00.0", "4c:00.0", "5d:00.0", "9b:00.0", "bb:00.0", "cb:00.0", "db:00.0"]
    assert {(g["rev"], g["cap"], g["sta"]) for g in links} == {("a1", 16, 16)}
    assert pcie_problems(smi(LSPCI)) == []  # the Secondary PCIe capability's LaneErrStat is not read
    # read without root, lspci shows no capability: no width, so nothing is said of it
    assert {(g["cap"], g["sta"]) for g in pcie_links(_denied(smi(LSPCI)))} == {(None, None)}
    node = NodeReport("a", [Finding("gpus", "pass", "nvidia-smi answered",
                                    {"smi_q": smi("nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt"), "lspci": smi(LSPCI)})])
    analyse.gpus([node], {"a": 8})
    assert node.verdict == "pass", node.reason()


def _denied(lspci: str) -> str:
    """A recording as an unprivileged lspci prints it: each stanza's capabilities hidden."""
    out, hidden = [], False
    for line in lspci.splitlines():
        if line.startswith("\tCapabilities:"):
            if not hidden:
                out.append("\tCapabilities: <access denied>")
            hidden = True
            continue
        if hidden and line.startswith("\t\t"):
            continue
        hidden = hidden and not (line and not line[0].isspace())
        out.append(line)
    return "\n".join(out)


def _one_gpu_changed(lspci: str, bdf: str, old: str, new: str) -> str:
    """The recording with one GPU's stanza edited (the fault, as lspci prints it)."""
    stanzas = lspci.split("\n\n")
    return "\n\n".join(s.replace(old, new) if s.startswith(bdf) else s for s in stanzas)


def test_a_narrow_link_or_a_gpu_off_the_bus_is_named_from_lspci():
    """The healthy recording with one GPU's link trained at x8 (lspci marks it
    "(downgraded)"), and one GPU whose config space reads all ones (rev ff: "fallen off
    the bus"): a narrow link warns; a GPU off the bus fails the node, also where nvidia-smi
    itself failed (its driver lost the GPU), since the bus still says why."""
    narrow = _one_gpu_changed(smi(LSPCI), "3b:00.0", "Width x16 (ok)", "Width x8 (downgraded)")
    assert pcie_problems(narrow) == [("warn", "3b:00.0", "PCIe link x8 of x16 (lspci): a card or riser seated badly, "
                                                          "or a slot narrower than the card")]
    node = NodeReport("a", [Finding("gpus", "pass", "nvidia-smi answered",
                                    {"smi_q": smi("nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt"), "lspci": narrow})])
    analyse.gpus([node], {"a": 8})
    assert node.verdict == "warn" and node.reason() == ("gpus: GPU 3b:00.0: PCIe link x8 of x16 (lspci): a card or riser "
                                                        "seated badly, or a slot narrower than the card")
    # config space reading all ones gives the prog-if byte ff too, which -v prints after the revision
    off = _one_gpu_changed(smi(LSPCI), "5d:00.0", "(rev a1)", "(rev ff) (prog-if ff)")
    node = NodeReport("b", [Finding("gpus", "fail", "nvidia-smi failed: Unable to determine the device handle for GPU0000:5D:00.0: "
                                                    "GPU is lost.  Reboot the system to recover this GPU", {"lspci": off})])
    analyse.gpus([node], {"b": 8})
    assert node.verdict == "fail"
    assert node.reason().endswith("GPU 5d:00.0: reads as rev ff on the PCI bus: the GPU has fallen off the bus (reset it, "
                                  "or reboot the node; replace it if it happens again)")
    assert node.findings[0].value == {"problems": [node.reason().split("; ", 1)[1]]}, "the record keeps no raw output"


DCGM_JSON = HEALTH / "dcgm-json"


@pytest.mark.parametrize(("fixture", "want"), [
    # DCGM 3.x ("DCGM GPU Diagnostic", per-GPU gpu_ids), level 2 and 3 (its EUD test skipped)
    ("dcgm3_virtualclient_r2_allpass.json", {"pass": 11}),
    ("dcgm3_virtualclient_r3_pass_eudskip.json", {"pass": 15, "skip": 1}),
    # DCGM 4.x ("DCGM Diagnostic", entity_id): persistence mode off fails DCGM's software
    # test, a warning here; the hardware tests DCGM gates on this GPU skipped
    ("dcgm4.5.2_gb10_r2_allowed_softwarefail.json", {"warn": 1, "pass": 2}),
    ("dcgm4.5.2_gb10_r2_gated_softwarefail_skips.json", {"warn": 1, "skip": 2}),
    ("dcgm4.2.3_gb10_r1_softwarefail.json", {"warn": 1}),
])
def test_dcgm_json_reports_of_both_formats(fixture, want):
    results = dcgm_results((DCGM_JSON / fixture).read_text())
    assert {s: sum(1 for _, x, _ in results if x == s) for s in want} == want and len(results) == sum(want.values())
    for test, status, said in results:
        if status == "warn":
            assert test == "software" and said.startswith("Warn - GPU: 0 Persistence Mode: Persistence mode for GPU 0 is "
                                                          "disabled. Enable persistence mode by running")
            assert said.endswith("(DCGM says Fail; a warning here: the GPUs work without it)")


def test_a_failed_dcgm_json_test_fails_the_node_with_dcgms_words():
    """The 4.5.2 recording with its memory test turned failed, carrying the warning the
    recorded level-2 table gives for GPU 0 (tests/fixtures/gpu/health: the A100 fragment)."""
    import json

    doc = json.loads((DCGM_JSON / "dcgm4.5.2_gb10_r2_allowed_softwarefail.json").read_text())
    memory = next(t for c in doc["DCGM Diagnostic"]["test_categories"] for t in c["tests"] if t["name"] == "memory")
    memory["results"][0].update(status="Fail", warnings=[{"error_category": 3, "error_id": 16, "error_severity": 2,
                                                          "warning": "GPU 0 Thermal violations totaling 13.3 seconds "
                                                                     "started at 9.7 seconds into the test for GPU 0"}])
    text = "Error: one test failed\n" + json.dumps(doc, indent=1)  # what stderr may put before it
    node = NodeReport("a", [Finding("dcgm", "pass", "answered", {"level": 2, "text": text})])
    analyse.dcgm([node])
    assert node.verdict == "fail"
    assert node.reason() == ("dcgm: software: Warn - GPU: 0 Persistence Mode: Persistence mode for GPU 0 is disabled. Enable "
                             "persistence mode by running \"nvidia-smi -i <gpuId> -pm 1 \" as root. (DCGM says Fail; a warning "
                             "here: the GPUs work without it); memory: Fail - GPU: 0 GPU 0 Thermal violations totaling 13.3 "
                             "seconds started at 9.7 seconds into the test for GPU 0")
    assert [t["status"] for t in node.findings[0].value["tests"]] == ["warn", "fail", "pass"]


def test_lspci_lines_as_printed_for_other_classes_and_domains():
    vga = "0000:01:00.0 VGA compatible controller: NVIDIA Corporation GA102 [GeForce RTX 3090] (rev a1) (prog-if 00 [VGA controller])"
    assert pcie_links(vga) == [{"bdf": "0000:01:00.0", "rev": "a1", "cap": None, "sta": None}]
    # a VM giving each GPU a PCI domain of its own: the domain tells them apart
    assert same_bus("00000001:00:00.0", "0001:00:00.0") and not same_bus("00000001:00:00.0", "0002:00:00.0")
    assert same_bus("00000000:19:00.0", "19:00.0")


def test_a_dcgm_diagnostic_that_could_not_run_fails_the_node():
    """dcgmi -j reports a diagnostic it could not start as {"DCGM Diagnostic": {"runtime_error": ...}}
    (NVIDIA/DCGM dcgmi/Diag.cpp, HelperDisplayFailureMessage); an answer with no test in it
    fails too, where the table had none either."""
    failed = '{"DCGM Diagnostic": {"version": "4.2.3", "runtime_error": "Error: unable to establish a connection to the host engine"}}'
    nodes = [NodeReport(n, [Finding("dcgm", "pass", "answered", {"level": 1, "text": t})])
             for n, t in (("a", failed), ("b", "Error: nothing here"))]
    analyse.dcgm(nodes)
    assert [n.verdict for n in nodes] == ["fail", "fail"]
    assert nodes[0].reason() == ("dcgm: diagnostic: DCGM could not run it: Error: unable to establish a connection to the "
                                 "host engine")
    assert nodes[1].reason() == "dcgm: diagnostic: dcgmi printed no test result: Error: nothing here"
