output "cluster" {
  description = "The provider-blind cluster description (docs/architecture.md, 'The `cluster` output contract'), plus shared_device and cluster_cidr for the NFS roles."
  value = {
    name       = var.cluster_name
    provider   = "openstack"
    ssh_user   = var.ssh_user
    shared_dir = var.shared_dir
    # Only the master has a public address; workers are reached through it.
    access = "via_master"
    # /shared is exported by the master over NFS.
    shared_storage = "nfs"
    # What the nodes are, for the benchmark's reproducibility record, and what the flavor
    # promises of each, for `deployer check` (vCPUs, RAM in MiB; null: not known).
    machine = {
      image = coalesce(var.image_name, var.image_id), flavor = var.flavor_name,
      vcpus = var.flavor_vcpus, ram_mb = var.flavor_ram_mb
    }
    # Each VM has its own vCPUs.
    shared_cpus = null
    # The nodes use the public package sources.
    host_package_sources = false
    # Grafana comes from apt.grafana.com, which cloud nodes reach.
    grafana_installable = true
    nodes = [
      for name in module.design.names : {
        name       = name
        role       = module.design.nodes[name].role
        id         = openstack_compute_instance_v2.node[name].id
        private_ip = openstack_networking_port_v2.node[name].all_fixed_ips[0]
        public_ip  = module.design.nodes[name].role == "master" ? openstack_networking_floatingip_associate_v2.master.floating_ip : null
        gpus       = module.design.nodes[name].gpus
      }
    ]
    # The private subnet (NFS is exported to it), and (OpenStack only) the master's
    # block device for the shared volume.
    cluster_cidr  = local.cluster_cidr
    shared_device = local.shared_device
  }

  depends_on = [openstack_compute_volume_attach_v2.shared, openstack_compute_instance_v2.node]
}
