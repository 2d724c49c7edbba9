"""`deployer check`: every node checks itself at once (benchmarks/node_check.py over SSH),
one line per node as it finishes, then the nodes are held against each other
(analyse.py) and the report is kept in the state dir (check.json).

A hang is a finding, not a wait: each node says `STEP <check>` before every check and
beats every few seconds; a node silent for QUIET_S is stopped and named with the check it
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
from ..paths import assets_root
from ..remote import MasterRunner, ssh_argv
from . import analyse
from .model import CheckReport, Finding, NodeReport

if TYPE_CHECKING:
    from ..cluster import Cluster, Node
    from ..state import ClusterState

CHECK_FILE = "check.json"
SCRIPT = "benchmarks/node_check.py"
# Seconds a node may stay silent before it is named as hung: node_check.py beats every 5 s
# whatever a check waits for, so silence is a frozen process or a dead connection.
QUIET_S = 30.0
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
    reader: threading.Thread | None = None

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
    """The node's command; the script itself comes on stdin (script_text)."""
    return f"python3 - --shared {shlex.quote(cluster.shared_dir)} --token {token} --level {level} --gpus {node.gpus}"


def script_text() -> str:
    """benchmarks/node_check.py, sent to each node on stdin: it runs whatever state the
    node's shared dir is in (where the copy Ansible keeps lives)."""
    return (assets_root() / SCRIPT).read_text()


def _stop_on_node(state: ClusterState, node: Node, token: str) -> None:
    """Kill what this check left on the node (its command lines carry the token)."""
    subprocess.run([*ssh_argv(state, node), f"pkill -f -- '--token {token}'"], capture_output=True, timeout=30)


def check_now(state: ClusterState, cluster: Cluster, level: str, *, push: bool) -> CheckReport:
    """The check as `deployer check` and the end of every `up` run it: said, then run."""
    ui.step(f"check ({level}): {len(cluster.nodes)} node(s) at once")
    return run_check(state, cluster, level, push=push)


