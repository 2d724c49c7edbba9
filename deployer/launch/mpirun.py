"""The mpirun line every program run across the cluster from the master starts with
(`deployer bench`'s runs, `deployer check`'s latency and collective), the stop that leaves no
rank running, and the JSON record rank 0 prints. Pure functions: each command is one string a
user could type on the master."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

from ..errors import OperationFailed
from .failure import untag

if TYPE_CHECKING:
    from ..cluster import Cluster


def mpirun_line(cluster: Cluster, hostfile: str, np_: int, timeout_s: int, script: str, args: list[str], *,
                map_by: str = "slot", env: dict[str, str] | None = None) -> str:
    """The mpirun of one benchmark script on `np_` ranks of `hostfile`; `env`: NAME=value
    every rank gets."""
    # why these flags: --bind-to none lets torch use every core of a node (Open MPI
    # binds to one core by default for np <= 2); -x carries the login shell's PATH
    # (the training env's python) and the socket interface to every rank; an unset
    # name is only a warning. timeout --kill-after bounds a hung rank.
    # --tag-output prefixes each line with its rank, so a failure names the rank that died.
    root = " --allow-run-as-root" if cluster.ssh_user == "root" else ""
    extra = "".join(f" -x {k}={v}" for k, v in (env or {}).items())
    return (f"timeout --kill-after=30 {timeout_s} mpirun{root} --tag-output --hostfile {hostfile}"
            f" -np {np_} --map-by {map_by} --bind-to none -x PATH -x GLOO_SOCKET_IFNAME -x NCCL_SOCKET_IFNAME{extra}"
            f" python {cluster.shared_dir}/benchmarks/{script} " + " ".join(args))


def cleanup_cmd(cluster: Cluster, signal: str = "TERM") -> str:
    """Every benchmark process on every node, signalled (KILL: a stopped process too,
    which a TERM would leave pending)."""
    shared = cluster.shared_dir.rstrip("/")
    # why the brackets: the regex [/]shared/... matches the benchmark processes but not
    # this command line (nor the shell running it), so pkill cannot kill itself.
    pattern = f"[{shared[0]}]{shared[1:]}/benchmarks/"
    sig = "" if signal == "TERM" else f"-{signal} "  # TERM: pkill's own default
    remote = shlex.quote(f"pkill {sig}-f {shlex.quote(pattern)}")
    hosts = " ".join(shlex.quote(n.private_ip) for n in cluster.nodes)
    return f"for h in {hosts}; do ssh -o BatchMode=yes -o ConnectTimeout=5 $h {remote}; done; true"


def parse_json_line(stdout: str, what: str) -> dict[str, Any]:
    """The last line of stdout that is a JSON object (rank 0's --json record)."""
    for line in reversed(stdout.splitlines()):
        line = untag(line)[2].strip()
        if line.startswith("{"):
            try:
                record: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                break
            return record
    raise OperationFailed(f"{what} printed no JSON result line")
