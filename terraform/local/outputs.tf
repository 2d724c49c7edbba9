output "cluster" {
  description = "The provider-blind cluster description (see docs/architecture.md, 'The `cluster` output contract')."
  value = {
    name       = var.cluster_name
    provider   = "local"
    ssh_user   = var.ssh_user
    shared_dir = var.shared_dir
    # direct: the host sits on the cluster bridge and reaches every node.
    # via_master: a firewall rule lets it reach the master only, as on OpenStack.
    access = var.access
    # The private network, for the exports and firewall rules that name it.
    cluster_cidr = var.subnet
    # /shared is a bind mount of a host directory (the kernel here has no NFS).
    shared_storage = "host_bind"
    # What the nodes are, for the benchmark's reproducibility record.
    # ram_mb: each container's memory limit, which `deployer check` holds the nodes to.
    machine = { image = var.image == null ? "debian-bookworm (LXC, debootstrap)" : "${var.image} (baked on debian-bookworm)", flavor = "container: ${var.memory_mb} MiB", ram_mb = var.memory_mb }
    # With at least one core per node, each node is pinned to cores of its own (the
    # deployer's CPU plan, deployer/providers/local/pinning.py); with fewer, they share them all.
    shared_cpus = var.host_cpus >= var.node_count ? null : var.host_cpus
    # The nodes use this host's apt and pip sources (its local wheel folders included).
    host_package_sources = true
    # Grafana's only package source (apt.grafana.com) is out of reach of local nodes.
    grafana_installable = false
    nodes = [
      for name in module.design.names : {
        name       = name
        role       = terraform_data.node[name].input.role
        id         = terraform_data.node[name].id
        private_ip = terraform_data.node[name].input.ip
        public_ip  = terraform_data.node[name].input.role == "master" ? terraform_data.node[name].input.ip : null
        gpus       = module.design.nodes[name].gpus
      }
    ]
  }
}
