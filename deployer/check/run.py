"""`deployer check`: every node checks itself at once (benchmarks/node_check.py over SSH),
one line per node as it finishes, then the nodes are held against each other
(analyse.py) and the report is kept in the state dir (check.json).

A hang is a finding, not a wait: each node says `STEP <check>` before every check, and a
node silent for longer than the level's `quiet_s` is stopped and named with the check it
was in. Nothing is left running: the node's processes of this check (found by the
check's token on their command line) are killed on the node as well.
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import records, ui
from ..errors import OperationFailed, RecordError
from ..lifetime import iso, now
from ..remote import ssh_argv
from . import analyse
from .model import CheckReport, Finding, NodeReport

if TYPE_CHECKING:
    from ..cluster import Cluster, Node
    from ..state import ClusterState

CHECK_FILE = "check.json"
SCRIPT = "benchmarks/node_check.py"
# Seconds a node may stay silent (no STEP or CHECK line) before it is named as hung: the
# slowest single check of the level, with room (a first torch import on a busy node).
QUIET_S = {"quick": 60.0, "standard": 300.0, "full": 1200.0}
# The checks every node reports (GPU nodes more: node_check.py).
NODE_CHECKS = ["clock", "disk_root", "shared_dir", "disk_shared", "size", "interface", "runtime"]


def check_file(state: ClusterState) -> Path:
    return state.dir / CHECK_FILE


def last_report(state: ClusterState) -> CheckReport | None:
    """The report of the last `deployer check` (None: none yet)."""
    data = records.read(check_file(state))
    if data is None:
        return None
    try:
        return CheckReport.from_record(data)
    except (KeyError, TypeError) as e:
        raise RecordError(f"{check_file(state)} is damaged ({e}): run `deployer check` again") from None


@dataclass
class _Watch:
    """One node's check: its ssh process, what it said, and when it last said anything."""
    node: Node
    proc: subprocess.Popen[str]
    report: NodeReport
    started: float = field(default_factory=time.monotonic)
    last_line: float = field(default_factory=time.monotonic)
    step: str | None = None
    received_at: float | None = None  # wall clock when its clock check arrived
    done: bool = False
    silent: bool = False
    stderr: list[str] = field(default_factory=list)

    def read(self) -> None:
        for line in self.proc.stdout or []:
            self.last_line = time.monotonic()
            tag, _, rest = line.rstrip("\n").partition(" ")
            if tag == "STEP":
                self.step = rest
            elif tag == "CHECK":
                try:
                    finding = Finding.parse(json.loads(rest))
                except ValueError:
                    continue
                if finding.check == "clock":
                    self.received_at = time.time()
                self.report.findings.append(finding)
            elif tag == "DONE":
                self.done = True

    def read_stderr(self) -> None:
        self.stderr.append(self.proc.stderr.read() if self.proc.stderr else "")


def node_command(cluster: Cluster, node: Node, level: str, token: str) -> str:
    shared = cluster.shared_dir
    return (f"python3 {shlex.quote(f'{shared}/{SCRIPT}')} --shared {shlex.quote(shared)} --token {token} "
            f"--level {level} --gpus {node.gpus}")


def _stop_on_node(state: ClusterState, node: Node, token: str) -> None:
    """Kill what this check left on the node (its command lines carry the token)."""
    subprocess.run([*ssh_argv(state, node), f"pkill -f -- '--token {token}'"], capture_output=True, timeout=30)


def run_check(state: ClusterState, cluster: Cluster, level: str = "quick", *, quiet_s: float | None = None,
              say: Callable[[str], None] = ui.info) -> CheckReport:
    """Check every node at once; the report, also written to the state dir (check.json)."""
    quiet = QUIET_S[level] if quiet_s is None else quiet_s
    token = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
    at, t0 = iso(now()), time.monotonic()
    watches: list[_Watch] = []
    for node in cluster.nodes:
        proc = subprocess.Popen([*ssh_argv(state, node), node_command(cluster, node, level, token)], text=True, bufsize=1,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        watches.append(_Watch(node, proc, NodeReport(node.name)))
    threads = [threading.Thread(target=fn, daemon=True) for w in watches for fn in (w.read, w.read_stderr)]
    for t in threads:
        t.start()
    try:
        _wait(watches, state, token, quiet, say)
    finally:
        for w in watches:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
    for t in threads:
        t.join(timeout=5)
    nodes = [w.report for w in watches]
    for w in watches:
        if not w.silent:
            analyse.missing([w.report], NODE_CHECKS)
            if not w.done and w.proc.returncode:
                w.report.findings.append(Finding("ssh", "fail", f"the check ended with rc {w.proc.returncode}: "
                                                                f"{''.join(w.stderr).strip()[-200:] or 'no message'}"))
    analyse.clock(nodes, {w.node.name: w.received_at for w in watches if w.received_at is not None})
    analyse.size(nodes)
    analyse.interface(nodes)
    analyse.shared(nodes, _seen_on_master(state, cluster, token), cluster.shared_dir)
    report = CheckReport(cluster.name, level, at, nodes, seconds=round(time.monotonic() - t0, 1))
    records.write(check_file(state), report.to_record())
    return report


def _wait(watches: list[_Watch], state: ClusterState, token: str, quiet: float, say: Callable[[str], None]) -> None:
    pending = list(watches)
    while pending:
        time.sleep(0.2)
        for w in list(pending):
            if w.proc.poll() is not None:
                w.report.seconds = round(time.monotonic() - w.started, 1)
                pending.remove(w)
                say(_line(w))
            elif time.monotonic() - w.last_line > quiet:
                w.silent = True
                w.proc.kill()
                w.proc.wait()
                analyse.silent(w.report, w.step, quiet)
                _stop_on_node(state, w.node, token)
                w.report.seconds = round(time.monotonic() - w.started, 1)
                pending.remove(w)
                say(_line(w))


def _line(w: _Watch) -> str:
    return f"  {w.node.name}: {len(w.report.findings)} check(s) in {w.report.seconds:.1f} s" + (
        f", silent during {w.step or 'start'}" if w.silent else "")


def _seen_on_master(state: ClusterState, cluster: Cluster, token: str) -> set[str] | None:
    """The nodes whose file the master sees in the shared dir; the files go after."""
    where = shlex.quote(f"{cluster.shared_dir}/.deployer-check/{token}")
    try:
        p = subprocess.run([*ssh_argv(state, cluster.master), f"ls -1 {where} 2>/dev/null; rm -rf {where}"],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    return set(p.stdout.split()) if p.returncode == 0 else None


def raise_on_failure(report: CheckReport, cluster: Cluster) -> None:
    """A failing node fails the verb: named, with its reason and the command that replaces it."""
    failed = [n for n in report.nodes if n.verdict == "fail"]
    if not failed:
        return
    said = "; ".join(f"{n.name}: {n.reason()}" for n in failed)
    workers = [n.name for n in failed if n.name != cluster.master.name]
    fix = (f"`deployer up --replace-failed` replaces {', '.join(workers)}" if workers else "")
    if len(workers) < len(failed):
        fix += (" and " if fix else "") + f"the master only when named: `deployer up --replace {cluster.master.name}`"
    raise OperationFailed(f"check failed on {len(failed)} node(s): {said}; {fix}")
