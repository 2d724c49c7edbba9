"""The checks no node can make alone (`deployer check --level standard` and full), run
from the master as a user would type them:

- the network: iperf3 between every pair of nodes (a ring and a few random pairs beyond
  8 nodes), one pair at a time; a slow pair is named against the cluster's median rate,
  and a node whose pairs are all slow is the slow node;
- the latency matrix (benchmarks/pingpong.py) and the collective (allreduce.py over every
  rank, held against the slowest link of the same run), every rank watched (launch/rank_watch.py);
- the straggler: the same short synthetic ResNet step on every rank at once without
  gradient exchange (benchmarks/resnet_synthetic.py --mode ensemble), each rank timed on
  its own: under DDP every rank waits for the slowest, so only the uncoupled step shows
  which node is slow. Time-boxed (--seconds-per-iter): every rank starts each window
  together and counts its batches in it, so ranks sharing CPUs are compared over the same
  seconds, not a fast one's alone at the end. A node below the others' median by more
  than the stated margin is named.

Measurements here, verdicts in analyse.py's style: pure functions of the figures, so
they are unit-tested on recorded numbers.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import OperationFailed
from ..launch.iperf import ALL_PAIRS_UP_TO, net_pairs, pair_cmd, parse_iperf
from ..launch.mpirun import mpirun_line, parse_json_line
from ..launch.rank_watch import HEARTBEAT_S, QUIET_S, Silent, run_watched
from .model import Finding, NodeReport, Status

if TYPE_CHECKING:
    from ..cluster import Cluster, Node
    from ..remote import Runner

RANDOM_PAIRS = 8  # beyond ALL_PAIRS_UP_TO nodes, besides the ring
# A pair or node slower than these shares of the cluster's median: warned, failed.
NET_WARN, NET_FAIL = 0.75, 0.5
# A rank's own step rate below these shares of the other nodes' median: warned, failed.
STRAGGLER_WARN, STRAGGLER_FAIL = 0.75, 0.5
STRAGGLER_ARGS = ["--mode", "ensemble", "--model", "resnet18", "--image-size", "32", "--batch-size", "4",
                  "--num-warmup-batches", "2", "--num-iters", "3", "--seconds-per-iter", "4"]


def pairs(cluster: Cluster, seed: int = 0) -> list[tuple[Node, Node]]:
    """bench --net's pairs (every pair up to 8 nodes, else the ring: each node twice), and
    beyond 8 a few random pairs more, the same on every run: a ring alone never pairs
    nodes apart, and a slow path between them is what an all-reduce's tree would take."""
    ring = net_pairs(cluster)
    if len(cluster.nodes) <= ALL_PAIRS_UP_TO:
        return ring
    nodes, taken = list(cluster.nodes), {frozenset((a.name, b.name)) for a, b in ring}
    others = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:] if frozenset((a.name, b.name)) not in taken]
    return ring + random.Random(seed).sample(others, min(RANDOM_PAIRS, len(others)))


def _last_words(err: str, rc: int, keep: int = 300) -> str:
    """What a failed command said last (its stderr's last line), else its exit status."""
    return (err.strip().splitlines() or [f"rc {rc}"])[-1][-keep:]


def measure_network(runner: Runner, cluster: Cluster) -> list[dict[str, Any]]:
    """iperf3 rate of each pair (Gbit/s; None and the error when it failed)."""
    out = []
    for a, b in pairs(cluster):
        rc, stdout, stderr = runner.run(pair_cmd(a.private_ip, b.private_ip), timeout=90)
        try:
            rate: float | None = parse_iperf(stdout) if rc == 0 else None
        except (ValueError, KeyError):
            rate = None
        out.append({"src": a.name, "dst": b.name, "gbit_s": rate,
                    **({} if rate is not None else {"error": _last_words(stderr, rc, 200)})})
    return out


