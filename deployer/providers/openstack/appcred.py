"""The application credential of the master's teardown timer (openstack.auto_teardown).

`up` makes it with the user's own credentials once Terraform has made the servers; it is
scoped to the cluster's project (as every application credential is), cannot make other
credentials (unrestricted: false), may read and delete only this cluster's servers, each
named by its id in the access rules (no listing: it cannot even see another server), and
expires a day after the cluster does. Its secret stays in the state dir's secrets (0600)
and on the master, root-only. `down` revokes it; a new expiry beyond its own, or another
set of servers (scale, a replaced node), makes a new one, and the old one is revoked once
the play has put the new one on the master (provider.settle). Its name is recorded before
it is made, so one an interrupt left unrecorded is revoked by the next `up` or `down`.

Keystone's rules, as the test cloud (tests/cloud) answers them:
- the name is unique per user (409 otherwise): each credential gets a name of its own,
  so the new one exists before the old one is revoked;
- a session that itself logged in with a restricted application credential may neither
  make nor delete one (403): the preflight says so before anything is made;
- keystonemiddleware matches a rule's path against the whole request path, so the paths
  come from the compute endpoint in the catalog (a prefix such as /compute, a project id).
"""

from __future__ import annotations

import re
import secrets
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from ...lifetime import iso, parse_iso
from .observe import session
from .session import cloud_errors

MARGIN = timedelta(days=1)  # past the cluster's expiry: the timer's last tries still authenticate



def access_rules(compute_endpoint: str, server_ids: list[str]) -> list[dict[str, str]]:
    """What openstacksdk calls to read each of `server_ids`, delete it and wait until it
    is gone (version discovery included), as paths under the cloud's own compute endpoint."""
    path = urlparse(compute_endpoint).path.rstrip("/")  # e.g. /compute/v2.1, /v2.1/<project id>, /compute
    version = re.search(r"/v2(\.\d+)?(?=/|$)", path)
    root, suffix = (path[: version.start()], path[version.end():]) if version else (path, "")
    # openstacksdk discovers and settles on v2.1 whatever version the catalog names
    # (/v2/<project id> included), so the servers' paths are under <root>/v2.1<suffix>.
    api = f"{root}/v2.1{suffix}"
    rules = [("GET", f"{root}/"), ("GET", f"{root}/v2.1"), ("GET", f"{root}/v2.1/")]
    for sid in server_ids:
        rules += [("GET", f"{api}/servers/{sid}"), ("DELETE", f"{api}/servers/{sid}")]
    unique = dict.fromkeys(rules)  # the project-less endpoint's version root is its api path
    return [{"service": "compute", "method": m, "path": p} for m, p in unique]


def name(cluster: str) -> str:
    """A name of its own for each credential: Keystone keeps (user, name) unique, and the
    new credential is made before the old one is revoked."""
    return f"deployer-{cluster}-teardown-{secrets.token_hex(3)}"


def login_restriction(conn: Any) -> str | None:
    """Why this session cannot make an application credential, or None when it can: one
    that logged in with a restricted application credential may not (Keystone: 403)."""
    access = conn.session.auth.get_access(conn.session)
    cred = getattr(access, "_application_credential", None) or {}
    if cred and cred.get("restricted", True):
        return (f"clouds.yaml logs in with application credential {cred.get('name') or cred.get('id')!r}, which may not "
                f"make the teardown credential (Keystone allows that only to an --unrestricted one)")
    return None


def needs_new(record: dict[str, Any] | None, cluster_expires_at: str, server_ids: list[str]) -> bool:
    """No credential yet, one for other servers, or one that would expire before the
    cluster's new expiry (+ margin)."""
    if not record or record.get("server_ids") != server_ids:
        return True
    return parse_iso(record["expires_at"]) < parse_iso(cluster_expires_at) + MARGIN


def create(env: dict[str, str], cluster: str, cluster_expires_at: str, server_ids: list[str],
           cred_name: str | None = None) -> dict[str, Any]:
    """A new credential for exactly `server_ids` (the master first), named `cred_name`
    (made by name() and recorded before, so an interrupt cannot lose it); what the
    master's clouds.yaml needs, the secret included."""
    expires = iso(parse_iso(cluster_expires_at) + MARGIN)
    with session(env) as conn, cloud_errors(conn, f"creating the teardown credential of cluster {cluster}"):
        made = conn.identity.create_application_credential(
            user=conn.current_user_id,
            name=cred_name or name(cluster),
            description=f"deployer: the master of cluster {cluster} deletes its servers at the cluster's expiry",
            expires_at=expires.removesuffix("Z"),
            unrestricted=False,
            access_rules=access_rules(conn.compute.get_endpoint(), server_ids),
        )
        return {
            "id": made.id, "name": made.name, "secret": made.secret, "expires_at": expires, "user_id": conn.current_user_id,
            "server_ids": server_ids,
            "access_rule_ids": [r["id"] for r in (made.access_rules or []) if r.get("id")],
            "auth_url": conn.config.get_auth_args().get("auth_url"),
            "region_name": conn.config.get_region_name() or None,
            "interface": conn.config.get_interface() or "public",
        }


def find(env: dict[str, str], cred_name: str) -> dict[str, Any] | None:
    """The user's credential of this name, as much of its record as revoke() needs; None
    when there is none (it was never made, or is gone)."""
    with session(env) as conn, cloud_errors(conn, f"looking for application credential {cred_name}"):
        user = conn.current_user_id
        for c in conn.identity.application_credentials(user=user, name=cred_name):
            if c.name == cred_name:
                return {"id": c.id, "name": c.name, "user_id": user, "expires_at": str(c.expires_at or ""),
                        "access_rule_ids": [r["id"] for r in (c.access_rules or []) if r.get("id")]}
    return None


def revoke(env: dict[str, str], record: dict[str, Any]) -> None:
    """Delete the credential (one that is already gone is fine), then its access rules:
    Keystone keeps a user's rules after the credential is gone, and these name server ids,
    so each cluster and each scale would leave new ones behind. A rule another credential
    still uses (the newer one, for the servers both name) is refused, and stays."""
    import openstack

    with session(env) as conn, cloud_errors(conn, f"revoking application credential {record['name']}"):
        conn.identity.delete_application_credential(record["user_id"], record["id"], ignore_missing=True)
        for rule_id in record.get("access_rule_ids", []):
            try:
                conn.identity.delete_access_rule(record["user_id"], rule_id, ignore_missing=True)
            except openstack.exceptions.HttpException:  # in use by another credential
                pass
