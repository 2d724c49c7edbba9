"""A GPU node's health as its tools print it: Xid and fallen-off-the-bus lines in the kernel's
messages, nvidia-smi -q's GPUs, ECC counters and row remapper, lspci's rev ff, and
`dcgmi health -c -j`. Pure functions of a command's text (node_health.py runs the
commands), unit-tested on recorded outputs (tests/fixtures/gpu/health/health-timer/README.md
names each source). Standard library only: installed beside node_health.py on the node.
"""

from __future__ import annotations

import json
import re
from typing import Any

from node_check import result

# Xids whose immediate action in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors,
# "Resolution Bucket (Immediate Action)") is a GPU reset, a node reboot or a hardware
# service: the GPU cannot be trusted with a job until then. The others (an application's
# fault, RESTART_APP: 13, 31, 43, 45...) warn. 48: double-bit ECC; 61, 62: internal
# micro-controller errors; 64: row remap failed; 74: NVLink; 79: fallen off the bus; 92:
# high single-bit ECC rate; 94, 95: contained and uncontained ECC; 119, 120: GSP; 140:
# unrecovered ECC; 154: GPU recovery action changed (reset or reboot required).
FATAL_XIDS = frozenset({48, 61, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140, 154})
# The driver's lines (open-gpu-kernel-modules nv.c and the Xid catalog's examples):
#   NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, ...
#   NVRM: GPU at PCI:0000:01:00: ... / NVRM: The NVIDIA GPU 0000:b3:00.0 ... fallen off the bus
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:, (?P<text>.*))?")
_OFF_BUS = re.compile(r"NVRM: (?:GPU at (?:PCI:)?(?P<a>[0-9a-fA-F:.]+) has fallen off the bus"
                      r"|The NVIDIA GPU (?P<b>[0-9a-fA-F:.]+))")


def xid_findings(kernel_log: str) -> dict[str, Any]:
    """Xid events and fallen-off-the-bus lines in kernel messages, as the check's result."""
    xids: list[dict[str, Any]] = []
    off_bus: set[str] = set()
    lines = kernel_log.splitlines()
    for i, line in enumerate(lines):
        m = _XID.search(line)
        if m:
            xids.append({"bus": m["bus"], "xid": int(m["xid"]), "text": (m["text"] or "").strip()})
            if int(m["xid"]) == 79:
                off_bus.add(m["bus"])
            continue
        m = _OFF_BUS.search(line)
        # The newer drivers split the sentence over lines: "... installed in this system has"
        # then "NVRM: fallen off the bus and is not responding to commands."
        if m and ("fallen off the bus" in line or any("fallen off the bus" in x for x in lines[i + 1:i + 3])):
            off_bus.add(m["a"] or m["b"])
    fatal = sorted({x["xid"] for x in xids if x["xid"] in FATAL_XIDS})
    value = {"xids": xids[-20:], "off_bus": sorted(off_bus)}
    if off_bus:
        return result("xid", "fail", f"GPU {', '.join(sorted(off_bus))} fell off the bus (Xid 79): "
                      f"it answers nothing until the node is power-cycled", value)
    if fatal:
        first = next(x for x in xids if x["xid"] in fatal)
        return result("xid", "fail", f"Xid {', '.join(map(str, fatal))} since the last run "
                      f"(GPU {first['bus']}: {first['text'][:120]})", value)
    if xids:
        return result("xid", "warn", f"Xid {', '.join(sorted({str(x['xid']) for x in xids}))} since the last run "
                      f"(an application's fault by NVIDIA's catalog)", value)
    return result("xid", "pass", "no Xid since the last run", value)


def smi_sections(smi_q: str) -> list[tuple[str, dict[str, Any]]]:
    """`nvidia-smi -q` as (bus id, tree) per GPU: "Key : value" lines are leaves, a line
    without a value opens a section holding the lines indented under it (the reading
    deployer/gpu_facts.py smi_gpus makes on the controller; this one runs on the node, where
    the deployer package is not installed. tests/unit/test_health_node.py holds them equal on
    every recorded report)."""
    gpus: list[tuple[str, dict[str, Any]]] = []
    stack: list[tuple[int, dict[str, Any]]] = []
    for raw in smi_q.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        if indent == 0:
            stack = []
            if line.startswith("GPU "):
                tree: dict[str, Any] = {}
                gpus.append((line[4:].strip(), tree))
                stack = [(0, tree)]
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not stack:
            continue
        key, sep, value = line.partition(":")
        if sep and value.strip():
            stack[-1][1][key.strip()] = value.strip()
        else:
            section: dict[str, Any] = {}
            stack[-1][1][key.strip()] = section
            stack.append((indent, section))
    return gpus


