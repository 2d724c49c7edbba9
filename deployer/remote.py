"""Commands on the nodes over SSH: every connection reads the cluster's ssh_config
(deployer/pipeline/boot.py writes it: cluster key, pinned host keys, the hop through the master)."""

from __future__ import annotations

import shlex
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .cluster import Cluster, Node
    from .state import ClusterState


def ssh_argv(state: "ClusterState", node: Node, *, tty: bool = False) -> list[str]:
    """ssh …options… <node name>: the destination last, so callers may add options before it."""
    return ["ssh", "-F", str(state.ssh_config), *(["-t"] if tty else []), node.name]


def login_shell(cmd: str) -> str:
    # A login shell, so the training venv and gloo/NCCL settings from /etc/profile.d apply.
    return "bash -lc " + shlex.quote(cmd)


def stream(argv: Sequence[str], *, timeout: float, on_line: Callable[[str], None] | None = None,
           env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run argv; hand each stdout line to `on_line` as it comes; (rc, stdout, stderr).
    Past `timeout` the process is killed and rc is 124, as timeout(1) reports it."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, env=env, bufsize=1)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
    reader.start()
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    out: list[str] = []
    try:
        for line in proc.stdout or []:
            out.append(line)
            if on_line:
                on_line(line.rstrip("\n"))
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:  # interrupted while reading: leave no child behind
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    if expired.is_set():
        return 124, "".join(out), f"timed out after {timeout:.0f}s"
    return proc.returncode, "".join(out), "".join(err)


class Runner(Protocol):
    """What bench and check run their commands with: MasterRunner, or a test's stand-in."""

    def run(self, cmd: str, *, timeout: float, on_line: Callable[[str], None] | None = None) -> tuple[int, str, str]:
        """Run `cmd` in a bash login shell on the master as the cluster user: rc, stdout,
        stderr; each stdout line also goes to `on_line` as it arrives."""
        ...


class MasterRunner:
    """Runs one shell command on the master as the cluster user (a Runner)."""

    def __init__(self, state: "ClusterState", cluster: Cluster):
        self.argv = ssh_argv(state, cluster.master)

    def run(self, cmd: str, *, timeout: float, on_line: Callable[[str], None] | None = None) -> tuple[int, str, str]:
        return stream([*self.argv, login_shell(cmd)], timeout=timeout, on_line=on_line)
