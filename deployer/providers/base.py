"""The provider interface: all that orchestration knows about a cloud.

A provider checks that the environment can host the spec (preflight), names its
Terraform module and the variables for it, and cleans up what Terraform cannot see.
Everything after Terraform reads only the `cluster` output, so it never asks which
cloud it is talking to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..spec import ClusterSpec
    from ..state import ClusterState


class Provider(Protocol):
    name: str
    boot_timeout_s: int  # how long a new node may take to answer SSH and finish cloud-init

    def preflight(self, spec: "ClusterSpec", state: "ClusterState") -> None:
        """Raise PreflightError (exit 2) when the spec cannot be hosted; create nothing."""

    def tfvars(self, spec: "ClusterSpec", state: "ClusterState") -> dict[str, Any]:
        """Variables for terraform/<name>; every required variable of the module."""

    def terraform_env(self, spec: "ClusterSpec") -> dict[str, str]:
        """Environment the Terraform provider plugin needs (never a secret's value);
        raise UsageError when it names something unreadable."""

    def node_resource(self, node: str) -> str:
        """Terraform address of the machine of `node` (for `up --replace`)."""

    def prepare(self, spec: "ClusterSpec", state: "ClusterState") -> list[str]:
        """Work before Terraform (e.g. building the local base image, starting stopped
        nodes); returns the nodes it started again, which up then waits for."""

    def boot_log_hint(self, node: str) -> str:
        """Where to look when `node` never answers SSH or cloud-init fails (a console-log command)."""

    def leftovers(self, spec: "ClusterSpec", state: "ClusterState") -> list[str]:
        """What of this cluster still exists after `down` (empty when clean)."""
