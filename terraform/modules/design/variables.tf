variable "cluster_name" {
  type        = string
  description = "Cluster name; prefixes every node name."
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.cluster_name))
    error_message = "cluster_name: 1-20 characters, lowercase letters, digits and '-', starting with a letter."
  }
}

variable "node_count" {
  type        = number
  description = "Number of nodes, the master included."
  validation {
    condition     = var.node_count >= 1 && floor(var.node_count) == var.node_count
    error_message = "node_count must be a whole number >= 1."
  }
}

variable "gpus_per_node" {
  type        = number
  description = "GPUs on each node (0 for CPU nodes)."
  default     = 0
  validation {
    condition     = var.gpus_per_node >= 0 && var.gpus_per_node <= 16
    error_message = "gpus_per_node must be between 0 and 16."
  }
}
