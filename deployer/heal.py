"""`deployer heal`: replace the nodes health has found failing for longer than health.grace.

From the user's machine, by hand or from cron (like `gc`): every node's last health run is
read through the master (deployer/health.py); a node failing for longer than the grace is
drained (Slurm: its running jobs end first, or `--now`), replaced by the same path as
`up --replace-failed` (Terraform -replace, Ansible on that node), proved by the standard
check against the others, and resumed only when that passes. The policy (spec `health`):
at most max_replacements_per_day per cluster (counted in the ledger), the master only when
named, nothing while another verb holds the cluster's lock. Every replacement is a ledger
line with the node-hours lost (from the first failed run until the node took work again).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import ledger, ui
from .errors import DeployerError, UsageError
from .health import NodeHealth
from .lifetime import human, iso, now, parse_iso

if TYPE_CHECKING:
    from .cluster import Cluster
    from .spec import ClusterSpec, HealthSpec
    from .state import ClusterState

HEAL_REASON = "deployer heal:"  # health's resume leaves a drain with this prefix alone
DAY = timedelta(hours=24)


@dataclass
class Decision:
    node: str
    action: str  # replace · prove (heal drained it, it passes now) · wait (inside the grace) · limit · master · ok
    why: str
    failing_for_s: float = 0.0
    failing_since: float | None = None
    result: str | None = None  # what heal did: replaced · check failed · drain refused ...


def replacements_today(root: Path, cluster: str, at: datetime | None = None) -> int:
    """Heal's replacements of this cluster in the last 24 hours (the ledger's heal lines)."""
    t = at or now()
    return sum(1 for e in ledger.entries(root)
               if e.get("event") == "heal" and e["cluster"] == cluster and t - parse_iso(e["time"]) < DAY)


def plan(health: dict[str, NodeHealth], cluster: Cluster, policy: HealthSpec, node_now: float,
         done_today: int, named: list[str], held: frozenset[str] = frozenset()) -> list[Decision]:
    """What heal does with each node, by the policy; pure (unit-tested). `held`: the nodes
    drained with heal's reason (a replacement whose check failed, or a heal interrupted):
    proved again, and resumed, once their health passes."""
    out: list[Decision] = []
    budget = max(0, policy.max_replacements_per_day - done_today)
    for n in cluster.nodes:
        h = health[n.name]
        if n.name in held and h.verdict in ("pass", "warn") and not h.stale(node_now):
            out.append(Decision(n.name, "prove", "heal drained it and its health passes: the standard check again"))
            continue
        if h.verdict != "fail" or h.stale(node_now):
            # A node whose health stopped reporting is not judged by an old record: the
            # NodeHealthStale alert and `status` say so.
            out.append(Decision(n.name, "ok", "passing" if h.verdict != "fail" else "health stopped reporting"))
            continue
        since = h.failing_for(node_now)
        d = Decision(n.name, "replace", h.reason, since, h.failing_since)
        if since < policy.grace_s:
            d.action, d.why = "wait", f"failing for {human(since)}, inside the grace of {policy.grace}: {h.reason}"
        elif n.role == "master" and n.name not in named:
            d.action, d.why = "master", (f"the master fails ({h.reason}); it holds the shared storage and the "
                                         f"monitoring and is replaced only when named: `deployer heal {n.name}`")
        elif budget <= 0:
            d.action, d.why = "limit", (f"failing for {human(since)} ({h.reason}), but {policy.max_replacements_per_day} "
                                        f"replacement(s) in 24 h is the limit (health.max_replacements_per_day): left alone")
        else:
            budget -= 1
        out.append(d)
    return out


def _slurm(state: ClusterState, cluster: Cluster, cmd: str, timeout: float = 60) -> tuple[int, str]:
    from .remote import MasterRunner

    rc, out, err = MasterRunner(state, cluster).run(cmd, timeout=timeout)
    return rc, (out + err).strip()


def drain(state: ClusterState, cluster: Cluster, node: str, why: str, wait_jobs: bool) -> None:
    """Drain `node` with heal's reason (health's timer never resumes it), then wait for its
    running jobs to end unless --now."""
    reason = f"{HEAL_REASON} replacing: {why}"[:250]
    rc, out = _slurm(state, cluster, f"sudo -n scontrol update nodename={shlex.quote(node)} state=drain "
                                     f"reason={shlex.quote(reason)}")
    if rc != 0:
        raise DeployerError(f"heal: could not drain {node} in Slurm: {out.splitlines()[-1] if out else rc}")
    if not wait_jobs:
        return
    said = False
    while True:
        rc, out = _slurm(state, cluster, f"squeue --noheader --nodelist={shlex.quote(node)} --format=%i")
        jobs = out.split() if rc == 0 else []
        if not jobs:
            return
        if not said:
            ui.info(f"heal: {node} is drained; waiting for its {len(jobs)} running job(s) to end (--now does not wait)")
            said = True
        time.sleep(10)


RESPOND_WAIT_S = 120  # past slurmctld's next ping (SlurmdTimeout/3: 100 s by default)


def resume(state: ClusterState, cluster: Cluster, node: str) -> str:
    """Resume `node` in Slurm and wait until slurmctld hears from it; how it was resumed
    ("resumed in Slurm", or why no job goes there yet).

    A replaced node may still carry a ping slurmctld sent while it was being made anew
    (sinfo's `idle*`: not responding, no job goes there) until the next ping, up to 100 s
    later; seen in a CI run right after heal. slurmd's registration clears it at once, so
    a node still not responding after 10 s gets its slurmd restarted (it runs no job: it
    was drained until now)."""
    q = shlex.quote(node)
    rc, out = _slurm(state, cluster, f"sudo -n scontrol update nodename={q} state=resume")
    if rc != 0 and "Invalid node state specified" not in out:  # not drained any more: nothing to undo
        raise DeployerError(f"heal: could not resume {node} in Slurm: {out.splitlines()[-1] if out else rc}")
    from .slurm import not_ready

    began, nudged = time.monotonic(), False
    while True:
        rc, out = _slurm(state, cluster, f"sinfo --noheader --Node --nodes={q} --format='%N %T'")
        late = not_ready(out, [node]) if rc == 0 else [f"{node}: sinfo failed ({out[-100:]})"]
        if not late:
            return "resumed in Slurm"
        waited = time.monotonic() - began
        if waited > RESPOND_WAIT_S:
            ui.warn(f"heal: {node} is resumed, but slurmctld does not hear from it after {waited:.0f}s ({late[0]}): "
                    f"look at `systemctl status slurmd` on it")
            return f"resumed in Slurm, not responding yet ({late[0]})"
        if waited > 10 and not nudged:
            _slurm(state, cluster, f"ssh -o BatchMode=yes {q} sudo -n systemctl restart slurmd")
            nudged = True
        time.sleep(2)


def heal(state: ClusterState, *, act: bool, dry_run: bool, wait_jobs: bool = True,
         named: list[str] | None = None) -> dict[str, Any]:
    """Read, decide, and with `act` replace and prove; the decisions as JSON."""
    from . import health

    spec: ClusterSpec | None = state.spec()
    cluster = state.cluster()
    if spec is None or cluster is None:
        raise UsageError(f"cluster {state.name!r} is not up; nothing to heal")
    if not spec.health.enabled:
        raise UsageError("health is off for this cluster (health.enabled: false): nothing reports a failing node")
    named_full = [cluster.find(n).name for n in named or []]
    with state.lock("heal"):  # refuses, in one line, while a bench, an up or a down runs
        found, clock = health.read(state, cluster)
        node_now = clock or time.time()
        held = held_by_heal(state, cluster) if spec.scheduler == "slurm" else frozenset()
        decisions = plan(found, cluster, spec.health, node_now, replacements_today(state.root, state.name), named_full, held)
    for d in decisions:
        if d.action == "replace":
            ui.warn(f"heal: {d.node} has failed for {human(d.failing_for_s)}: {d.why}"
                    + ("" if act and not dry_run else " (--yes replaces it)"))
        elif d.action in ("limit", "master"):
            ui.warn(f"heal: {d.node}: {d.why}")
        elif d.action == "wait":
            ui.info(f"heal: {d.node}: {d.why}")
        elif d.action == "prove":
            ui.info(f"heal: {d.node}: {d.why}")
    if not any(d.action in ("replace", "prove") for d in decisions):
        ui.ok(f"heal: nothing to replace on {len(decisions)} node(s)")
    if act and not dry_run:
        for d in decisions:
            if d.action == "replace":
                _replace(spec, state, cluster, d, wait_jobs)
            elif d.action == "prove":
                _prove(spec, state, cluster, d)
    return {"cluster": state.name, "dry_run": dry_run or not act, "nodes": [asdict(d) for d in decisions],
            "health": {k: v.to_json(node_now) for k, v in found.items()}}


def _replace(spec: ClusterSpec, state: ClusterState, cluster: Cluster, d: Decision, wait_jobs: bool) -> None:
    """The path of `up --replace NODE` (lifecycle.up's stages), checked at the standard level."""
    from . import lifecycle

    slurm = spec.scheduler == "slurm"
    started = time.time()
    if slurm:
        drain(state, cluster, d.node, d.why, wait_jobs)
    ui.info(f"heal: replacing {d.node} (`up --replace {d.node}`), then `deployer check --level standard`")
    try:
        lifecycle.up(spec, state, replace=[d.node], check_level="standard")
    except DeployerError as e:
        d.result = f"replaced, but not proved: {e}; left drained" if slurm else f"failed: {e}"
        ui.error(f"heal: {d.node}: {d.result}")
        _note(state, cluster, d, started, proved=False)
        return
    d.result = "replaced, standard check passed" + (f", {resume(state, cluster, d.node)}" if slurm else "")
    entry = _note(state, cluster, d, started, proved=True)
    ui.ok(f"heal: {d.node} {d.result}; {entry['node_hours_lost']:.2f} node-hours lost")


def held_by_heal(state: ClusterState, cluster: Cluster) -> frozenset[str]:
    """Nodes drained with heal's reason (sinfo's %E)."""
    rc, out = _slurm(state, cluster, "sinfo --noheader --Node --format='%N|%E'")
    if rc != 0:
        return frozenset()
    return frozenset(line.split("|", 1)[0].strip() for line in out.splitlines()
                     if "|" in line and line.split("|", 1)[1].strip().startswith(HEAL_REASON))


def _prove(spec: ClusterSpec, state: ClusterState, cluster: Cluster, d: Decision) -> None:
    """A node heal replaced but could not prove: the standard check again, resumed when it passes."""
    from .check.run import check_now

    report = check_now(state, cluster, "standard", push=spec.monitoring.enabled)
    mine = next((n for n in report.nodes if n.name == d.node), None)
    if mine is None or mine.verdict == "fail" or any(f.status == "fail" for f in report.cluster_findings):
        d.result = f"standard check failed again: {mine.reason() if mine else 'the node was not checked'}; left drained"
        ui.error(f"heal: {d.node}: {d.result}")
        return
    d.result = f"replaced, standard check passed, {resume(state, cluster, d.node)}"
    ui.ok(f"heal: {d.node}: {d.result}")


def _note(state: ClusterState, cluster: Cluster, d: Decision, started: float, proved: bool) -> dict[str, Any]:
    """The ledger's line: the cluster's size is unchanged (usage sums it as before); the
    node-hours lost run from the node's first failed run until it took work again."""
    t = now()
    lost_s = d.failing_for_s + (time.time() - started)
    entry = {"time": iso(t), "cluster": state.name, "provider": cluster.provider, "event": "heal",
             "nodes": len(cluster.nodes), "gpus": cluster.gpus, "flavor": cluster.machine.get("flavor"),
             "node": d.node, "reason": d.why, "proved": proved,
             "failing_since": iso(t - timedelta(seconds=lost_s)), "node_hours_lost": round(lost_s / 3600, 4)}
    ledger.note_event(state.root, entry)
    return entry
