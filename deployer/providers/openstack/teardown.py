"""The master's own teardown at expiry (spec openstack.auto_teardown), and the server
look-up the controller uses.

This file runs in two places: imported by the deployer on the controller, and copied by
the `teardown_timer` role to the master, where a systemd timer runs it every few
minutes with an application credential whose access rules name this cluster's servers,
one by one: it may read and delete those and nothing else (not even list). So it needs
openstacksdk and the standard library, nothing of the deployer, and runs on the
oldest Python of a supported image (Ubuntu 22.04: 3.10; tests/unit check it with vermin).

On the master it reads the expiry of every server of the cluster it knows (its own and
the workers', by the ids it was given, each checked to carry this cluster's id in its
metadata: a same-named cluster's server is never this one's), from their metadata
(deployer_expires_at, which `deployer up --ttl` writes to each server and the volume
before anything else). Only once every one of them says its expiry is past (one that says
a later time, or none, keeps the cluster: an extension that reached some of them, or an
apply cut short) does it delete the other servers, wait for them, and delete its own
server last. The volume's metadata is not read here (the credential may read servers
only); the volume is not deleted here either. What it cannot delete (the master would
cut off its own way to the API, or the resources are in use until it is gone): the
ports, floating IP, router, network, security groups, key pair and the shared volume.
Those cost no GPU-hours; `deployer down` or `deployer gc --yes` removes them.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

UTC = timezone.utc  # noqa: UP017 (datetime.UTC is 3.11+)

CLUSTER_KEY = "deployer_cluster"  # the name, for people (terraform/openstack: compute.tf, storage.tf)
CLUSTER_ID_KEY = "deployer_cluster_id"  # the random id (state.py): what decides a server is the cluster's
EXPIRY_KEY = "deployer_expires_at"  # also terraform/openstack's metadata key (compute.tf, storage.tf)
DELETE_WAIT_S = 600


def cluster_servers(conn: Any, cluster_id: str) -> list[Any]:
    """Every server whose metadata carries the cluster's id (never by name)."""
    return [s for s in conn.compute.servers(details=True) if (s.metadata or {}).get(CLUSTER_ID_KEY) == cluster_id]


def expiry(server: Any) -> datetime | None:
    text = (server.metadata or {}).get(EXPIRY_KEY)
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def not_expired(resources: list[Any], at: datetime) -> str | None:
    """Why the cluster has not expired at `at` by its resources' own word (its servers, its
    volume): the first that carries no expiry, or a later one. None: every one says it has
    (the cluster's expiry is then the latest of theirs). A cluster is deleted only then."""
    if not resources:
        return "nothing of it carries its id"
    for r in resources:
        until = expiry(r)
        if until is None:
            return f"{r.name} carries no expiry ({EXPIRY_KEY})"
        if until > at:
            return f"{r.name} expires at {until:%Y-%m-%dT%H:%M:%SZ}"
    return None


def latest_expiry(resources: list[Any]) -> datetime | None:
    """The latest expiry among `resources` (when every one has one), else None."""
    ends = [expiry(r) for r in resources]
    return max(e for e in ends if e is not None) if ends and None not in ends else None


def _ours(conn: Any, server_id: str, cluster_id: str) -> Any:
    """The server if it exists and carries the cluster's id, else None."""
    import openstack

    try:
        server = conn.compute.get_server(server_id)
    except openstack.exceptions.NotFoundException:
        return None
    return server if (server.metadata or {}).get(CLUSTER_ID_KEY) == cluster_id else None


def teardown(conn: Any, cluster: str, cluster_id: str, own_id: str, worker_ids: list[str], now: datetime,
             say: Callable[[str], None] = print) -> list[str]:
    """If every server's expiry is past (the master's and each worker's that is still
    there): delete the workers, wait, then the master's own server (no wait: it is going).
    Returns the names deleted; [] while not expired."""
    own = _ours(conn, own_id, cluster_id)
    if own is None:
        say(f"server {own_id} is not one of cluster {cluster}'s servers: nothing to do")
        return []
    others = [s for s in (_ours(conn, i, cluster_id) for i in worker_ids if i != own_id) if s is not None]
    why = not_expired([own, *others], now)
    if why:
        say(f"cluster {cluster} has not expired ({why}): nothing to do yet")
        return []
    until = latest_expiry([own, *others])
    for s in others:
        say(f"expired at {until:%Y-%m-%dT%H:%M:%SZ}: deleting {s.name}")
        conn.compute.delete_server(s)
    for s in others:
        conn.compute.wait_for_delete(s, wait=DELETE_WAIT_S)
    say(f"deleting this master, {own.name}; `deployer down` or `deployer gc --yes` removes the network, volume and key pair")
    conn.compute.delete_server(own)
    return [s.name for s in others] + [own.name]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Delete this deployer cluster's servers once its expiry has passed.")
    p.add_argument("--cloud", required=True, help="clouds.yaml entry (the application credential)")
    p.add_argument("--cluster", required=True, help="the cluster's name (for the messages)")
    p.add_argument("--cluster-id", required=True, help="the cluster's id, as in its servers' deployer_cluster_id metadata")
    p.add_argument("--server-id", required=True, help="this master's server id")
    p.add_argument("--workers", default="", help="the workers' server ids, comma-separated")
    p.add_argument("--check", action="store_true", help="authenticate and read every server; delete nothing")
    args = p.parse_args(argv)
    import openstack

    workers = [i for i in args.workers.split(",") if i]
    conn = openstack.connect(cloud=args.cloud)
    say: Callable[[str], None] = lambda m: print(m, flush=True)  # noqa: E731 (the journal takes stdout)
    if args.check:
        own = _ours(conn, args.server_id, args.cluster_id)
        if own is None:
            say(f"server {args.server_id} is not one of cluster {args.cluster}'s servers")
            return 1
        found = 1 + sum(_ours(conn, i, args.cluster_id) is not None for i in workers)
        until = expiry(own)
        say(f"credential works: {found} server(s) of {args.cluster}; expiry {until:%Y-%m-%dT%H:%M:%SZ}" if until
            else f"credential works: {found} server(s) of {args.cluster}; no expiry set")
        return 0
    teardown(conn, args.cluster, args.cluster_id, args.server_id, workers, datetime.now(UTC), say=say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
