"""The OpenStack provider: preflight through openstacksdk, variables for terraform/openstack.

Making machines is Terraform's (terraform/openstack); setting them up is Ansible's and
reads only the `cluster` output. This class implements base.Provider and
keeps openstacksdk out of import time (preflight.py imports it lazily).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import records, ui
from ...errors import OperationFailed
from ...tools import terraform
from ..base import CloudCluster, Observation, Repair
from .teardown import CLUSTER_ID_KEY, CLUSTER_KEY, latest_expiry, not_expired

if TYPE_CHECKING:
    from ...cluster import Cluster
    from ...spec import ClusterSpec
    from ...state import ClusterState
    from .preflight import PreflightResult

class OpenStackProvider:
    name = "openstack"
    description = "virtual machines in your OpenStack project"
    # A GPU VM may take minutes to be scheduled, boot and run cloud-init.
    boot_timeout_s = 900

    # ---- base.Provider -------------------------------------------------------------------

    def preflight(self, spec: ClusterSpec, state: ClusterState, replacing: Collection[str] = ()) -> PreflightResult:
        """Auth, flavor, image, networks, key pair, floating IP and quotas; creates nothing.
        A flavor the running nodes do not have is refused unless `replacing` (--replace)
        names every one of them; then the plan is said here, before anything happens."""
        from .placement import policy_change_problem
        from .preflight import check

        workdir = state.terraform_dir / "openstack"
        changed = policy_change_problem(workdir, spec.openstack.server_group_policy)
        if changed:
            from ...errors import PreflightError

            raise PreflightError(changed)
        with ui.status(f"Checking OpenStack project for {spec.nodes} node(s) of {spec.openstack.flavor}"):
            result = check(spec, cluster_exists=terraform.has_resources(state.terraform_dir / "openstack"),
                           cluster_id=state.cluster_id, replacing=replacing)
        for w in result.warnings:
            ui.warn(w)
        if result.reflavored:
            was = ", ".join(sorted(set(result.reflavored.values())))
            ui.warn(f"flavor change {was} → {result.flavor}: {', '.join(sorted(result.reflavored))} will be deleted and made "
                    f"anew with {result.flavor} (--replace), not resized; what is on their disks is lost, the shared "
                    f"volume is kept")
        if result.admin_cidr_from:
            ui.info(f"openstack.admin_cidr is not set: SSH to the master is open to this machine's public address only "
                    f"({spec.openstack.admin_cidr}); set it to allow others")
        gpus = f", {result.gpus_per_node} GPU(s) each" if result.gpus_per_node else ""
        grow = f" ({len(result.existing_nodes)} exist)" if result.existing_nodes else ""
        ui.ok(
            f"OpenStack: {spec.nodes} × {result.flavor} ({result.vcpus} vCPUs, {result.ram_mb // 1024} GiB{gpus}) "
            f"fit the project's quotas{grow}"
        )
        return result

    def tfvars(self, spec: ClusterSpec, state: ClusterState, checked: object = None) -> dict[str, Any]:
        """Every variable of terraform/openstack that has no default, and the ones the spec sets.

        A None is left out, so Terraform takes the variable's default (null). `checked`: this
        run's preflight (a PreflightResult); None where no preflight ran (e.g. `down`).
        """
        from .preflight import UUID, PreflightResult, with_baked_image

        resolved = checked if isinstance(checked, PreflightResult) else None
        o = with_baked_image(spec)
        m = spec.monitoring
        expose = bool(m.enabled and m.expose)

        image_key = "image_id" if UUID.match(o.image) else "image_name"
        values: dict[str, Any] = {
            "cloud": o.cloud,
            "cluster_name": spec.name,
            "cluster_id": state.cluster_id,  # made before Terraform runs (lifecycle.up), kept for the cluster's life
            "node_count": spec.nodes,
            "ssh_user": spec.ssh_user,
            "shared_dir": spec.shared_dir,
            "flavor_name": o.flavor,
            image_key: o.image,
            "key_pair": o.key_pair,
            "public_key": self._public_key(state),
            "enable_gpu": o.enable_gpu,
            "gpus_per_node": self._gpus_per_node(spec, resolved),
            "external_network": o.external_network,
            "floating_ip": o.floating_ip,
            "create_network": o.network is None,
            "network_cidr": str(o.network_cidr),
            "network_name": o.network,
            "admin_cidr": str(o.admin_cidr) if o.admin_cidr else None,  # set by the preflight when the spec is silent
            "monitoring_expose": expose,
            "monitoring_allowed_cidrs": [str(c) for c in m.allowed_cidrs] if expose else [],
            "volume_size": o.volume_size,
            "volume_type": o.volume_type,
            "root_volume_size": o.root_volume_size,
            "dns_nameservers": [str(ip) for ip in o.dns_nameservers],
            "boot_dir": str(state.boot_dir),
            # The server group every node joins (openstack.placement); None: none.
            "placement_policy": o.server_group_policy,
            # The expiry `up` recorded before Terraform runs (lifetime.py); a changed
            # expiry updates the servers' metadata in place.
            "expires_at": life.expires_at if (life := state.lifetime()) else None,
        }
        if resolved is not None:  # what this run's preflight resolved: the module takes IDs as they are
            values |= {"flavor_id": resolved.flavor_id or None, "external_network_id": resolved.external_network_id or None,
                       "network_id": resolved.network_id, "flavor_vcpus": resolved.vcpus or None,
                       "flavor_ram_mb": resolved.ram_mb or None}
            if resolved.image_id:
                values.pop("image_name", None)
                values["image_id"] = resolved.image_id
        return {k: v for k, v in values.items() if v is not None}

    def terraform_env(self, spec: ClusterSpec) -> dict[str, str]:
        from .session import client_config_env

        return client_config_env(spec.openstack.cloud)

    def node_resource(self, node: str) -> str:
        return f'openstack_compute_instance_v2.node["{node}"]'

    def prepare(self, spec: ClusterSpec, state: ClusterState) -> None:
        """Nothing before Terraform: the teardown credential names the servers, so it is
        made after them (place)."""

    def remove_leftovers(self, state: ClusterState, env: dict[str, str]) -> list[str]:
        """Nothing outside Terraform's destroy: `observe` then says what is left."""
        return []

    def forget(self, state: ClusterState, env: dict[str, str]) -> None:
        from .appcred import revoke

        try:
            _revoke_orphan(state, env)
        except OperationFailed as e:
            ui.warn(str(e))
        record = read_teardown_credential(state)
        for r in [record, *record.get("superseded", [])] if record else []:
            if not r.get("id"):
                continue  # what is left of one switched off: only what it superseded
            try:
                revoke(env, r)
            except OperationFailed as e:
                ui.warn(f"{e}; it expires by itself at {r['expires_at']} "
                        f"(or: openstack application credential delete {r['name']})")

    def inventory_vars(self, spec: ClusterSpec, state: ClusterState, cluster: Cluster) -> dict[str, Any]:
        # The master's own teardown at expiry (roles/teardown_timer): the credential's id
        # is here (not its secret) so that a renewed credential reconfigures the master.
        # Node ids only with auto_teardown: an id in the inventory would make every
        # replaced node a reason to reconfigure all of them (drift.py).
        on = spec.openstack.auto_teardown
        return {
            "deployer_auto_teardown": on,
            "deployer_teardown_credential_id": (read_teardown_credential(state) or {}).get("id") if on else None,
            "deployer_teardown_server_id": cluster.master.id if on else None,
            "deployer_teardown_worker_ids": [n.id for n in cluster.workers] if on else [],
            "deployer_teardown_script": str(Path(__file__).parent / "teardown.py") if on else None,
        }

    def expired_in_cloud(self, env: dict[str, str], at: datetime) -> list[CloudCluster]:
        from .observe import deployer_resources

        return expired_clusters(*deployer_resources(env), at)

    def record_expiry(self, state: ClusterState, env: dict[str, str], expires_at: str | None, was: str | None) -> str | None:
        """The cluster's new expiry (None: none) into every server's and the volume's
        metadata, the master first, before the state dir records it (lifecycle._set_lifetime):
        an expiry the cloud has not taken is never one this machine acts on. A write that
        fails raises, naming what took the new expiry and what did not."""
        from .expiry import write_expiry

        return write_expiry(env, state.name, state.cluster_id, expires_at, was)

    def cloud_keeps(self, state: ClusterState, env: dict[str, str], at: datetime) -> str | None:
        """Why the cloud keeps the cluster past `at` (a server or the volume saying a later
        expiry, or none), or None when it agrees it has expired or holds nothing of it."""
        from .expiry import kept_by_cloud

        return kept_by_cloud(env, state.name, state.cluster_id, at)

    def delete_from_cloud(self, env: dict[str, str], name: str, cluster_id: str, *, say: Callable[[str], None],
                          expired_at: datetime) -> list[str]:
        from .delete import delete_cluster

        return delete_cluster(env, name, cluster_id, say=say, expired_at=expired_at)

    def clear_for_destroy(self, state: ClusterState, env: dict[str, str]) -> list[str]:
        """Before `down`'s Terraform destroy (lifecycle.down): the servers in a status the
        Terraform provider cannot destroy (suspended, paused, rescued...) deleted through
        the API; a line per server for the user."""
        from .observe import delete_undestroyable

        return delete_undestroyable(state.name, state.cluster_id, env)

    def observe(self, state: ClusterState, env: dict[str, str], nodes: list[str]) -> Observation:
        from .observe import observe

        return observe(state.name, state.cluster_id, env, nodes)

    def repair(self, spec: ClusterSpec, state: ClusterState, cluster: Cluster, seen: Observation) -> Repair:
        """Start what an operator stopped. A deleted server needs nothing here: Terraform's
        refresh sees it gone and makes it anew (a new server id: it is configured again)."""
        from .observe import start

        stopped = [n for n, m in seen.nodes.items() if m.state == "stopped"]
        if stopped:
            start(spec.name, self.terraform_env(spec), [i for n in stopped if (i := seen.nodes[n].id)])
        return Repair(started=stopped)

    def place(self, spec: ClusterSpec, state: ClusterState, cluster: Cluster) -> str | None:
        """After Terraform: the master's teardown credential (openstack.auto_teardown),
        whose access rules name each of this cluster's servers. Made anew when the servers
        change (scale, a replaced node) or the cluster now outlives it; the old one is kept
        (recorded as superseded) until the play has put the new one on the master
        (settle), so the master never holds a revoked one. Its name is recorded before it
        is made: one an interrupt left unrecorded is found and revoked by the next `up` or
        `down`. Revoked when the option is off."""
        from . import appcred

        env = self.terraform_env(spec)
        orphan = _revoke_orphan(state, env)
        record = read_teardown_credential(state)
        life = state.lifetime()
        if spec.openstack.auto_teardown and life:
            server_ids = [n.id for n in cluster.nodes if n.id]  # the master first
            if len(server_ids) != len(cluster.nodes):
                raise OperationFailed("the cluster output names a node without a server id: run `deployer up` again")
            if not appcred.needs_new(record, life.expires_at, server_ids):
                return orphan
            cred_name = appcred.name(spec.name)
            records.write(pending_credential_file(state), {"name": cred_name}, secret=True)  # before it exists
            made = appcred.create(env, spec.name, life.expires_at, server_ids, cred_name)
            made["superseded"] = _superseded(record)
            records.write(teardown_credential_file(state), made, secret=True)
            pending_credential_file(state).unlink(missing_ok=True)
            return (f"teardown credential {made['name']}: the master deletes these {len(server_ids)} servers at expiry "
                    f"(valid until {made['expires_at']})"
                    + (f"; {', '.join(r['name'] for r in made['superseded'])} revoked once the master has it"
                       if made["superseded"] else ""))
        if record and record.get("id"):
            # Off: the play removes the timer (its play runs right after the base system);
            # the credential goes once it has (settle), never while the master still uses it.
            records.write(teardown_credential_file(state), {"superseded": _superseded(record)}, secret=True)
            return f"teardown credential {record['name']}: revoked once the master's timer is removed (auto_teardown is off)"
        return orphan

    def settle(self, spec: ClusterSpec, state: ClusterState) -> str | None:
        """After a play that configured the master: the new teardown credential is there
        (its play runs right after the base system), so the ones it superseded go."""
        from . import appcred

        record = read_teardown_credential(state)
        if not record or not record.get("superseded"):
            return None
        env = self.terraform_env(spec)
        for old in record["superseded"]:
            appcred.revoke(env, old)
        names = ", ".join(r["name"] for r in record["superseded"])
        if not record.get("id"):  # auto_teardown off: nothing replaces them
            teardown_credential_file(state).unlink()
            return f"teardown credential {names} revoked: the master's timer is gone"
        records.write(teardown_credential_file(state), {**record, "superseded": []}, secret=True)
        return f"teardown credential {names} revoked: the master has {record['name']}"

    def boot_log_hint(self, node: str) -> str:
        return f"`openstack console log show {node}` (the VM's console: cloud-init prints its errors there)"

    def manual_cleanup_hint(self, state: ClusterState) -> str:
        from .observe import id_tag, name_tag

        cluster, cid = state.name, state.cluster_id
        if cid is None:  # a state dir that made nothing: what has its name
            return (f"`openstack server list --name '^{cluster}-'`, `openstack volume list --name {cluster}-shared`, "
                    f"`openstack network list --tags {name_tag(cluster)}` (delete what is there, then run `deployer down` again)")
        return (f"`openstack server list --name '^{cluster}-' --long` (the servers whose properties say "
                f"deployer_cluster_id='{cid}'), `openstack network list --tags {id_tag(cid)}`, `openstack port list --tags "
                f"{id_tag(cid)}`, `openstack volume list --long` (deployer_cluster_id='{cid}'); a same-named cluster with "
                f"another id is someone else's. Delete what is there, then run `deployer down` again")

    # ---- helpers ------------------------------------------------------------------------------

    @staticmethod
    def _public_key(state: ClusterState) -> str:
        path = Path(state.ssh_public_key)
        try:
            return path.read_text().strip()
        except OSError as e:
            raise OperationFailed(f"cannot read the cluster's public key {path}: {e.strerror}") from None

    @staticmethod
    def _gpus_per_node(spec: ClusterSpec, checked: PreflightResult | None) -> int:
        """From this run's preflight (the flavor's extra specs); else the spec's default."""
        if not spec.openstack.enable_gpu:
            return 0
        if checked is not None and checked.flavor == spec.openstack.flavor:
            return checked.gpus_per_node
        return max(1, spec.gpus_per_node)


