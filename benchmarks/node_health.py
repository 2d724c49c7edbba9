#!/usr/bin/python3
"""A node's health, checked on a timer: the passive, seconds-cheap part of `deployer check`.

    node_health.py --shared /shared [--gpus N] [--slurm] [--timeout 20]

Installed on every node's own disk (role health: /usr/local/libexec/deployer/health/),
beside node_check.py whose checks it reuses and node_health_gpu.py (the GPU readings), so it
runs whatever became of the shared dir. It runs
from a systemd timer (health.interval), or, with Slurm, as slurmd's HealthCheckProgram
(one runner per node: two would count one fault twice).

Each run: every check bounded by its own timeout (a check that does not return in time
fails by name); the results into node_exporter's textfile collector (deployer_health_*);
the run kept in <state>/last.json (`deployer status` and `deployer heal` read it over SSH)
with what must survive to the next run (failures in a row, since when, the last kernel
message read). With --slurm: drained after two failed runs in a row, with the reason
`deployer health: <check>: <detail>`; resumed when it passes, only where that prefix
says health drained it (an administrator's drain is never touched).

Standard library only: the node's own python3. Always exits 0: slurmd runs its
HealthCheckProgram until it exits 0 before the node registers, and a failing node is a
finding, not an error of this program.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import node_check  # noqa: E402  (installed side by side: its checks, not a copy of them)
from node_check import result, run  # noqa: E402
from node_health_gpu import (  # noqa: E402  (the GPU readings, pure functions of a command's text)
    dcgm_health_findings,
    ecc_findings,
    off_bus_in_lspci,
    xid_findings,
)

SCHEMA = 1
REASON_PREFIX = "deployer health:"
# Failed runs in a row before a node is drained: one failure can be a passing moment (a
# mount being remounted, a disk cleaned a second later).
FAILS_TO_DRAIN = 2
RUN_BUDGET_S = 45.0
# ---- the checks as this program runs them ----

def kernel_messages(since: float, timeout: float) -> str:
    """Kernel messages since `since` (journald's, else the ring buffer's: a node without
    a persistent journal still has dmesg, whose lines before `since` are read again and
    must be judged by the caller's Xid state)."""
    rc, out = run(["journalctl", "-k", "-q", "--no-pager", "-o", "short-iso", "--since", f"@{int(since)}"], timeout)
    if rc == 0:
        return out
    rc, out = run(["dmesg"], timeout)
    return out if rc == 0 else ""


def check_gpu_health(expected: int, since: float, timeout: float) -> list[dict[str, Any]]:
    rc, smi = run(["nvidia-smi", "-q"], timeout)
    pci = node_check.lspci_gpus(timeout)
    off = off_bus_in_lspci(pci)
    found = [xid_findings(kernel_messages(since, timeout))]
    if off:
        found.append(result("gpus", "fail", f"GPU {', '.join(off)} reads as rev ff in lspci: fallen off the bus"))
    elif rc != 0:
        found.append(result("gpus", "fail", f"nvidia-smi failed: {smi.splitlines()[-1] if smi else rc}"))
    else:
        found.append(ecc_findings(smi, expected))
    if shutil.which("dcgmi"):
        rc, out = run(["dcgmi", "health", "-c", "-j"], timeout)
        finding = dcgm_health_findings(out)
        if finding["status"] == "skip":
            run(["dcgmi", "health", "-s", "a"], timeout)  # every watch, on the default group
        found.append(finding)
    return found


def check_runtime(timeout: float) -> dict[str, Any]:
    """torch and mpi4py are found by the login shell's python: found, not imported (an
    import of torch costs seconds of CPU on every node every run; `deployer check` imports)."""
    code = ("import importlib.util as u, json; print(json.dumps({m: bool(u.find_spec(m)) for m in ('torch', 'mpi4py')}))")
    rc, out = run(["bash", "-lc", f"python -c {json.dumps(code)}"], timeout)
    try:
        found = json.loads(out.splitlines()[-1]) if rc == 0 else {}
    except (ValueError, IndexError):
        found = {}
    missing = [m for m in ("torch", "mpi4py") if not found.get(m)]
    if missing:
        return result("runtime", "fail", f"the training environment lacks {', '.join(missing)}"
                      + ("" if rc == 0 else f" ({out.splitlines()[-1] if out else rc})"))
    return result("runtime", "pass", "torch and mpi4py are installed in the training environment")


def check_shared(shared: str, user: str | None, timeout: float) -> dict[str, Any]:
    """The shared dir is a mount of its own (node_check's reading) and the cluster's user
    writes a file there and reads it back (<shared>/.deployer-health/<node>): as that user,
    since root is squashed on NFS and a root-owned directory would keep `deployer check`'s
    files out."""
    point = node_check._mount_point(shared)
    if point != os.path.realpath(shared):
        return result("shared_dir", "fail", f"{shared} is not mounted (it is a directory on {point or '?'}): "
                      f"the cluster's shared storage is missing on this node")
    host = socket.gethostname()
    mine = os.path.join(shared, ".deployer-health", host)
    # The time it was written: `status` and `heal` read the file from the master too, and a
    # write the master does not see is a node-local directory over the shared storage.
    written = f"{time.time():.3f}"
    # Renamed into place: the master never reads it half written.
    script = f'mkdir -p "$(dirname "$1")" && echo {written} > "$1.tmp" && mv -f "$1.tmp" "$1" && cat "$1"'
    as_user = ["runuser", "-u", user, "--"] if user and os.geteuid() == 0 else []
    rc, out = run([*as_user, "sh", "-c", script, "sh", mine], timeout)
    if rc != 0 or out.strip() != written:
        return result("shared_dir", "fail", f"{shared}: cannot write ({out.splitlines()[-1] if out else rc})")
    return result("shared_dir", "pass", f"{shared} mounted and writable", {"file": mine, "written_at": float(written)})


def check_clock(timeout: float) -> dict[str, Any]:
    """NTP synchronised, as systemd-timesyncd or chrony says. A node alone cannot measure its
    offset (`deployer check` does, from the controller): unsynchronised warns."""
    rc, out = run(["timedatectl", "show", "-p", "NTPSynchronized", "--value"], timeout)
    if rc == 0 and out.strip() == "yes":
        return result("clock", "pass", "NTP synchronised")
    return result("clock", "warn", "NTP not synchronised" if rc == 0 else "NTP state unknown (no timedatectl answer)")


def bounded(name: str, fn: Callable[[], Any], timeout: float) -> list[dict[str, Any]]:
    """fn's findings, or a failure named for the check when it does not return in `timeout`
    (a stat on a dead NFS server blocks in the kernel: its thread is left behind, daemon)."""
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(fn())
        except Exception as e:  # a check that breaks is that check failing, named
            box.append(result(name, "fail", f"the check itself failed: {e.__class__.__name__}: {e}"))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        return [result(name, "fail", f"no answer in {timeout:.0f} s (a hung mount or device)")]
    got = box[0]
    return got if isinstance(got, list) else [got]


def run_checks(shared: str, gpus: int, timeout: float, since: float, user: str | None = None) -> list[dict[str, Any]]:
    checks: list[tuple[str, Callable[[], Any]]] = [
        ("clock", lambda: check_clock(timeout)),
        ("disk_root", lambda: node_check.check_disk("disk_root", "/")),
        ("shared_dir", lambda: check_shared(shared, user, timeout)),
        ("disk_shared", lambda: node_check.check_disk("disk_shared", shared)),
        ("runtime", lambda: check_runtime(timeout)),
    ]
    if gpus:
        checks.append(("gpus", lambda: check_gpu_health(gpus, since, timeout)))
    # slurmd kills its HealthCheckProgram at 60 s: every check together stays inside
    # RUN_BUDGET_S, however many of them hang.
    deadline = time.monotonic() + RUN_BUDGET_S
    found: list[dict[str, Any]] = []
    for name, fn in checks:
        left = max(1.0, deadline - time.monotonic())
        found.extend(bounded(name, fn, min(left, timeout * (3 if name == "gpus" else 1))))
    return found


# ---- what a run leaves: the textfile, the record, Slurm's node state ----

STATUS_VALUE = {"pass": 0, "skip": 0, "warn": 1, "fail": 2}


def textfile(record: dict[str, Any]) -> str:
    """node_exporter's textfile format: one series per check and the run's own figures."""
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")

    out = [
        "# HELP deployer_health_check_status A health check's last result: 0 pass (or skip), 1 warn, 2 fail.",
        "# TYPE deployer_health_check_status gauge",
    ]
    for f in record["findings"]:
        out.append(f'deployer_health_check_status{{check="{esc(f["check"])}"}} {STATUS_VALUE.get(f["status"], 2)}')
    failing = record["verdict"] == "fail"
    series = [
        ("failing", "1 when the last run failed a check.", int(failing)),
        ("consecutive_failures", "Failed runs in a row.", record["consecutive_failures"]),
        ("failing_since_timestamp_seconds", "When the node started failing (0 while it passes).", record["failing_since"] or 0),
        ("drained", "1 when health drained the node in Slurm.", int(record["drained_by_health"])),
        ("last_run_timestamp_seconds", "When the last run ended.", record["at"]),
        ("run_seconds", "Wall time of the last run.", record["seconds"]),
        ("cpu_seconds", "CPU time (user + system, the checks' commands included) of the last run.", record["cpu_seconds"]),
        ("interval_seconds", "How often health runs here.", record["interval"]),
    ]
    for name, help_, value in series:
        out += [f"# HELP deployer_health_{name} {help_}", f"# TYPE deployer_health_{name} gauge",
                f"deployer_health_{name} {_number(value)}"]
    return "\n".join(out) + "\n"


def _number(value: float) -> str:
    """Milliseconds at most, never an exponent (a timestamp keeps its seconds)."""
    return f"{float(value):.3f}".rstrip("0").rstrip(".")


def write_atomic(path: str, text: str) -> None:
    """Written beside and renamed: node_exporter never reads half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            got = json.load(f)
        return got if isinstance(got, dict) else {}
    except (OSError, ValueError):
        return {}


def slurm_node(node: str, timeout: float) -> tuple[str, str] | None:
    """(State, Reason) of this node in Slurm, None where slurmctld does not answer."""
    rc, out = run(["scontrol", "-o", "show", "node", node], timeout)
    if rc != 0:
        return None
    state = re.search(r"\bState=(\S+)", out)
    reason = re.search(r"\bReason=(.*?)(?: \[[^\]]*\])?(?= \w+=|$)", out)
    return (state[1] if state else ""), (reason[1].strip() if reason else "")


def slurm_action(verdict: str, consecutive: int, state: str, reason: str) -> str | None:
    """What health does to the node in Slurm: "drain", "resume" or nothing. Drained after
    FAILS_TO_DRAIN failed runs in a row; resumed only where health's own prefix is the
    reason (an administrator's drain, or one by another tool, stays)."""
    drained = "DRAIN" in state.upper()
    ours = reason.startswith(REASON_PREFIX)
    if verdict == "fail" and consecutive >= FAILS_TO_DRAIN and not drained:
        return "drain"
    if verdict != "fail" and drained and ours:
        return "resume"
    return None


def first_failure(findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((f for f in findings if f["status"] == "fail"), None)


def reason_for(finding: dict[str, Any]) -> str:
    # scontrol takes the reason as one argument; Slurm keeps it whole.
    return f"{REASON_PREFIX} {finding['check']}: {finding['detail']}"[:250]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--shared", required=True)
    p.add_argument("--gpus", type=int, default=0, help="GPUs the cluster says this node has")
    p.add_argument("--timeout", type=float, default=20, help="seconds one check may take")
    p.add_argument("--interval", type=float, default=300, help="seconds between runs (for the series)")
    p.add_argument("--state", default="/var/lib/deployer-health")
    p.add_argument("--textfile", default="/var/lib/prometheus/node-exporter/deployer_health.prom")
    p.add_argument("--user", help="the cluster's user: writes the shared dir's test file (root is squashed on NFS)")
    p.add_argument("--slurm", action="store_true", help="drain and resume this node in Slurm")
    a = p.parse_args(argv)
    started = time.time()
    last_path = os.path.join(a.state, "last.json")
    before = read_json(last_path)
    since = float(before.get("at") or (started - a.interval))
    findings = run_checks(a.shared, a.gpus, a.timeout, since, a.user)
    bad = first_failure(findings)
    warned = next((f for f in findings if f["status"] == "warn"), None)
    verdict = "fail" if bad else ("warn" if warned else "pass")
    said = bad or warned
    consecutive = int(before.get("consecutive_failures") or 0) + 1 if bad else 0
    record: dict[str, Any] = {
        "schema": SCHEMA, "node": socket.gethostname(), "verdict": verdict,
        "reason": f"{said['check']}: {said['detail']}" if said else "all checks passed",
        "findings": [{k: v for k, v in f.items() if k != "value"} for f in findings],
        "consecutive_failures": consecutive,
        "failing_since": (before.get("failing_since") or started) if bad else None,
        "drained_by_health": bool(before.get("drained_by_health")),
        "interval": a.interval, "slurm": None,
        "shared_written_at": next((f["value"]["written_at"] for f in findings
                                   if f["check"] == "shared_dir" and f["status"] == "pass" and "value" in f), None),
    }
    if a.slurm:
        node = socket.gethostname()
        seen = slurm_node(node, a.timeout)
        if seen is not None:
            state, reason = seen
            action = slurm_action(verdict, consecutive, state, reason)
            if action == "drain" and bad:
                run(["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason_for(bad)}"], a.timeout)
                state, reason = "DRAIN", reason_for(bad)
            elif action == "resume":
                run(["scontrol", "update", f"nodename={node}", "state=resume"], a.timeout)
                state, reason = "IDLE", ""
            record["slurm"] = {"state": state, "reason": reason, "action": action}
            record["drained_by_health"] = "DRAIN" in state.upper() and reason.startswith(REASON_PREFIX)
    usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    record["cpu_seconds"] = round(sum(u.ru_utime + u.ru_stime for u in usage), 3)
    record["at"] = time.time()
    record["seconds"] = round(record["at"] - started, 3)
    write_atomic(last_path, json.dumps(record, indent=1) + "\n")
    write_atomic(a.textfile, textfile(record))
    print(f"{record['node']}: {verdict}: {record['reason']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
