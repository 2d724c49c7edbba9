"""Commands on the nodes over SSH, with the cluster key and pinned host keys."""

from __future__ import annotations

import shlex
import subprocess
from typing import TYPE_CHECKING, Any

from .inventory import node_address, ssh_options

if TYPE_CHECKING:
    from .state import ClusterState


def ssh_argv(state: "ClusterState", cluster: dict[str, Any], node: dict[str, Any], *, tty: bool = False) -> list[str]:
    argv = ["ssh", *ssh_options(state, cluster, node)]
    if tty:
        argv.append("-t")
    return [*argv, f"{cluster['ssh_user']}@{node_address(cluster, node)}"]


def login_shell(cmd: str) -> str:
    # A login shell, so the training venv and gloo/NCCL settings from /etc/profile.d apply.
    return "bash -lc " + shlex.quote(cmd)


class MasterRunner:
    """Runs one shell command on the master as the cluster user (deployer.bench's Runner)."""

    def __init__(self, state: "ClusterState", cluster: dict[str, Any]):
        self.argv = ssh_argv(state, cluster, cluster["nodes"][0])

    def run(self, cmd: str, *, timeout: float) -> tuple[int, str, str]:
        try:
            p = subprocess.run([*self.argv, login_shell(cmd)], text=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            return 124, out, f"timed out after {timeout:.0f}s"
        return p.returncode, p.stdout, p.stderr