def network_findings(measured: list[dict[str, Any]], nodes: list[NodeReport],
                     same_host: Callable[[str, str], bool | None] | None = None) -> list[Finding]:
    """Per node (appended to its report): its best pair against the median of the pairs it
    is not in (a slow node drags the median of all pairs down with it); for the cluster:
    the matrix and the slowest pair against the other pairs' median.

    `same_host` (cluster.same_host) tells pairs on one host from pairs across hosts: two
    VMs on one hypervisor talk through its bridge, at no link's rate, so where the matrix
    has both, only the cross-host pairs are held against each other (a node with a fast
    same-host pair is not the slow one for it, nor is the others' median raised by it) and
    the same-host pairs are reported beside them."""
    for p in measured:
        p["same_host"] = same_host(p["src"], p["dst"]) if same_host else None
    rated_all = [p for p in measured if p["gbit_s"] is not None]
    cross = [p for p in rated_all if p["same_host"] is not True]
    # Only when the matrix has both kinds: a cluster on one host (local) compares its own.
    rated = cross if cross and len(cross) < len(rated_all) else rated_all
    local = [p for p in rated_all if p not in rated]
    for n in nodes:
        mine = [p["gbit_s"] for p in rated if n.name in (p["src"], p["dst"])]
        failed = [p for p in measured if p["gbit_s"] is None and n.name in (p["src"], p["dst"])]
        if failed and not mine and not any(n.name in (p["src"], p["dst"]) for p in local):
            n.findings.append(Finding("network", "fail", f"iperf3 failed on every pair: {failed[0].get('error')}"))
            continue
        rest = [p["gbit_s"] for p in rated if n.name not in (p["src"], p["dst"])]
        if not mine or not rest:  # two nodes: one pair, nothing to hold it against (or only same-host pairs)
            said = f"{max(mine, default=0):.2f} Gbit/s" if mine else _same_host_said(n.name, local)
            n.findings.append(Finding("network", "pass", said, {"gbit_s": mine}))
            continue
        best, median = max(mine), statistics.median(rest)
        status: Status = "fail" if best < NET_FAIL * median else "warn" if best < NET_WARN * median else "pass"
        said = (f"{best:.2f} Gbit/s at best, the other pairs' median is {median:.2f}: the slow node" if status != "pass"
                else f"{best:.2f} Gbit/s at best (the other pairs' median {median:.2f})")
        n.findings.append(Finding("network", status, said, {"gbit_s": mine, "others_median_gbit_s": median}))
    if not rated:
        return [Finding("network", "fail", "no pair of nodes could be measured", {"pairs": measured})]
    slowest = min(rated, key=lambda p: p["gbit_s"])
    others = [p["gbit_s"] for p in rated if p is not slowest]
    median = statistics.median(others) if others else slowest["gbit_s"]
    slow = slowest["gbit_s"] < NET_FAIL * median  # one pair: noisier than a node's best, so only a clear gap
    across = " across hosts" if local else ""
    said = (f"{len(rated)} pair(s){across}; slowest {slowest['src']} - {slowest['dst']} {slowest['gbit_s']:.2f} Gbit/s, "
            f"the others' median {median:.2f}")
    if local:
        said += (f"; {len(local)} pair(s) on one host (its bridge, not the network: not compared), median "
                 f"{statistics.median(p['gbit_s'] for p in local):.2f} Gbit/s")
    return [Finding("network", "warn" if slow else "pass", said + (": a slow link" if slow else ""),
                    {"pairs": measured, "median_gbit_s": statistics.median(p["gbit_s"] for p in rated), "slowest": slowest,
                     **({"same_host_median_gbit_s": statistics.median(p["gbit_s"] for p in local)} if local else {})})]


def _same_host_said(name: str, local: list[dict[str, Any]]) -> str:
    rates = [p["gbit_s"] for p in local if name in (p["src"], p["dst"])]
    return f"{max(rates):.2f} Gbit/s at best, on one host (its bridge, not compared)" if rates else "no pair measured"


def measure_straggler(runner: Runner, cluster: Cluster,
                      quiet_s: float | None = None) -> tuple[dict[str, float] | None, str, Silent | None]:
    """img/s of each node's ranks on their own (None and why when the run failed), every
    rank watched (a rank silent for the quiet time is named and the run stopped)."""
    cmd, ranks = _mpirun(cluster, "resnet_synthetic.py", " ".join(STRAGGLER_ARGS))
    rc, out, err, silent = run_watched(runner, cluster, cmd, ranks, quiet_s=quiet_s or QUIET_S, timeout=660)
    record = _json_of(out, "resnet_synthetic")
    if silent is not None or rc != 0 or record is None:
        return None, _last_words(err, rc), silent
    rates: dict[str, float] = defaultdict(float)
    hosts = {n.private_ip: n.name for n in cluster.nodes} | {n.name: n.name for n in cluster.nodes}
    for r in record["ranks"]:
        rates[hosts.get(r["host"], r["host"])] += r["img_per_sec"]
    return dict(rates), "", None


