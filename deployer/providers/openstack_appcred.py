"""The application credential of the master's teardown timer (openstack.auto_teardown).

`up` makes it with the user's own credentials; it is scoped to the cluster's project (as
every application credential is), cannot make other credentials (unrestricted: false),
may call only the few Nova endpoints that list and delete servers (access rules), and
expires a day after the cluster does. Its secret stays in the state dir's secrets (0600)
and on the master, root-only. `down` revokes it; a new expiry beyond its own makes a new one.

Access rules need Keystone from Train on; a cloud without them refuses the request,
and `up` says so. Whether a cloud's Nova matches these paths (its endpoint may carry a
prefix) can only be seen on that cloud: tested here against recorded API shapes only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ..lifetime import iso, parse_iso
from .openstack_observe import session
from .openstack_session import cloud_errors

MARGIN = timedelta(days=1)  # past the cluster's expiry: the timer's last tries still authenticate

# What openstacksdk calls to list servers, delete them and wait until they are gone
# (version discovery included). Paths as Nova's access-rule check sees them.
ACCESS_RULES = [
    {"service": "compute", "method": "GET", "path": "/"},
    {"service": "compute", "method": "GET", "path": "/v2.1"},
    {"service": "compute", "method": "GET", "path": "/v2.1/servers/detail"},
    {"service": "compute", "method": "GET", "path": "/v2.1/servers/*"},
    {"service": "compute", "method": "DELETE", "path": "/v2.1/servers/*"},
]


def name(cluster: str) -> str:
    return f"deployer-{cluster}-teardown"


def needs_new(record: dict[str, Any] | None, cluster_expires_at: str) -> bool:
    """No credential yet, or it would expire before the cluster's new expiry (+ margin)."""
    if not record:
        return True
    return parse_iso(record["expires_at"]) < parse_iso(cluster_expires_at) + MARGIN


def create(env: dict[str, str], cluster: str, cluster_expires_at: str) -> dict[str, Any]:
    """A new credential; what the master's clouds.yaml needs, the secret included."""
    expires = iso(parse_iso(cluster_expires_at) + MARGIN)
    with session(env) as conn, cloud_errors(conn, f"creating the teardown credential of cluster {cluster}"):
        made = conn.identity.create_application_credential(
            user=conn.current_user_id,
            name=name(cluster),
            description=f"deployer: the master of cluster {cluster} deletes its servers at the cluster's expiry",
            expires_at=expires.removesuffix("Z"),
            unrestricted=False,
            access_rules=ACCESS_RULES,
        )
        return {
            "id": made.id, "name": made.name, "secret": made.secret, "expires_at": expires, "user_id": conn.current_user_id,
            "auth_url": conn.config.get_auth_args().get("auth_url"),
            "region_name": conn.config.get_region_name() or None,
            "interface": conn.config.get_interface() or "public",
        }


def revoke(env: dict[str, str], record: dict[str, Any]) -> None:
    """Delete the credential (one that is already gone is fine)."""
    with session(env) as conn, cloud_errors(conn, f"revoking application credential {record['name']}"):
        conn.identity.delete_application_credential(record["user_id"], record["id"], ignore_missing=True)
