# Local provider: every node is an LXC system container on a private bridge.
# Terraform holds the record of what exists; the deployer's LXC node driver does the
# work in local-exec provisioners. Destroy-time provisioners may only read `self`, so
# everything the driver needs is kept in each resource's `input`.

module "design" {
  source        = "../modules/design"
  cluster_name  = var.cluster_name
  node_count    = var.node_count
  gpus_per_node = 0 # no GPUs in containers here
}

locals {
  prefix_len = tonumber(split("/", var.subnet)[1])
  gateway    = cidrhost(var.subnet, 1)
  driver     = join(" ", [for a in var.driver : format("'%s'", a)])
  # Nodes take .10 upwards; the master is index 0.
  master_ip = cidrhost(var.subnet, 10)
}

resource "terraform_data" "network" {
  input = {
    driver = local.driver
    # network-up's arguments, the fields of NetworkUp (deployer/providers/local/network.py),
    # handed to the driver whole as JSON; LocalProvider.repair builds the same in Python.
    network = {
      cluster = var.cluster_name
      bridge  = var.bridge
      subnet  = var.subnet
      gateway = "${local.gateway}/${local.prefix_len}"
      # access = via_master: the host may reach the master only (a firewall rule).
      only_master = var.access == "via_master" ? local.master_ip : null
    }
  }

  provisioner "local-exec" {
    command     = "${self.input.driver} network-up"
    environment = { DEPLOYER_LXC_ARGS = jsonencode(self.input.network) }
  }

  provisioner "local-exec" {
    when        = destroy
    command     = "${self.input.driver} network-down"
    environment = { DEPLOYER_LXC_ARGS = jsonencode(self.input.network) }
  }
}

resource "terraform_data" "node" {
  for_each = module.design.nodes

  input = {
    driver = local.driver
    role   = each.value.role
    ip     = cidrhost(var.subnet, 10 + each.value.index)
    # node-up's arguments, the fields of NodeUp (deployer/providers/local/node.py), handed
    # to the driver whole as JSON; LocalProvider.repair builds the same in Python.
    node = {
      name       = each.key
      ip         = "${cidrhost(var.subnet, 10 + each.value.index)}/${local.prefix_len}"
      gateway    = local.gateway
      bridge     = terraform_data.network.input.network.bridge
      shared     = "${var.shared_host_dir}:${var.shared_dir}"
      memory_mb  = var.memory_mb
      cluster_id = var.cluster_id
      # The node's cloud-init user-data (deployer/pipeline/boot.py), the same text OpenStack
      # hands to Nova; the driver seeds it into the container as NoCloud.
      user_data = "${var.boot_dir}/${each.key}.user-data"
      # The baked image the node stands on (`deployer image build`); null: the base image.
      image = var.image
    }
  }

  lifecycle {
    precondition {
      condition     = fileexists("${var.boot_dir}/${each.key}.user-data")
      error_message = "No user-data for ${each.key} in boot_dir: `deployer up` renders it before Terraform runs."
    }
  }

  # self.id (new whenever Terraform makes the node anew) becomes the container's
  # cloud-init instance-id: the node's identity in the cluster output.
  provisioner "local-exec" {
    command     = "${self.input.driver} node-up"
    environment = { DEPLOYER_LXC_ARGS = jsonencode(merge(self.input.node, { instance_id = self.id })) }
  }

  provisioner "local-exec" {
    when        = destroy
    command     = "${self.input.driver} node-down"
    environment = { DEPLOYER_LXC_ARGS = jsonencode(self.input.node) }
  }
}
