"""`deployer gc`: the clusters whose lifetime is over, and their removal.

Two places say a cluster has expired: a state dir in the state root (lifetime.json), and
on OpenStack the `deployer_expires_at` metadata `up` puts on every server and the volume,
which is there even when this machine has no state of the cluster (a laptop lost, a
colleague's cluster); there the cluster has expired only when every one of them says so
(docs/openstack.md, "Expiry: which record decides"), and `down` for a state dir asks the
cloud too before destroying. Both are listed; `--yes` destroys what has state with the same `down` as
always (Terraform, then the proof that nothing is left), and what only the cloud knows
by its metadata and tag (the provider's delete_from_cloud), with the same proof. A cluster
is one cluster by its id (state.py: cluster_id), not its name: two of the same name (two
users in one project) are listed and destroyed each on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from . import ui
from .errors import DeployerError, NoLongerExpired, RecordError
from .lifetime import human, iso, now, parse_iso
from .providers import get_provider
from .providers.base import CloudCluster
from .state import ClusterState


@dataclass
class Expired:
    name: str
    provider: str | None
    expires_at: str
    cluster_id: str | None = None
    in_state: bool = False  # a state dir here: `down` can destroy it
    servers: list[str] = field(default_factory=list)  # found in the cloud by metadata

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "cluster_id": self.cluster_id, "provider": self.provider, "expires_at": self.expires_at,
                "in_state": self.in_state, "servers": self.servers}


def from_state(root: Path, at: datetime) -> list[Expired]:
    """Clusters in the state root whose recorded expiry is past."""
    out: list[Expired] = []
    if not Path(root).is_dir():
        return out
    for d in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        st = ClusterState(Path(root), d.name)
        life = st.lifetime()
        if life is None or parse_iso(life.expires_at) > at:
            continue
        origin = st.origin()
        out.append(Expired(d.name, origin.provider if origin else None, life.expires_at, origin.cluster_id if origin else None,
                           in_state=True))
    return out


def from_cloud(found: list[CloudCluster], provider: str) -> list[Expired]:
    return [Expired(c.name, provider, iso(c.expires_at), c.cluster_id, servers=list(c.servers)) for c in found]


def merge(local: list[Expired], cloud: list[Expired]) -> list[Expired]:
    """One entry per cluster: the state dir's, with the cloud's servers of the same id
    added; a cloud cluster of a state dir's name but another id stays its own entry."""
    by_id = {e.cluster_id: e for e in local if e.cluster_id}
    out = list(local)
    for c in cloud:
        if c.cluster_id in by_id:
            by_id[c.cluster_id].servers = c.servers
        else:
            out.append(c)
    return sorted(out, key=lambda e: e.expires_at)


# `--cloud` names an entry of clouds.yaml: the one provider with a cloud to ask.
CLOUD_PROVIDER = "openstack"


def find(root: Path, cloud: str | None, at: datetime) -> list[Expired]:
    """Expired clusters in the state root and, given a cloud, in its project."""
    in_cloud = get_provider(CLOUD_PROVIDER).expired_in_cloud({"OS_CLOUD": cloud}, at) if cloud else []
    return merge(from_state(root, at), from_cloud(in_cloud, CLOUD_PROVIDER))


def collect_and_act(root: Path, *, cloud: str | None, destroy: bool, dry_run: bool) -> list[dict[str, Any]]:
    """List (or with `destroy`, destroy) every expired cluster; one JSON-ready entry each,
    its `action` saying what happened. A failure is reported and the next one is tried."""
    import os

    from . import lifecycle

    at = now()
    cloud = cloud or os.environ.get("OS_CLOUD")
    found = find(root, cloud, at)
    if not found:
        ui.info(
            f"no expired cluster in {root}"
            + (f" or OpenStack cloud {cloud!r}" if cloud else " (no OpenStack cloud looked at: --cloud or $OS_CLOUD)")
        )
        return []
    results = []
    for e in found:
        ago = human((at - parse_iso(e.expires_at)).total_seconds())
        entry = e.to_json()
        if not e.in_state:
            entry["action"] = _cloud_only(e, ago, cloud, destroy=destroy, dry_run=dry_run)
        elif not destroy:
            entry["action"] = "would destroy" if dry_run else "listed"
            try:
                recorded = ClusterState(root, e.name).cluster()
            except RecordError:  # listing goes on: `down` names the damaged record
                recorded = None
            nodes = recorded.names if recorded else []
            what = (
                f"would destroy {', '.join(nodes) or 'what Terraform made'}, its network and state"
                if dry_run
                else "`deployer gc --yes` destroys it"
            )
            ui.info(f"{e.name}: expired {ago} ago ({e.provider}); {what}")
        else:
            ui.step(f"{e.name}: expired {ago} ago: destroying")
            try:
                lifecycle.down(ClusterState(root, e.name), only_if_expired=True)
                entry["action"] = "destroyed"
            except NoLongerExpired as kept:
                entry["action"] = "kept: extended"
                ui.info(f"{e.name}: {kept}")
            except DeployerError as err:
                entry["action"] = f"failed: {err}"
                ui.error(f"{e.name}: {err}")
        results.append(entry)
    return results


def _cloud_only(e: Expired, ago: str, cloud: str | None, *, destroy: bool, dry_run: bool) -> str:
    """A cluster only the cloud knows of: deleted by its metadata."""
    where = f"found in cloud {cloud!r} only (id {e.cluster_id}: {', '.join(e.servers)})"
    if not destroy:
        ui.info(f"{e.name}: expired {ago} ago, {where}; "
                + ("would delete its servers and what carries its tag" if dry_run else "`deployer gc --yes` deletes it by its metadata"))
        return "would destroy" if dry_run else "listed"
    ui.step(f"{e.name}: expired {ago} ago, {where}: deleting by its metadata")
    try:
        deleted = get_provider(CLOUD_PROVIDER).delete_from_cloud({"OS_CLOUD": cloud or ""}, e.name, e.cluster_id or "",
                                                                 say=ui.info, expired_at=now())
    except NoLongerExpired as kept:
        ui.info(f"{e.name}: {kept}")
        return "kept: extended"
    except DeployerError as err:
        ui.error(f"{e.name}: {err}")
        return f"failed: {err}"
    ui.ok(f"{e.name}: deleted {len(deleted)} resource(s); nothing of it is left")
    return "destroyed"
