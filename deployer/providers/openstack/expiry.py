"""A cluster's expiry in the cloud: written to every server and the volume before the state
dir records it, and read back, all of them together, before anything is deleted.

The record of record is the cloud's: each server's and the volume's `deployer_expires_at`
(docs/openstack.md, "Expiry: which record decides"). The cluster has expired only when
every one of them says so (teardown.not_expired). A change of expiry (`up --ttl`, the
spec's ttl) reaches them first, the master first, then lifetime.json: an extension that
reached only some of them still keeps the cluster, and the record here is never later than
the cloud's. Terraform writes the same value again in its apply (a change of nothing).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ...errors import OperationFailed
from .observe import session
from .session import cloud_errors
from .teardown import CLUSTER_ID_KEY, EXPIRY_KEY, cluster_servers, not_expired


def _resources(conn: Any, cluster_id: str) -> tuple[list[Any], list[Any]]:
    """The cluster's servers (the master first) and its volume, by the id in their metadata."""
    servers = sorted(cluster_servers(conn, cluster_id), key=lambda s: (not s.name.endswith("-master"), s.name))
    volumes = [v for v in conn.block_storage.volumes() if (v.metadata or {}).get(CLUSTER_ID_KEY) == cluster_id]
    return servers, volumes


def write_expiry(env: dict[str, str], cluster: str, cluster_id: str | None, expires_at: str | None,
                 was: str | None) -> str | None:
    """`expires_at` (None: no expiry) into the metadata of every server and the volume of
    the cluster; a line for the user, or None when the cloud holds nothing of it yet.
    OperationFailed, naming what took it and what did not, when a write fails: the state
    dir then keeps `was`, and the cluster lives until the latest expiry any of them says."""
    if cluster_id is None:
        return None
    new = expires_at or "no expiry"
    with session(env) as conn:
        with cloud_errors(conn, f"reading cluster {cluster}'s servers and volume to write its new expiry"):
            servers, volumes = _resources(conn, cluster_id)
        done: list[str] = []
        for kind, items in (("server", servers), ("volume", volumes)):
            for item in items:
                try:
                    with cloud_errors(conn, f"writing {new} to {kind} {item.name}"):
                        if kind == "server" and expires_at:
                            conn.compute.set_server_metadata(item, **{EXPIRY_KEY: expires_at})
                        elif kind == "server":
                            if EXPIRY_KEY in (item.metadata or {}):
                                conn.compute.delete_server_metadata(item, [EXPIRY_KEY])
                        elif expires_at:
                            conn.block_storage.set_volume_metadata(item, **{EXPIRY_KEY: expires_at})
                        elif EXPIRY_KEY in (item.metadata or {}):
                            conn.block_storage.delete_volume_metadata(item, keys=[EXPIRY_KEY])
                except OperationFailed as e:
                    left = [i.name for i in [*servers, *volumes] if i.name not in done]
                    raise OperationFailed(
                        f"lifetime: the new expiry ({new}) was not written to {', '.join(left)} ({e}); "
                        + (f"written to {', '.join(done)}, so the cluster lives until the latest expiry any of them says. "
                           if done else "nothing took it. ")
                        + f"The record here still says {was or 'no expiry'}. Run the same `deployer up` again to write it"
                    ) from None
                done.append(item.name)
    if not done:
        return None
    return f"lifetime: {new} written to {len(done)} resource(s) in the cloud ({', '.join(done)}) before the record here"


def kept_by_cloud(env: dict[str, str], cluster: str, cluster_id: str | None, at: datetime) -> str | None:
    """Why the cloud keeps the cluster past `at`: a server or the volume that says a later
    expiry, or none. None when every one says it has expired, or the cloud holds nothing of
    it (then the state dir's record is all there is)."""
    if cluster_id is None:
        return None
    with session(env) as conn, cloud_errors(conn, f"reading cluster {cluster}'s expiry in the cloud"):
        servers, volumes = _resources(conn, cluster_id)
    if not servers and not volumes:
        return None
    why = not_expired([*servers, *volumes], at)
    return f"the cloud says it has not expired: {why}" if why else None
