"""`deployer check`'s report -> Prometheus, through the Pushgateway on the master, for the
"Cluster health" row of the Cluster dashboard (monitoring/grafana/dashboards/cluster.json).

One Pushgateway group per cluster (job="deployer_check", cluster=<name>): the last check
replaces the one before, so the row shows the cluster as it was last checked. Series
(gauges; a status is 0 pass, 1 warn, 2 fail; a skipped check is not pushed):

    deployer_check_verdict{level}                    the cluster's verdict
    deployer_check_node_verdict{node}                each node's
    deployer_check_status{node, check}               each node's checks
    deployer_check_timestamp_seconds{level}          when the check ran
    deployer_check_pair_gbit_s{src, dst}             standard, full: the iperf3 matrix
    deployer_check_node_img_per_sec{node}            standard, full: the straggler step, per node
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge

from .. import pushgateway, ui
from ..errors import OperationFailed
from ..lifetime import parse_iso
from .model import CheckReport

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..credentials import Login
    from ..state import ClusterState

JOB = "deployer_check"
PREFIX = "deployer_check_"
VALUE = {"pass": 0, "warn": 1, "fail": 2}


def registry(report: CheckReport) -> CollectorRegistry:
    reg = CollectorRegistry()
    Gauge(PREFIX + "verdict", "The cluster's verdict at its last check: 0 pass, 1 warn, 2 fail", ("level",),
          registry=reg).labels(report.level).set(VALUE[report.verdict])
    Gauge(PREFIX + "timestamp_seconds", "When the last check started (Unix time)", ("level",),
          registry=reg).labels(report.level).set(parse_iso(report.at).timestamp())
    node = Gauge(PREFIX + "node_verdict", "Each node's verdict at the last check: 0 pass, 1 warn, 2 fail", ("node",), registry=reg)
    status = Gauge(PREFIX + "status", "Each node's checks at the last check: 0 pass, 1 warn, 2 fail", ("node", "check"),
                   registry=reg)
    for n in report.nodes:
        node.labels(n.name).set(VALUE[n.verdict])
        for f in n.findings:
            if f.status in VALUE:
                status.labels(n.name, f.check).set(VALUE[f.status])
    found: dict[str, Any] = {f.check: f.value for f in report.cluster_findings}
    pairs = (found.get("network") or {}).get("pairs") or []
    if pairs:
        pair = Gauge(PREFIX + "pair_gbit_s", "iperf3 rate between two nodes at the last check, Gbit/s", ("src", "dst"),
                     registry=reg)
        for p in pairs:
            if p.get("gbit_s") is not None:
                pair.labels(p["src"], p["dst"]).set(p["gbit_s"])
    rates = (found.get("straggler") or {}).get("img_per_sec") or {}
    if rates:
        img = Gauge(PREFIX + "node_img_per_sec", "The straggler step's images/sec on each node, uncoupled", ("node",),
                    registry=reg)
        for name, rate in rates.items():
            img.labels(name).set(rate)
    return reg


def push_report(gateway_url: str, report: CheckReport, *, login: Login | None = None) -> None:
    pushgateway.push(gateway_url, JOB, registry(report), {"cluster": report.cluster}, "the check's report", login=login)


def publish(state: ClusterState, cluster: Cluster, report: CheckReport) -> bool:
    """The report -> the Pushgateway on the master, through an SSH tunnel. A failure is a
    warning: the report is in the state dir."""
    try:
        pushgateway.push_to_master(state, cluster, lambda url, login: push_report(url, report, login=login))
    except (OperationFailed, OSError) as e:
        ui.warn(f"check not pushed to the Pushgateway ({e}); it is in {state.dir / 'check.json'}")
        return False
    return True
