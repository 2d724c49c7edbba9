#!/usr/bin/env python3
"""Submit one Slurm batch script and follow it to its end: what `deployer bench --via slurm`
runs on the master for each run of its sweep, and what a user can run by hand:

    python /shared/benchmarks/slurm_job.py /shared/bench/<run>/resnet-dp-2.sbatch

- prints `slurm job <id> submitted`, then, while the job is queued, a progress line
  `PROGRESS {"phase": "queued", "nodes": N, "reason": "Resources"}` (at each change of
  reason and every 30 s), so a queued job reads "waiting for N nodes", not silence. Not
  in a job's first QUIET_S while Slurm gives no reason (Reason=None): every job is
  pending for a moment before it starts;
- streams the job's output file as it grows, and its error file at the end (to stderr);
- exits with the job's exit code; 124 when Slurm ended it at its time limit (as timeout(1)
  does, so the caller says "timed out"); 3 when it was still queued after --queue-timeout;
- SIGINT, SIGTERM or SIGHUP cancel the job (scancel) before exiting.

Slurm is the one source of the job's facts: state, reason, node count, output paths and
exit code are read from `scontrol show job -o`, which keeps a finished job for MinJobAge
(300 s by default), far longer than this script polls.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

FIELD = re.compile(r"(\w+)=(\S*)")
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD"}
TIMED_OUT_RC = 124
QUEUE_TIMEOUT_RC = 3
QUEUED_EVERY_S = 30.0
QUIET_S = 3.0


def job_fields(text: str) -> dict[str, str]:
    """`scontrol show job -o <id>`'s one line as a dict (the first value of a repeated key)."""
    out: dict[str, str] = {}
    for key, value in FIELD.findall(text):
        out.setdefault(key, value)
    return out


def node_count(fields: dict[str, str]) -> int:
    """NumNodes: '2' once running, '2-2' (min-max) while pending."""
    first = fields.get("NumNodes", "").split("-")[0]
    return int(first) if first.isdigit() else 0


def exit_code(fields: dict[str, str]) -> int:
    """The job's exit status the way a shell reports it: ExitCode=rc:signal -> rc, or 128+signal;
    124 for a job Slurm ended at its time limit."""
    state = fields.get("JobState", "")
    if state == "TIMEOUT":
        return TIMED_OUT_RC
    rc, _, sig = fields.get("ExitCode", "0:0").partition(":")
    rc_i, sig_i = int(rc or 0), int(sig or 0)
    if sig_i:
        return 128 + sig_i
    if rc_i == 0 and state != "COMPLETED":  # cancelled, node failure: no exit code of its own
        return 1
    return rc_i


class Follower:
    """Reads new whole lines of a file that another node may still be writing (over NFS:
    reopened at each poll, so the client sees the file's current size)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.offset = 0
        self.partial = ""

    def read(self, *, final: bool = False) -> list[str]:
        try:
            with self.path.open("r", errors="replace") as f:
                f.seek(self.offset)
                chunk = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            chunk = ""
        text = self.partial + chunk
        lines = text.split("\n")
        self.partial = "" if final else lines.pop()
        return [ln for ln in lines if ln or not final]


def scontrol(job: str) -> dict[str, str]:
    p = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    return job_fields(p.stdout) if p.returncode == 0 else {}


def submit(script: str) -> str:
    p = subprocess.run(["sbatch", "--parsable", script], capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit(p.returncode or 1)
    return p.stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"


def follow(job: str, *, poll_s: float, queue_timeout_s: float) -> int:
    out: Follower | None = None
    err: Follower | None = None
    submitted = time.monotonic()
    last_reason, last_said, running = None, -1e9, False
    while True:
        fields = scontrol(job)
        state = fields.get("JobState", "")
        if out is None and fields.get("StdOut"):
            out, err = Follower(fields["StdOut"]), Follower(fields.get("StdErr") or fields["StdOut"])
        if state in QUEUED:
            now = time.monotonic()
            reason = fields.get("Reason", "None")
            worth_saying = reason != "None" or now - submitted >= QUIET_S
            if worth_saying and (reason != last_reason or now - last_said >= QUEUED_EVERY_S):
                print("PROGRESS " + json.dumps({"phase": "queued", "job": job, "nodes": node_count(fields),
                                                "reason": reason, "waited_s": round(now - submitted)}), flush=True)
                last_reason, last_said = reason, now
            if now - submitted > queue_timeout_s:
                subprocess.run(["scancel", job])
                print(f"slurm job {job}: still waiting for {node_count(fields)} node(s) after {queue_timeout_s:.0f} s "
                      f"({reason}); cancelled (raise --queue-timeout, or free the nodes: squeue)", file=sys.stderr)
                return QUEUE_TIMEOUT_RC
        elif state and not running:
            running = True
            print("PROGRESS " + json.dumps({"phase": "running", "job": job, "nodes": fields.get("NodeList", "")}), flush=True)
        # not while queued: the output file may be an earlier job's, until this one starts and truncates it
        if out is not None and state not in QUEUED:
            for line in out.read(final=state in FINAL):
                print(line, flush=True)
        if state in FINAL or not fields:
            if err is not None and out is not None and err.path != out.path:  # set together: out is there when err is
                for line in err.read(final=True):
                    print(line, file=sys.stderr, flush=True)
            if not fields:
                print(f"slurm job {job}: scontrol no longer knows it; its output: {out.path if out else '?'}", file=sys.stderr)
                return 1
            rc = exit_code(fields)
            print(f"slurm job {job} {state} on {fields.get('NodeList', '?')}, exit {rc}", file=sys.stderr)
            return rc
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("script", help="the batch script (its #SBATCH lines say where the output goes)")
    p.add_argument("--queue-timeout", type=float, default=3600.0, help="seconds the job may wait in the queue")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between looks at the job")
    args = p.parse_args(argv)
    job = submit(args.script)
    print(f"slurm job {job} submitted ({args.script})", flush=True)

    def cancel(signum: int, _frame: FrameType | None) -> None:  # Ctrl-C on the caller's side, or its SSH session closing
        subprocess.run(["scancel", job])
        print(f"slurm job {job} cancelled (signal {signum})", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, cancel)
    return follow(job, poll_s=args.poll, queue_timeout_s=args.queue_timeout)


if __name__ == "__main__":
    sys.exit(main())
