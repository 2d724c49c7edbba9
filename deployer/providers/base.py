"""The provider interface: all that orchestration knows about a cloud.

A provider checks that the environment can host the spec (preflight), names its
Terraform module and the variables for it, says what of the cluster exists (observe)
and brings back what a host reboot or an operator took away (repair). Everything after
Terraform reads only the `cluster` output, so it never asks which cloud it is talking to.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..image_manifest import Manifest

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..spec import ClusterSpec
    from ..state import ClusterState

# running: the machine exists and is powered on; stopped: it exists, powered off (a host
# reboot, `openstack server stop`); missing: the cluster record names it, nothing is there.
MachineState = Literal["running", "stopped", "missing"]


@dataclass(frozen=True)
class Machine:
    state: MachineState
    id: str | None = None  # the provider's identity of the machine (server id, instance id)
    # Where it runs (docs/openstack.md, "Placement"): host is the hypervisor as this user
    # may name it (its name, else Nova's hostId), host_id Nova's per-project hash of it
    # (locally, this machine's name for both), zone the availability zone. None: not told.
    host: str | None = None
    host_id: str | None = None
    zone: str | None = None


@dataclass
class Observation:
    """What exists of one cluster, seen through the provider's own API."""

    nodes: dict[str, Machine]  # every node asked about, by name
    extra: list[str] = field(default_factory=list)  # nodes of this cluster that nobody asked about
    other: list[str] = field(default_factory=list)  # non-node resources that exist ("bridge dpl-demo")

    def remaining(self) -> list[str]:
        """Everything that still exists: what `down` must see empty."""
        have = [f"node {n}" for n, m in self.nodes.items() if m.state != "missing"]
        return have + [f"node {n}" for n in self.extra] + self.other


@dataclass
class Repair:
    """What `repair` did, and what it leaves to Terraform."""

    started: list[str] = field(default_factory=list)  # nodes powered on again: wait for them to boot
    recreate: list[str] = field(default_factory=list)  # nodes Terraform must make anew (-replace)


@dataclass
class CloudCluster:
    """A cluster the cloud knows by the metadata on its machines, whoever made it and
    whether or not this machine has a state dir for it (what `gc --cloud` reads)."""

    name: str
    cluster_id: str
    expires_at: datetime
    servers: list[str] = field(default_factory=list)