def run_check(state: ClusterState, cluster: Cluster, level: str = "quick", *, push: bool = False,
              quiet_s: float | None = None, say: Callable[[str], None] = ui.info) -> CheckReport:
    """Check every node at once; the report, also written to the state dir (check.json)
    and, with `push` (monitoring on), to the Pushgateway on the master."""
    quiet = QUIET_S if quiet_s is None else quiet_s
    token = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
    at, t0 = iso(now()), time.monotonic()
    watches: list[_Watch] = []
    script = script_text()
    for node in cluster.nodes:
        proc = subprocess.Popen([*ssh_argv(state, node), node_command(cluster, node, level, token)], text=True, bufsize=1,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdin is not None
            proc.stdin.write(script)
            proc.stdin.close()
        except BrokenPipeError:  # the connection is gone already: its rc and stderr say why
            pass
        watches.append(_Watch(node, proc, NodeReport(node.name)))
    threads = []
    for w in watches:
        w.reader = threading.Thread(target=w.read, daemon=True)
        threads += [w.reader, threading.Thread(target=w.read_stderr, daemon=True)]
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
        if w.silent:
            continue
        if not w.done and w.proc.returncode:  # it never ran, or died: that first, then what it did not say
            why = "".join(w.stderr).strip().splitlines()
            w.report.findings.insert(0, Finding("start", "fail", f"the check ended with rc {w.proc.returncode}: "
                                                                 f"{why[-1][-200:] if why else 'no message'}"))
        analyse.missing([w.report], NODE_CHECKS)
    analyse.clock(nodes, {w.node.name: w.received_at for w in watches if w.received_at is not None})
    analyse.size(nodes, cluster.machine)
    analyse.interface(nodes)
    analyse.gpus(nodes, {n.name: n.gpus for n in cluster.nodes})
    analyse.dcgm(nodes)
    seen, mpi = _on_master(state, cluster, token)
    analyse.shared(nodes, seen, cluster.shared_dir)
    found = [mpi]
    if level != "quick":
        found += _cluster_wide(state, cluster, nodes, say)
    report = CheckReport(cluster.name, level, at, nodes, found, seconds=round(time.monotonic() - t0, 1))
    records.write(check_file(state), report.to_record())
    if push:
        from .metrics import publish

        publish(state, cluster, report)
    return report


def _cluster_wide(state: ClusterState, cluster: Cluster, nodes: list[NodeReport], say: Callable[[str], None]) -> list[Finding]:
    """standard and full: the network matrix and the straggler (cluster_checks.py)."""
    from . import cluster_checks

    runner = MasterRunner(state, cluster)
    say(f"  network: iperf3 on {len(cluster_checks.pairs(cluster))} pair(s) of nodes, one at a time")
    found = cluster_checks.network_findings(cluster_checks.measure_network(runner, cluster), nodes, cluster.same_host)
    measured = next((f.value for f in found if f.check == "network"), None) or {}
    slowest = (measured.get("slowest") or {}).get("gbit_s")
    say("  latency: an MPI ping-pong between every pair of nodes, every rank watched")
    found += cluster_checks.latency_findings(*cluster_checks.measure_latency(runner, cluster), nodes)
    say("  collective: an all-reduce over every rank (NCCL_ALGO=Ring), against the slowest link")
    record, why, silent = cluster_checks.measure_collective(runner, cluster)
    found += cluster_checks.collective_findings(record, why, silent, slowest, nodes)
    say("  straggler: the same synthetic step on every rank, each timed on its own")
    return found + cluster_checks.straggler_findings(*cluster_checks.measure_straggler(runner, cluster), nodes,
                                                     cluster.shared_cpus)


MPI_MARK = "--- mpirun"


def _on_master(state: ClusterState, cluster: Cluster, token: str) -> tuple[set[str] | None, Finding]:
    """One SSH round trip to the master for what only it can say: the nodes whose file it
    sees in the shared dir (the files go after; None: it could not look), and whether
    `mpirun -np N --hostfile <shared>/hostfile hostname`, typed as a user would, reaches
    every node."""
    where = shlex.quote(f"{cluster.shared_dir}/.deployer-check/{token}")
    mpirun = f"mpirun -np {len(cluster.nodes)} --hostfile {cluster.shared_dir}/hostfile hostname"
    rc, out, err = MasterRunner(state, cluster).run(f"ls -1 {where} 2>/dev/null; rm -rf {where}; echo '{MPI_MARK}'; {mpirun}",
                                                    timeout=120)
    listed, marked, after = out.partition(MPI_MARK + "\n")
    seen = set(listed.split()) if marked else None
    got = sorted(set(after.split()))
    if rc == 0 and got == sorted(cluster.names):
        return seen, Finding("mpi", "pass", f"`{mpirun}` reached every node", {"reached": got})
    missing = sorted(set(cluster.names) - set(got))
    why = f"missing {', '.join(missing)}" if missing else (err.strip().splitlines() or [f"rc {rc}"])[-1]
    return seen, Finding("mpi", "fail", f"`{mpirun}` on the master: {why}", {"reached": got})


def _wait(watches: list[_Watch], state: ClusterState, token: str, quiet: float, say: Callable[[str], None]) -> None:
    pending = list(watches)
    while pending:
        time.sleep(0.2)
        for w in list(pending):
            if w.proc.poll() is not None:
                w.report.seconds = round(time.monotonic() - w.started, 1)
                if w.reader is not None:
                    w.reader.join(timeout=5)  # its last lines, before it is counted
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


def raise_on_failure(report: CheckReport, cluster: Cluster) -> None:
    """A failing node fails the verb: named, with its reason and the command that replaces
    it; a failing cluster-wide finding (MPI's reach) by its own reason."""
    failed = [n for n in report.nodes if n.verdict == "fail"]
    broken = [f for f in report.cluster_findings if f.status == "fail"]
    if not failed and not broken:
        return
    said = "; ".join([f"{n.name}: {n.reason()}" for n in failed] + [f"{f.check}: {f.detail}" for f in broken])
    workers = [n.name for n in failed if n.name != cluster.master.name]
    fix = f"`deployer up --replace-failed` replaces {', '.join(workers)}" if workers else ""
    if len(workers) < len(failed):
        fix += (" and " if fix else "") + f"the master only when named: `deployer up --replace {cluster.master.name}`"
    where = f" on {len(failed)} node(s)" if failed else ""
    raise OperationFailed(f"check failed{where}: {said}" + (f"; {fix}" if fix else ""))