def _stopped(check: str, what: str, silent: Silent, nodes: list[NodeReport]) -> list[Finding]:
    """A rank fell silent: its node fails `check`, and so does the cluster's finding."""
    for n in nodes:
        if n.name == silent.node:
            n.findings.append(Finding(check, "fail", silent.said()))
    return [Finding(check, "fail", f"{what} stopped: {silent.said()}")]


def straggler_findings(rates: dict[str, float] | None, why: str, silent: Silent | None,
                       nodes: list[NodeReport], shared_cpus: int | None = None) -> list[Finding]:
    """Each node's uncoupled rate against the other nodes' median. Where the nodes share
    one machine's cores (local, fewer cores than nodes), a slow node is where the load
    sits (the master carries the SSH hops and the monitoring), not a bad node: it warns,
    never fails."""
    if silent is not None:
        return _stopped("straggler", "the synthetic step", silent, nodes)
    if rates is None:
        return [Finding("straggler", "fail", f"the synthetic step did not run on every node: {why}")]
    for n in nodes:
        others = [r for name, r in rates.items() if name != n.name]
        mine = rates.get(n.name)
        if mine is None or not others:
            continue
        median = statistics.median(others)
        share = mine / median if median else 1.0
        status: Status = "fail" if share < STRAGGLER_FAIL and not shared_cpus else "warn" if share < STRAGGLER_WARN else "pass"
        said = f"{mine:.1f} img/s on its own, {share:.0%} of the other nodes' median ({median:.1f})" + (
            f" (the nodes share {shared_cpus} cores)" if shared_cpus and status != "pass" else "")
        n.findings.append(Finding("straggler", status, said + (": the straggler" if status != "pass" else ""),
                                  {"img_per_sec": mine, "others_median": median}))
    return [Finding("straggler", "pass", f"the same step on every node: {len(rates)} node(s) timed", {"img_per_sec": rates})]


# --- latency and the collective, each run under the watch of every rank (launch/rank_watch.py) ----

# A node whose best latency to the others is above this many times the other pairs' median
# (and by more than LATENCY_SLACK_US: microseconds of noise are no finding): warned.
LATENCY_WARN, LATENCY_SLACK_US = 3.0, 50.0
# The all-reduce's bus bandwidth at its largest size against the slowest link measured in
# the same run (warned, failed below these shares): NCCL's ring carries about the link's
# rate; gloo or MPI on CPUs move every byte through the CPU, sending and receiving at once
# (0.33 of the one-way iperf3 rate on 3 LXC nodes here, 2026-11-25; allreduce.py says why).
COLLECTIVE_FLOOR = {"nccl": (0.5, 0.25), "cpu": (0.15, 0.05)}


def _mpirun(cluster: Cluster, script: str, args: str, map_by: str = "slot") -> tuple[str, list[Node]]:
    """The mpirun line of a check's MPI program, and the node of each rank (--map-by node:
    one rank per node). NCCL_ALGO=Ring: a tree can report more bus bandwidth than the wire
    carries (and gloo ignores it)."""
    ranks = list(cluster.nodes) if map_by == "node" else cluster.rank_nodes(len(cluster.nodes))
    return mpirun_line(cluster, f"{cluster.shared_dir}/hostfile", len(ranks), 600, script,
                       [args, "--json", f"--heartbeat {HEARTBEAT_S:g}"], map_by=map_by, env={"NCCL_ALGO": "Ring"}), ranks


def _json_of(out: str, benchmark: str) -> dict[str, Any] | None:
    """Rank 0's --json record of `benchmark` (None: it printed none)."""
    try:
        record = parse_json_line(out, benchmark)
    except OperationFailed:
        return None
    return record if record.get("benchmark") == benchmark else None


