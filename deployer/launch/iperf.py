"""iperf3 between nodes, typed on the master: which pairs to measure, the command for one
pair, and its Gbit/s. `deployer bench --net` and `deployer check`'s network matrix measure the
same way, so their figures compare."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cluster import Cluster, Node


def iperf_cmd(worker_ip: str, bidir: bool = False) -> str:
    ip = shlex.quote(worker_ip)
    return (f"ssh -o BatchMode=yes {ip} iperf3 -s -1 -D && sleep 1 && "
            f"timeout 30 iperf3 -c {ip} -J -t 3" + (" --bidir" if bidir else ""))


ALL_PAIRS_UP_TO = 8  # n(n-1)/2 pairs: 28 at 8 nodes, about 2 minutes; a ring beyond


def net_pairs(cluster: Cluster) -> list[tuple[Node, Node]]:
    """(src, dst) node pairs to measure: every pair up to 8 nodes, else a ring."""
    nodes = cluster.nodes
    if len(nodes) <= ALL_PAIRS_UP_TO:
        return [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    return [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]


def pair_cmd(src_ip: str, dst_ip: str) -> str:
    """iperf3 from src to dst, typed on the master: a one-shot server on dst, the client on src."""
    src, dst = shlex.quote(src_ip), shlex.quote(dst_ip)
    return (f"ssh -o BatchMode=yes {dst} iperf3 -s -1 -D && sleep 1 && "
            f"ssh -o BatchMode=yes {src} timeout 30 iperf3 -c {dst} -J -t 2")


def parse_iperf(stdout: str) -> float:
    """Gbit/s received, from iperf3 -J; with --bidir the slower of the two directions."""
    end = json.loads(stdout[stdout.index("{"):])["end"]
    rates: list[float] = [end[k]["bits_per_second"] for k in ("sum_received", "sum_received_bidir_reverse") if k in end]
    return min(rates) / 1e9
