"""Which provider made a cluster, and the environment its Terraform needs: what `down` and
`status` read before anything else (origin.json, or failing that the Terraform state)."""

from __future__ import annotations

from .state import ClusterState
from .tools import terraform


def origin_of(state: ClusterState) -> tuple[str, dict[str, str]] | None:
    """(provider, Terraform's environment) of the cluster: origin.json, which `up` writes
    before it makes anything. Should it be lost, the Terraform dir that holds resources
    still says which provider made them (whose environment is then the user's own
    OS_CLOUD), so `down` can destroy them. None when nothing of the cluster is recorded."""
    origin = state.origin()
    if origin:
        return origin.provider, origin.terraform_env
    for sub in sorted(state.terraform_dir.glob("*/terraform.tfstate")):
        if terraform.has_resources(sub.parent):
            return sub.parent.name, {}
    return None