def measure_latency(runner: Runner, cluster: Cluster, quiet_s: float = QUIET_S) -> tuple[dict[str, Any] | None, str, Silent | None]:
    """benchmarks/pingpong.py, one rank per node: (its record, why it failed, a silent rank)."""
    cmd, ranks = _mpirun(cluster, "pingpong.py", "--iters 200", map_by="node")
    rc, out, err, silent = run_watched(runner, cluster, cmd, ranks, quiet_s=quiet_s, timeout=660)
    record = _json_of(out, "pingpong")
    why = "" if rc == 0 and record else _last_words(err, rc)
    return (record if not why else None), why, silent


def latency_findings(record: dict[str, Any] | None, why: str, silent: Silent | None,
                     nodes: list[NodeReport]) -> list[Finding]:
    """Per node: its best latency against the other pairs' median; for the cluster: the matrix."""
    if silent is not None:
        return _stopped("latency", "the latency matrix", silent, nodes)
    if record is None:
        return [Finding("latency", "fail", f"the latency matrix did not run: {why}")]
    hosts = record["hosts"]
    pairs = [{"a": hosts[p["a"]], "b": hosts[p["b"]], "us": p["us"]} for p in record["pairs"]]
    for n in nodes:
        mine = [p["us"] for p in pairs if n.name in (p["a"], p["b"])]
        rest = [p["us"] for p in pairs if n.name not in (p["a"], p["b"])]
        if not mine or not rest:
            continue
        best, median = min(mine), statistics.median(rest)
        slow = best > LATENCY_WARN * median and best - median > LATENCY_SLACK_US
        n.findings.append(Finding("latency", "warn" if slow else "pass",
                                  f"{best:.0f} us at best, the other pairs' median {median:.0f} us"
                                  + (": the slow node" if slow else ""), {"us": mine}))
    median = statistics.median(p["us"] for p in pairs) if pairs else 0.0
    return [Finding("latency", "pass", f"{len(pairs)} pair(s), median {median:.0f} us", {"pairs": pairs})]


def measure_collective(runner: Runner, cluster: Cluster,
                       quiet_s: float = QUIET_S) -> tuple[dict[str, Any] | None, str, Silent | None]:
    """benchmarks/allreduce.py over every rank, 1 MB to 64 MB."""
    cmd, ranks = _mpirun(cluster, "allreduce.py", "-b 1M -e 64M -f 8 -n 5 -w 2")
    rc, out, err, silent = run_watched(runner, cluster, cmd, ranks, quiet_s=quiet_s, timeout=660)
    record = _json_of(out, "allreduce")
    why = "" if record else _last_words(err, rc)
    return record, why, silent


def collective_findings(record: dict[str, Any] | None, why: str, silent: Silent | None,
                        link_gbit_s: float | None, nodes: list[NodeReport]) -> list[Finding]:
    """The all-reduce over every node: correct, and its bus bandwidth against the slowest
    link of the same run (the floor is a share of what this cluster's wire carries)."""
    if silent is not None:
        return _stopped("collective", "the all-reduce", silent, nodes)
    if record is None or not record.get("rows"):
        return [Finding("collective", "fail", f"the all-reduce did not run: {why}")]
    if record.get("wrong"):
        return [Finding("collective", "fail", f"the all-reduce summed wrong: {record['wrong']} element(s) differ",
                        {"rows": record["rows"]})]
    top = max(record["rows"], key=lambda r: r["bytes"])
    busbw = top["busbw_gb_s"]
    value = {"library": record.get("library"), "busbw_gb_s": busbw, "bytes": top["bytes"], "link_gbit_s": link_gbit_s}
    said = f"{record.get('library', '?')} all-reduce of {top['bytes'] >> 20} MB over {record['world_size']} rank(s): " \
           f"{busbw:.2f} GB/s bus bandwidth"
    if not link_gbit_s:
        return [Finding("collective", "pass", said + " (no link rate to hold it against)", value)]
    share = busbw / (link_gbit_s / 8)
    value["link_share"] = round(share, 3)
    warn, fail = COLLECTIVE_FLOOR["nccl" if record.get("library") == "nccl" else "cpu"]
    status: Status = "fail" if share < fail else "warn" if share < warn else "pass"
    return [Finding("collective", status, f"{said}, {share:.0%} of the slowest link ({link_gbit_s:.2f} Gbit/s)"
                    + (": far below what the wire carries" if status != "pass" else ""), value)]
