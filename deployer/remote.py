"""Commands on the nodes over SSH: every connection reads the cluster's ssh_config
(deployer/boot.py writes it: cluster key, pinned host keys, the hop through the master)."""

from __future__ import annotations

import shlex
import subprocess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import ClusterState


def ssh_argv(state: "ClusterState", cluster: dict[str, Any], node: dict[str, Any], *, tty: bool = False) -> list[str]:
    """ssh …options… <node name>: the destination last, so callers may add options before it."""
    if not state.ssh_config.exists():  # a state dir from before ssh_config existed
        from .boot import write_access

        write_access(state, cluster)
    return ["ssh", "-F", str(state.ssh_config), *(["-t"] if tty else []), node["name"]]


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
