# The node map shared by every provider module, so the `cluster` output contract
# (master first, stable names, roles) cannot drift between clouds.
# Names are keyed by role and index: scaling out adds worker-N+1, scaling in removes
# the highest workers, and survivors keep their keys (for_each never recreates them).

locals {
  names = concat(
    ["${var.cluster_name}-master"],
    [for i in range(1, var.node_count) : "${var.cluster_name}-worker-${i}"],
  )

  nodes = {
    for i, name in local.names : name => {
      name  = name
      index = i
      role  = i == 0 ? "master" : "worker"
      gpus  = var.gpus_per_node
    }
  }
}