class Provider(Protocol):
    name: str
    description: str  # one phrase for up's first line: where the nodes will be
    boot_timeout_s: int  # how long a new node may take to answer SSH and finish cloud-init

    def preflight(self, spec: "ClusterSpec", state: "ClusterState", replacing: Collection[str] = ()) -> object:
        """Raise PreflightError (exit 2) when the spec cannot be hosted; create no machine,
        network or cloud resource. Returns what it learnt (e.g. the flavor's GPUs), handed to
        tfvars. It may settle what the spec leaves open in the spec itself, recorded with it
        by `up` (local: the subnet, spec.local.subnet), and claim the name on this machine
        (local: /var/lib/deployer/local-clusters/<name>, given back by `down`). `replacing`:
        the nodes this run makes anew (--replace), which may differ from the running ones."""

    def tfvars(self, spec: "ClusterSpec", state: "ClusterState", checked: object = None) -> dict[str, Any]:
        """Variables for terraform/<name>; every required variable of the module."""

    def terraform_env(self, spec: "ClusterSpec") -> dict[str, str]:
        """Environment the Terraform provider plugin needs (never a secret's value);
        raise UsageError when it names something unreadable. Recorded in the state dir,
        so `down` can destroy with it when the spec record is gone."""

    def node_resource(self, node: str) -> str:
        """Terraform address of the machine of `node` (for `up --replace`)."""

    def prepare(self, spec: "ClusterSpec", state: "ClusterState") -> None:
        """Work before Terraform that is not about drift (e.g. building the local base image)."""

    def observe(self, state: "ClusterState", env: dict[str, str], nodes: list[str]) -> Observation:
        """Per node in `nodes`: running, stopped or missing, with its identity; plus what
        else of the cluster exists. Raises OperationFailed when it cannot tell."""

    def repair(self, spec: "ClusterSpec", state: "ClusterState", cluster: Cluster, seen: Observation) -> Repair:
        """Bring back what the record holds but the host or an operator took away: start
        stopped nodes, restore the network; name the missing nodes Terraform must recreate."""

    def place(self, spec: "ClusterSpec", state: "ClusterState", cluster: Cluster) -> str | None:
        """Settings that follow the cluster's machines, after Terraform (local: each node's
        cores; OpenStack: the teardown credential naming the servers); returns a line for
        the user, or None."""

    def settle(self, spec: "ClusterSpec", state: "ClusterState") -> str | None:
        """After a play that configured the master: drop what the play has replaced on it
        (OpenStack: revoke the teardown credentials the new one superseded); a line or None."""

    def remove_leftovers(self, state: "ClusterState", env: dict[str, str]) -> list[str]:
        """After Terraform's destroy, before `down` checks that nothing is left: remove what
        the provider made for this cluster (its id says so) that Terraform's destroy did
        not (local: a node whose creation failed); what was removed, for the user."""

    def forget(self, state: "ClusterState", env: dict[str, str]) -> None:
        """After a destroy that left nothing: revoke what the provider made outside
        Terraform for the cluster (OpenStack: the teardown credential)."""

    def inventory_vars(self, spec: "ClusterSpec", state: "ClusterState", cluster: Cluster) -> dict[str, Any]:
        """Group variables only this provider's roles read (OpenStack: the master's teardown
        timer), with every key present whatever the provider."""

    def expired_in_cloud(self, env: dict[str, str], at: datetime) -> list[CloudCluster]:
        """Every cluster in the project whose machines carry an expiry before `at`, one per
        cluster id (local: none; containers carry no expiry of their own)."""

    def record_expiry(self, state: "ClusterState", env: dict[str, str], expires_at: str | None, was: str | None) -> str | None:
        """Put a cluster's new expiry (None: none) where the cloud keeps it, before the state
        dir records it (OpenStack: every server's and the volume's metadata; local: nowhere,
        lifetime.json is the only record). A line for the user or None; OperationFailed
        naming what did and did not take it when a write fails."""

    def cloud_keeps(self, state: "ClusterState", env: dict[str, str], at: datetime) -> str | None:
        """Why the cloud's own record keeps the cluster past `at` although the state dir says
        it has expired (OpenStack: a server or the volume with a later expiry, or none), or
        None. Read by `down` for gc, under the cluster's lock, before anything is destroyed."""

    def delete_from_cloud(self, env: dict[str, str], name: str, cluster_id: str, *, say: Callable[[str], None],
                          expired_at: datetime) -> list[str]:
        """Delete a cluster by its id in the cloud's metadata, with no state dir: what was
        deleted. NoLongerExpired when it was extended since it was listed; OperationFailed
        when something is left."""

    def boot_log_hint(self, node: str) -> str:
        """Where to look when `node` never answers SSH or cloud-init fails (a console-log command)."""

    def manual_cleanup_hint(self, state: "ClusterState") -> str:
        """How to list (and remove) by hand what `down` could not verify is gone: this
        cluster's only (its id), never a same-named one's."""


class ImageStore(Protocol):
    """Where a provider keeps baked images (`deployer image build/list/rm`, `image:` in the
    spec): local, versions beside the base image; OpenStack, Glance. A manifest
    (image_manifest.Manifest) says what each holds."""

    provider: str

    def images(self) -> list[Manifest]:
        """Every baked image this store holds, oldest first."""

    def lookup(self, name: str) -> Manifest | None:
        """The image's manifest; None: no such baked image."""

    def users(self, name: str) -> list[str]:
        """What stands on the image now (containers, servers): `image rm` refuses while any does."""

    def remove(self, name: str) -> None: ...

    def save(self, state: "ClusterState", cluster: "Cluster", name: str, manifest: Manifest) -> str:
        """The builder (the cluster's one node) saved as the sealed image `name` carrying the
        manifest; returns where it is. The builder itself is the caller's to delete."""

    def flavor_gpus(self, spec: "ClusterSpec", checked: object) -> tuple[int, str]:
        """What the preflight learnt of the nodes' size: (GPUs per node, the flavor's name)."""

    def base(self, spec: "ClusterSpec") -> str:
        """The image a bake starts from, for the manifest."""
