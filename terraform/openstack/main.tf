# OpenStack provider: one VM per node on a private network, the master reachable
# through a floating IP, a Cinder volume on the master exported over NFS.
#
# Credentials never pass through Terraform variables: the provider reads the same
# clouds.yaml entry the deployer's preflight used (var.cloud, else $OS_CLOUD).
#
# Every per-node resource is keyed by node name (for_each over the design module's
# map), so scaling out adds worker-N+1 and scaling in removes the highest workers
# without touching the survivors.

provider "openstack" {
  cloud = var.cloud
}

module "design" {
  source        = "../modules/design"
  cluster_name  = var.cluster_name
  node_count    = var.node_count
  gpus_per_node = var.enable_gpu ? var.gpus_per_node : 0
}

locals {
  master = module.design.names[0]

  # Tags on the Neutron resources: the name for a person, the id for the deployer
  # (`down`'s leftover check, `gc`), which never takes a same-named cluster for this one.
  tags = ["deployer", "deployer-cluster-${var.cluster_name}", "deployer-id-${var.cluster_id}"]
}
