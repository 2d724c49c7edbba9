"""Why a benchmark run failed, in one line: a timeout, a rank killed by a signal, or a
rank's exception, naming the rank and its node, with that rank's last stderr lines.

Reads what `mpirun --tag-output` prints: every rank's line is prefixed
`[job,rank]<stdout|stderr>:`, and Open MPI reports a dead rank in its own words
("mpirun noticed that process rank 1 with PID 1148 on node 10.77.0.11 exited on
signal 9 (Killed).", or "Process name: [[51033,1],1] / Exit code: 1"). Under Slurm
(bench --via slurm) the lines carry no rank (see deployer/bench/commands.py: sbatch_script), but
srun names a dead task and its node itself ("srun: error: node-1: task 1: Exited with
exit code 1"); its last words are then the last error line anyone printed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster import Node

TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>:\s?(.*)$")
# Open MPI forwards a rank's output in chunks and tags every chunk: a long line (a JSON
# record) can carry a second tag where a chunk ended, in the middle of the line.
ANY_TAG = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr)>:")
SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)(?: \(([^)]+)\))?")
EXITED = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(\d+)", re.S)
SRUN_TASK = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+?)\s*$", re.M)
TIMEOUT_RCS = (124, 137)  # timeout(1): 124, or 137 when it had to SIGKILL (--kill-after)


def untag(line: str) -> tuple[int | None, str | None, str]:
    """(rank, stream, text) of one line; (None, None, line) for a line no rank printed."""
    m = TAG.match(line)
    return (int(m.group(1)), m.group(2), ANY_TAG.sub("", m.group(3))) if m else (None, None, line)


def rank_output(text: str, rank: int, stream: str) -> list[str]:
    return [t for r, s, t in map(untag, text.splitlines()) if r == rank and s == stream]


def _where(rank: int, nodes: list[Node], address: str | None = None) -> str:
    if rank < len(nodes):
        return f"rank {rank} on {nodes[rank].name}"
    return f"rank {rank} on {address}" if address else f"rank {rank}"


def _last_error(lines: list[str], keep: int = 2) -> str:
    """The end of a rank's stderr: its exception line when it has one."""
    lines = [ln.strip() for ln in lines if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^(\[rank\d+\]:\s*)?[A-Za-z_.]*(Error|Exception)\b", ln)]
    picked = errors[-1:] or lines[-keep:]
    return " / ".join(re.sub(r"^\[rank\d+\]:\s*", "", ln)[:240] for ln in picked)


def diagnose(rc: int, out: str, err: str, nodes: list[Node], timeout_s: float) -> str:
    text = out + "\n" + err
    m = SIGNALLED.search(text)
    if m:
        rank, address, sig, name = int(m.group(1)), m.group(2), m.group(3), m.group(4) or "signal"
        why = f"{_where(rank, nodes, address)} was killed by signal {sig} ({name})"
        own = _last_error(rank_output(text, rank, "stderr"))
        return why + (f"; its last words: {own}" if own else "")
    if rc in TIMEOUT_RCS:
        return f"timed out after {timeout_s:.0f}s (raise --timeout, or pick a smaller --profile)"
    srun = SRUN_TASK.findall(text)
    if srun:  # the task that exited is the cause; the others were killed after it (--kill-on-bad-exit)
        node, rank, what = ([t for t in srun if t[2].startswith("Exited")] or srun)[0]
        own = _last_error(
            rank_output(text, int(rank), "stderr") or [ln for ln in err.splitlines() if not ln.startswith(("srun: ", "slurm job "))]
        )
        return f"rank {rank} on {node}: {what[0].lower() + what[1:]}" + (f"; its last words: {own}" if own else "")
    m = EXITED.search(text)
    ranks = (
        [int(m.group(1))]
        if m
        else sorted({r for r, s, t in map(untag, text.splitlines()) if r is not None and s == "stderr" and "Traceback" in t})
    )
    if ranks:
        rank = ranks[0]
        code = f" with exit code {m.group(2)}" if m else ""
        return f"{_where(rank, nodes)} failed{code}: {_last_error(rank_output(text, rank, 'stderr')) or 'no error output'}"
    last = next((ln for ln in reversed(err.splitlines()) if ln.strip()), "no error output")
    return f"exit {rc}: {untag(last)[2].strip()[:200]}"