def _count(value: Any) -> int:
    try:
        return int(str(value).split()[0])
    except (ValueError, IndexError):
        return 0  # N/A: the GPU keeps no such counter


def ecc_findings(smi_q: str, expected: int) -> dict[str, Any]:
    """GPUs answering, uncorrectable ECC errors since the driver loaded and the row
    remapper's state, per GPU. Fails: fewer GPUs than the cluster promises, volatile
    uncorrectable errors, a failed remap; warns: a remap waiting for a reset."""
    gpus = smi_sections(smi_q)
    fails: list[str] = []
    warns: list[str] = []
    if len(gpus) < expected:
        fails.append(f"{len(gpus)} of {expected} GPU(s) answer")
    for bus, tree in gpus:
        volatile = (tree.get("ECC Errors") or {}).get("Volatile") or {}
        bad = sum(_count(v) for k, v in volatile.items() if isinstance(v, str) and "Uncorrectable" in k)
        dbit = volatile.get("Double Bit")
        bad += _count(dbit.get("Total")) if isinstance(dbit, dict) else 0
        if bad:
            fails.append(f"GPU {bus}: {bad} uncorrectable ECC error(s) since the driver loaded")
        rows = tree.get("Remapped Rows") or {}
        if isinstance(rows, dict) and str(rows.get("Remapping Failure Occurred", "")).lower() == "yes":
            fails.append(f"GPU {bus}: a row remapping failed")
        elif isinstance(rows, dict) and str(rows.get("Pending", "")).lower() == "yes":
            warns.append(f"GPU {bus}: a row remap waits for a GPU reset")
    value = {"gpus": len(gpus), "expected": expected}
    if fails:
        return result("gpus", "fail", "; ".join(fails), value)
    if warns:
        return result("gpus", "warn", "; ".join(warns), value)
    return result("gpus", "pass", f"{len(gpus)} GPU(s), no uncorrectable ECC error, no failed remap", value)


def off_bus_in_lspci(lspci: str) -> list[str]:
    """NVIDIA devices whose config space reads all ones (`rev ff`): off the bus, named even
    where nvidia-smi itself fails."""
    out = []
    for line in lspci.splitlines():
        if re.match(r"^[0-9a-f:.]+ (?:3D|VGA compatible) controller", line, re.IGNORECASE) and "(rev ff)" in line:
            out.append(line.split()[0])
    return out


def dcgm_health_findings(text: str) -> dict[str, Any]:
    """`dcgmi health -c -j`: DCGM's JSON ({"header": ["Health Monitor Report"], "body":
    {"Overall Health": {"value": "Healthy"}, <entity group>: {...}}}; NVIDIA/DCGM
    dcgmi/Health.cpp CheckWatches). Healthy passes, Warning warns, Failure fails; the
    incidents' messages (the tree's overflow lines) are the detail."""
    start, end = text.find("{"), text.rfind("}")
    if "watches not enabled" in text.lower():
        return result("dcgm_health", "skip", "DCGM's health watches were not on: turned on for the next run")
    try:
        doc = json.loads(text[start:end + 1]) if 0 <= start < end else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return result("dcgm_health", "fail", f"dcgmi health -c: {text.strip().splitlines()[-1] if text.strip() else 'no answer'}")
    body = doc.get("body") or {}
    overall = str((body.get("Overall Health") or {}).get("value", "")).strip()
    said: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "overflow" and isinstance(value, list):
                    said.extend(str(v).strip() for v in value if str(v).strip())
                else:
                    walk(value)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk({k: v for k, v in body.items() if k != "Overall Health"})
    detail = f"DCGM: {overall or 'no overall health'}" + (f": {'; '.join(said)[:300]}" if said else "")
    status = {"healthy": "pass", "warning": "warn", "failure": "fail"}.get(overall.lower(), "fail")
    return result("dcgm_health", status, detail, {"overall": overall})