def expired_clusters(servers: list[Any], volumes: list[Any], at: datetime) -> list[CloudCluster]:
    """The clusters (one per id) that have expired by `at` by their own word: every one of
    their servers and their volume (records with `.name` and `.metadata`) carries an
    expiry, and each is past (teardown.not_expired). One server or the volume with a later
    expiry, or none, keeps the cluster: an extension that reached it, or an apply cut short
    (docs/openstack.md, "Expiry: which record decides"). Its expiry: the latest of theirs."""
    by_id: dict[str, list[Any]] = {}
    for r in [*servers, *volumes]:
        cluster_id = (r.metadata or {}).get(CLUSTER_ID_KEY)
        if cluster_id:
            by_id.setdefault(cluster_id, []).append(r)
    found = []
    for cluster_id, resources in by_id.items():
        own = [s for s in servers if (s.metadata or {}).get(CLUSTER_ID_KEY) == cluster_id]
        if not own or not_expired(resources, at) is not None:
            continue  # a volume alone is no cluster gc can prove (delete.py); kept
        until = latest_expiry(resources)
        if until is None:  # not_expired said every one has one
            continue
        found.append(CloudCluster((own[0].metadata or {}).get(CLUSTER_KEY) or "?", cluster_id, until, [s.name for s in own]))
    return sorted(found, key=lambda c: (c.name, c.cluster_id))


