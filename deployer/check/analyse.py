"""The verdicts `deployer check` gives from what the nodes said (benchmarks/node_check.py):
each node against its own limits, and against the other nodes, since one bad node among
equals is what costs a sweep its days. Pure functions of the findings: unit-tested on
recorded answers, no cluster needed.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .model import Finding, NodeReport, Status

# Clock: two nodes further apart than this garble the timeline and the logs (warn); far
# enough to break munge (Slurm) or TLS (fail).
CLOCK_WARN_S, CLOCK_FAIL_S = 1.0, 5.0
# A node with less memory than this share of the others' median is not the flavor they are.
MEMORY_SHARE = 0.9


def _value(node: NodeReport, check: str) -> Any:
    f = next((f for f in node.findings if f.check == check), None)
    return f.value if f is not None and f.status != "fail" else None


def _replace(node: NodeReport, check: str, status: Status, detail: str) -> None:
    node.findings = [replace(f, status=status, detail=detail) if f.check == check else f for f in node.findings]


def clock(nodes: list[NodeReport], received_at: dict[str, float]) -> None:
    """Each node's clock against the controller's: the node's time when it said it, less the
    time the line arrived here (the network's delay makes it an under-estimate by ms)."""
    for n in nodes:
        v = _value(n, "clock")
        if not isinstance(v, dict) or n.name not in received_at:
            continue
        offset = v["time"] - received_at[n.name]
        v["offset_s"] = round(offset, 3)
        ntp = {True: "NTP synchronised", False: "NTP not synchronised", None: "NTP state unknown"}[v.get("ntp_synchronized")]
        said = f"{offset:+.2f} s from this machine's clock ({ntp})"
        status: Status = "fail" if abs(offset) > CLOCK_FAIL_S else "warn" if abs(offset) > CLOCK_WARN_S else "pass"
        _replace(n, "clock", status, said)


def size(nodes: list[NodeReport], promised: Mapping[str, Any] | None = None) -> None:
    """CPUs and memory against what the flavor promises (the cluster output's machine:
    vcpus, ram_mb; OpenStack's preflight reads them from Nova) and against the other
    nodes': the nodes of one cluster are one flavor. The kernel keeps some memory for
    itself: a node with under MEMORY_SHARE of the promise is short."""
    sized = {n.name: v for n in nodes if isinstance(v := _value(n, "size"), dict)}
    vcpus, ram_mb = (promised or {}).get("vcpus"), (promised or {}).get("ram_mb")
    cpus = Counter(v["cpus"] for v in sized.values()).most_common(1)[0][0] if len(sized) > 1 else None
    for n in nodes:
        v = sized.get(n.name)
        if v is None:
            continue
        problems = []
        gib = v["memory_bytes"] / (1 << 30)
        if vcpus and v["cpus"] < vcpus:
            problems.append(f"{v['cpus']} CPU(s), the flavor promises {vcpus}")
        elif cpus is not None and v["cpus"] < cpus:
            problems.append(f"{v['cpus']} CPU(s), the others have {cpus}")
        others = [o["memory_bytes"] for k, o in sized.items() if k != n.name]
        median = statistics.median(others) if others else 0
        if ram_mb and v["memory_bytes"] < MEMORY_SHARE * ram_mb * (1 << 20):
            problems.append(f"{gib:.1f} GiB of memory, the flavor promises {ram_mb / 1024:.1f} GiB")
        elif median and v["memory_bytes"] < MEMORY_SHARE * median:
            problems.append(f"{gib:.1f} GiB of memory, the others {median / (1 << 30):.1f} GiB")
        if problems:
            _replace(n, "size", "warn", "; ".join(problems))


def interface(nodes: list[NodeReport]) -> None:
    """NCCL and gloo must use the same network on every node."""
    names = {n.name: v["name"] for n in nodes if isinstance(v := _value(n, "interface"), dict) and v.get("name")}
    if len(set(names.values())) < 2:
        return
    usual = Counter(names.values()).most_common(1)[0][0]
    for n in nodes:
        if names.get(n.name, usual) != usual:
            _replace(n, "interface", "warn", f"NCCL and gloo use {names[n.name]} here, {usual} on the other nodes")


def shared(nodes: list[NodeReport], seen_on_master: set[str] | None, shared_dir: str) -> None:
    """A node whose shared dir took its file, but whose file the master does not see, has a
    shared dir of its own: not the cluster's."""
    if seen_on_master is None:
        return
    for n in nodes:
        f = next((f for f in n.findings if f.check == "shared_dir"), None)
        if f is not None and f.status == "pass" and n.name not in seen_on_master:
            _replace(n, "shared_dir", "fail", f"{shared_dir} takes files, but the master does not see them: it is not "
                                              f"the cluster's shared storage")


def silent(node: NodeReport, step: str | None, quiet_s: float) -> None:
    """A node that stopped answering: named with the check it was in."""
    node.findings.append(Finding(step or "start", "fail", f"no answer for {quiet_s:.0f} s (during the {step or 'start'} "
                                                          f"check): stopped, the node hangs there"))


def missing(nodes: list[NodeReport], expected: list[str]) -> None:
    """A check a node never reported (it died, or its answer was cut) fails it by name."""
    for n in nodes:
        said = {f.check for f in n.findings}
        for check in expected:
            if check not in said:
                n.findings.append(Finding(check, "fail", "the node gave no answer for this check"))


def gpus(nodes: list[NodeReport], expected: dict[str, int]) -> None:
    """GPU nodes' `nvidia-smi -q`, read (gpu_facts.gpu_problems): the count the cluster
    promises, each GPU's ECC, row remapping, page retirement and PCIe width, and the model
    against the other nodes' (one cluster is one flavor); and lspci's view of them
    (gpu_facts.pcie_problems), which holds where nvidia-smi fails: a GPU fallen off the bus."""
    from ..gpu_facts import fabric_ready, fabric_states, gpu_problems, pcie_problems, same_bus, smi_gpus

    models: dict[str, str] = {}
    for n in nodes:
        f = next((f for f in n.findings if f.check == "gpus"), None)
        if f is None or not isinstance(f.value, dict):
            continue
        pci = pcie_problems(str(f.value.get("lspci", "")))
        if f.status == "fail":  # nvidia-smi did not answer: what the bus says is all there is
            lost = [f"GPU {bdf}: {what}" for _, bdf, what in pci]
            n.findings = [replace(x, detail="; ".join([f.detail, *lost]), value={"problems": lost}) if x is f else x
                          for x in n.findings]
            continue
        found = smi_gpus(str(f.value.get("smi_q", "")))
        names = sorted({str(t.get("Product Name", "?")) for _, t in found})
        per_gpu = [(bus, gpu_problems(t)) for bus, t in found]
        problems = [(status, f"GPU {bus}: {what}") for bus, said in per_gpu for status, what in said]
        # lspci's width only where nvidia-smi did not already say it of that GPU
        narrow = [bus for bus, said in per_gpu if any("PCIe link" in w for _, w in said)]
        problems += [(status, f"GPU {bdf}: {what}") for status, bdf, what in pci
                     if status == "fail" or not any(same_bus(bus, bdf) for bus in narrow)]
        want = expected.get(n.name, 0)
        if not fabric_ready(str(f.value.get("smi_q", ""))):
            states = sorted({f"{s}/{st}" for s, st in fabric_states(str(f.value.get("smi_q", ""))) if s != "N/A"})
            problems.append(("fail", f"the NVSwitch fabric is not trained ({', '.join(states)}): is nvidia-fabricmanager "
                                     f"running?"))
        if len(found) < want:
            problems.insert(0, ("fail", f"{len(found)} GPU(s) answer, the cluster promises {want}"))
        status: Status = "fail" if any(s == "fail" for s, _ in problems) else "warn" if problems else "pass"
        said = "; ".join(w for _, w in problems) or f"{len(found)} x {', '.join(names)}: ECC, memory and PCIe width clean"
        value = {"count": len(found), "models": names, "problems": [w for _, w in problems]}
        n.findings = [replace(x, status=status, detail=said, value=value) if x is f else x for x in n.findings]
        if names:
            models[n.name] = names[0]
    if len(set(models.values())) > 1:
        usual = Counter(models.values()).most_common(1)[0][0]
        for n in nodes:
            if models.get(n.name, usual) != usual:
                f = next(f for f in n.findings if f.check == "gpus")
                if f.status == "pass":
                    _replace(n, "gpus", "warn", f"{models[n.name]} here, {usual} on the other GPU nodes")


def dcgm(nodes: list[NodeReport]) -> None:
    """DCGM's diagnostics read test by test: a failed test fails the node, a warning warns."""
    from ..gpu_facts import dcgm_results

    for n in nodes:
        f = next((f for f in n.findings if f.check == "dcgm"), None)
        if f is None or f.status != "pass" or not isinstance(f.value, dict):
            continue
        results = dcgm_results(str(f.value.get("text", "")))
        if not results:  # an answer with no test in it is no diagnostic
            text = str(f.value.get("text", "")).strip()
            results = [("diagnostic", "fail", f"dcgmi printed no test result: {text.splitlines()[-1][:200] if text else 'nothing'}")]
        bad = [(s, f"{name}: {said}") for name, s, said in results if s in ("fail", "warn")]
        status: Status = "fail" if any(s == "fail" for s, _ in bad) else "warn" if bad else "pass"
        ran = [name for name, s, _ in results if s != "skip"]
        said = "; ".join(w for _, w in bad) or f"level {f.value.get('level')}: {len(ran)} test(s) passed" + (
            f", {len(results) - len(ran)} skipped" if len(ran) < len(results) else "")
        value = {"level": f.value.get("level"), "tests": [{"test": a, "status": s, "said": w} for a, s, w in results]}
        n.findings = [replace(x, status=status, detail=said, value=value) if x is f else x for x in n.findings]
