"""`status`, and what it and `down` read first: which provider made the cluster.

Kept light (no Terraform, Ansible or spec models at import): `deployer status` on 8
nodes answers in well under half a second (scripts/bench_status.py); each node's health,
read through the master in one SSH session, adds about half a second (docs/check.md).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from . import lifetime
from .origin import origin_of
from .pipeline import drift
from .pipeline.placement import located
from .providers import get_provider
from .state import ClusterState

if TYPE_CHECKING:
    from .cluster import Cluster


def _tcp(host: str, timeout: float = 1.5) -> bool:
    # A completed TCP handshake on port 22: sshd listens. (Waiting for its banner too
    # would cost a fork and exec of sshd per node, a third of status' time.)
    try:
        with socket.create_connection((host, 22), timeout=timeout):
            return True
    except OSError:
        return False


class _Probes:
    """TCP probes of every node, started at once in daemon threads: they run while the
    provider is asked what exists, and a probe of a node that turns out to be stopped is
    never waited for (an address with nobody behind it takes the whole timeout)."""

    def __init__(self, cluster: Cluster):
        self.results: dict[str, bool] = {}
        self.threads = {n.name: threading.Thread(target=self._probe, args=(n.name, n.address), daemon=True)
                        for n in cluster.nodes}
        for t in self.threads.values():
            t.start()

    def _probe(self, name: str, host: str) -> None:
        self.results[name] = _tcp(host)

    def get(self, names: list[str]) -> dict[str, bool]:
        for n in names:
            self.threads[n].join()
        return {n: self.results[n] for n in names}


def _through_master(cluster: Cluster, state: ClusterState, running: list[str], master_up: bool) -> dict[str, bool]:
    """access: via_master — the workers probed from the master, in one SSH session."""
    master = cluster.master
    wanted = [n for n in cluster.nodes if n.name in running]
    if not master_up:
        return {n.name: False for n in wanted}
    probe = " ; ".join(f"(exec 3<>/dev/tcp/{n.private_ip}/22) 2>/dev/null && echo {n.name}" for n in wanted if n is not master)
    from .remote import MasterRunner

    _, out, _ = MasterRunner(state, cluster).run(probe or "true", timeout=20)
    up = set(out.split())
    return {n.name: (n is master or n.name in up) for n in wanted}


def status(state: ClusterState) -> dict[str, Any] | None:
    """Per node: ok · stopped · missing · replaced (needs configure) · unreachable, from
    the provider's observation, the configuration record and an SSH probe of what runs."""
    cluster = state.cluster()
    origin = origin_of(state)
    if cluster is None or origin is None:
        return None
    provider_name, env = origin
    direct = cluster.access != "via_master"
    record = state.configured()
    # Never configured (`up --no-setup`): every running node is new whatever answers, so
    # nothing is probed (a server that has not booted would hold status for its timeout).
    probes = _Probes(cluster if direct else replace(cluster, nodes=(cluster.master,))) if record else None
    seen = get_provider(provider_name).observe(state, env, cluster.names)
    running = [n for n, m in seen.nodes.items() if m.state == "running"]
    if probes is None:
        reach: dict[str, bool] = {}
    elif direct:
        reach = probes.get(running)
    else:
        master = cluster.master.name
        reach = _through_master(cluster, state, running, master in running and probes.get([master])[master])
    states = drift.node_states(cluster, seen, record, reach)
    # Where each node runs now (a migration moves it), else where it ran when recorded.
    cluster = located(cluster, seen)
    node_health = health_of(state, cluster, reach.get(cluster.master.name, False))
    replaced = last_replacements(state)
    return {
        "name": cluster.name,
        "id": state.cluster_id,  # what the cloud's metadata and tags carry (origin.json)
        "provider": cluster.provider,
        "nodes": [
            asdict(n) | {"state": states[n.name], "reachable": reach.get(n.name, False),
                         "health": node_health.get(n.name), "last_replacement": replaced.get(n.name)}
            for n in cluster.nodes
        ],
        "extra": seen.extra,
        "lifetime": lifetime_of(state),
        "check": check_of(state),
    }


def health_of(state: ClusterState, cluster: Cluster, master_up: bool) -> dict[str, dict[str, Any]]:
    """Each node's last health run (deployer/health.py), read through the master in one SSH
    session; {} where the master does not answer or health is off."""
    spec = state.spec() if master_up else None
    if spec is None or not spec.health.enabled:
        return {}
    from . import health

    found, clock = health.read(state, cluster, timeout=20)
    at = clock or time.time()
    return {name: h.to_json(at) | {"said": health.describe(h, at)} for name, h in found.items()}


