"""The `cluster` output -> Ansible inventory and MPI hostfile.

Pure functions of (cluster, spec, state paths): the only things Ansible and mpirun
learn about the cluster come from here, so both providers look the same to them.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..image_manifest import roles_hash
from ..paths import assets_root
from ..providers import get_provider
from ..slurm import topology_conf
from .boot import ensure_host_ca

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..spec import ClusterSpec
    from ..state import ClusterState


def hostfile(cluster: Cluster) -> str:
    """One line per node, master first, the nodes of one host next to each other
    (cluster.by_host: neighbouring ranks share a host, and `head -n N` of it, bench's run on
    N nodes, spans as few hosts as there are); slots = GPUs (1 on CPU nodes)."""
    return "".join(f"{n.private_ip} slots={n.slots}\n" for n in cluster.by_host)


def render(cluster: Cluster, spec: "ClusterSpec", state: "ClusterState") -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for i, node in enumerate(cluster.nodes):
        hosts[node.name] = {
            # The node's Host block in the cluster's ssh_config (boot.ssh_config) says how
            # to reach it: address, key, pinned known_hosts, the hop through the master.
            "ansible_host": node.name,
            "ansible_user": cluster.ssh_user,
            "ansible_ssh_common_args": shlex.join(["-F", str(state.ssh_config)]),
            "private_ip": node.private_ip,
            "node_role": node.role,
            "node_index": i,
            "gpus": node.gpus,
            # Where it runs (placement); None: not known.
            "node_host": node.host,
            "node_zone": node.zone,
        }
    m = spec.monitoring
    group_vars = {
        "deployer_cluster_name": cluster.name,
        "deployer_cluster_id": state.cluster_id,  # origin.json: what the cloud's metadata carries
        "deployer_provider": cluster.provider,
        "deployer_ssh_user": cluster.ssh_user,
        "deployer_shared_dir": cluster.shared_dir,
        "deployer_shared_device": cluster.shared_device,
        # What the roles branch on: capabilities from the cluster output, never the provider's name.
        "deployer_shared_storage": cluster.shared_storage,
        "deployer_grafana_installable": cluster.grafana_installable,
        "deployer_host_package_sources": cluster.host_package_sources,
        "deployer_cluster_cidr": cluster.cluster_cidr,
        "deployer_master_ip": cluster.master.private_ip,
        # What the nodes trust of each other (ssh_mesh): the CA that signs each node's own
        # host key (rekey.py), not the keys, so a node made anew changes nothing here.
        "deployer_host_ca": ensure_host_ca(state),
        "deployer_hostfile": hostfile(cluster),
        "deployer_enable_gpu": cluster.has_gpus,
        "deployer_nvidia_driver_install": spec.openstack.nvidia_driver_install,
        "deployer_nvidia_driver_branch": spec.openstack.nvidia_driver_branch,
        # passthrough | vgpu (the spec, or the flavor as the preflight read it) | auto
        "deployer_gpu_virtualization": spec.openstack.gpu_virtualization,
        "deployer_torch_release": spec.gpu_runtime.torch,
        "deployer_torch_variant": spec.gpu_runtime.cuda,
        "deployer_monitoring_enabled": m.enabled,
        "deployer_monitoring_expose": m.expose,
        "deployer_monitoring_allowed_cidrs": [str(c) for c in m.allowed_cidrs],
        "deployer_monitoring_retention": m.retention,
        "deployer_grafana_enabled": m.grafana,
        "deployer_jupyter_enabled": spec.jupyter,
        "deployer_scheduler": spec.scheduler,
        # Slurm's topology.conf from where the nodes run (slurm.topology_conf); None: not known.
        "deployer_slurm_topology": topology_conf(cluster),
        "deployer_health_enabled": spec.health.enabled,
        "deployer_health_interval_s": spec.health.interval_s,
        "deployer_secrets_dir": str(state.secrets_dir),
        "deployer_repo_dir": str(assets_root()),
        # What a baked image's manifest must carry for its nodes to keep what it holds
        # (deployer/image_manifest.py; ansible/group_vars/all.yml: deployer_image_unfit).
        "deployer_roles_hash": roles_hash(),
        # The teardown_timer role runs everywhere (it removes a timer a cluster no longer
        # wants); what it installs, and for which servers, only the provider knows.
        **get_provider(cluster.provider).inventory_vars(spec, state, cluster),
    }
    return {
        "all": {
            "hosts": hosts,
            "vars": group_vars,
            "children": {
                "master": {"hosts": {cluster.master.name: {}}},
                "workers": {"hosts": {n.name: {} for n in cluster.workers}},
                "gpu": {"hosts": {n.name: {} for n in cluster.nodes if n.gpus > 0}},
            },
        }
    }


def path(state: "ClusterState") -> Path:
    """The Ansible inventory of a cluster (beside it: the MPI hostfile)."""
    return state.inventory_dir / "hosts.yml"


def write(cluster: Cluster, spec: "ClusterSpec", state: "ClusterState") -> Path:
    d = state.inventory_dir
    d.mkdir(parents=True, exist_ok=True)
    hosts = path(state)
    hosts.write_text(
        "# Rendered by deployer from the Terraform `cluster` output; do not edit.\n"
        + yaml.safe_dump(render(cluster, spec, state), sort_keys=False)
    )
    (d / "hostfile").write_text(hostfile(cluster))
    return hosts