TEARDOWN_CREDENTIAL = "teardown_credential.json"  # in the state dir's secrets (0600)


def teardown_credential_file(state: ClusterState) -> Path:
    return state.secrets_dir / TEARDOWN_CREDENTIAL


def read_teardown_credential(state: ClusterState) -> dict[str, Any] | None:
    return records.read(teardown_credential_file(state))


PENDING_CREDENTIAL = "teardown_credential.pending.json"  # the name of one being made


def pending_credential_file(state: ClusterState) -> Path:
    return state.secrets_dir / PENDING_CREDENTIAL


def _superseded(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What revoke() needs of the credential a new one replaces (and of those it replaced
    that are not revoked yet): never the secret."""
    if not record:
        return []
    keep = ("id", "name", "user_id", "expires_at", "access_rule_ids")
    return [{k: r[k] for k in keep if k in r} for r in [record, *record.get("superseded", [])] if r.get("id")]


def _revoke_orphan(state: ClusterState, env: dict[str, str]) -> str | None:
    """A credential whose name was recorded before it was made but never recorded as made
    (an interrupt in between): revoked if it exists. A line for the user, or None."""
    from . import appcred

    pending = records.read(pending_credential_file(state))
    if not pending:
        return None
    record = read_teardown_credential(state) or {}
    found = appcred.find(env, pending["name"]) if pending["name"] != record.get("name") else None
    if found:
        appcred.revoke(env, found)
    pending_credential_file(state).unlink(missing_ok=True)
    return f"teardown credential {pending['name']} (made, never recorded: an interrupted run) revoked" if found else None