def last_replacements(state: ClusterState) -> dict[str, str]:
    """When `heal` last replaced each node (the ledger's heal lines)."""
    from . import ledger

    return {e["node"]: e["time"] for e in ledger.entries(state.root)
            if e.get("event") == "heal" and e["cluster"] == state.name and e.get("node")}


def check_of(state: ClusterState) -> dict[str, Any] | None:
    """The last `deployer check` (every `up` ends with one): its verdict, level, time, and
    the nodes it failed or warned about; None: none yet."""
    from .check.run import last_report

    report = last_report(state)
    if report is None:
        return None
    return {"verdict": report.verdict, "level": report.level, "at": report.at,
            "failed": {n.name: n.reason() for n in report.nodes if n.verdict == "fail"},
            "warned": {n.name: n.reason() for n in report.nodes if n.verdict == "warn"}}


def lifetime_of(state: ClusterState) -> dict[str, Any] | None:
    """The expiry `--ttl` set, with the seconds left (negative once expired); None: no expiry."""
    record = state.lifetime()
    if record is None:
        return None
    return {"ttl": record.ttl, "expires_at": record.expires_at,
            "seconds_left": round(lifetime.seconds_left(record, lifetime.now()) or 0)}


def by_host(nodes: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    """`status --json`'s nodes grouped by host, the master's host first; None: not known."""
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for n in nodes:
        groups.setdefault(n.get("host"), []).append(n)
    return groups


def _short(host: str | None) -> str:
    """A host for the table: a hostId (56 hex digits) cut to its first 12, as git does."""
    if host is None:
        return "-"
    return host[:12] if len(host) == 56 and all(c in "0123456789abcdef" for c in host) else host


def show(info: dict[str, Any]) -> None:
    """`deployer status` for a person: the node table, the time left, what to do next."""
    from rich.table import Table

    from . import ui

    t = Table(title=f"cluster {info['name']} ({info['provider']}, id {info.get('id') or '-'})")
    for col in ("host", "name", "role", "private_ip", "public_ip", "gpus", "state"):
        t.add_column(col)
    for host, nodes in by_host(info["nodes"]).items():
        for i, n in enumerate(nodes):
            colour = "green" if n["state"] == "ok" else "red"
            t.add_row(_short(host) if i == 0 else "", n["name"], n["role"], n["private_ip"], n["public_ip"] or "-",
                      str(n["gpus"]), f"[{colour}]{n['state']}[/]", end_section=i == len(nodes) - 1)
    ui.out.print(t)
    hosts = by_host(info["nodes"])
    if len(info["nodes"]) > 1 and None not in hosts:
        zones = sorted({n.get("zone") for n in info["nodes"] if n.get("zone")})
        ui.info(f"{len(info['nodes'])} node(s) on {len(hosts)} host(s)" + (f", zone {', '.join(zones)}" if zones else ""))
    for n in info["nodes"]:
        h = n.get("health")
        if h:
            said = f"health {n['name']}: {h['said']}" + (
                f" (replaced by heal at {n['last_replacement']})" if n.get("last_replacement") else "")
            (ui.warn if h["stale"] or h["verdict"] == "fail" else ui.info)(said)
    if any(n.get("health") and n["health"]["verdict"] == "fail" and not n["health"]["stale"] for n in info["nodes"]):
        ui.info("`deployer heal --yes` replaces a node failing longer than health.grace and proves it with the standard check")
    life = info.get("lifetime")
    if life:
        left = life["seconds_left"]
        if left > 0:
            ui.info(f"expires in {lifetime.human(left)} (at {life['expires_at']}, ttl {life['ttl']}); "
                    f"`deployer up --ttl {life['ttl']}` extends it from now")
        else:
            ui.warn(f"expired {lifetime.human(left)} ago (at {life['expires_at']}); `deployer gc --yes` destroys it, "
                    "`deployer up --ttl 8h` keeps it 8h more")
    check = info.get("check")
    if check:
        said = f"last check ({check['level']}, {check['at']}): {check['verdict']}"
        for name, reason in {**check["failed"], **check["warned"]}.items():
            said += f"; {name}: {reason}"
        (ui.warn if check["verdict"] != "pass" else ui.info)(said + ("; `deployer up --replace-failed` replaces what failed"
                                                                      if check["failed"] else ""))
    for extra in info["extra"]:
        ui.warn(
            f"{extra} exists but is not in the cluster record (left by an interrupted scale-in?); "
            "`deployer up` removes nothing it does not know"
        )
    if any(n["state"] != "ok" for n in info["nodes"]):
        ui.info("`deployer up` starts stopped nodes, recreates missing ones and configures replaced ones")
