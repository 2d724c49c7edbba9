variable "cluster_name" {
  type        = string
  description = "Cluster name; prefixes node, bridge and firewall-table names."
}

variable "cluster_id" {
  type        = string
  description = "The cluster's random id (origin.json in its state dir): recorded beside each container by the driver, which refuses to start or destroy a container another cluster of the same name made."
  validation {
    condition     = can(regex("^[0-9a-f]{12}$", var.cluster_id))
    error_message = "cluster_id: 12 lowercase hex digits (the deployer makes it)."
  }
}

variable "node_count" {
  type        = number
  description = "Number of nodes, the master included."
}

variable "subnet" {
  type        = string
  description = "Private IPv4 subnet of the cluster bridge, e.g. 10.77.0.0/24. The host takes .1, nodes .10 upwards."
  validation {
    condition     = can(cidrhost(var.subnet, 0)) && can(regex("^[0-9.]+/[0-9]+$", var.subnet))
    error_message = "subnet must be an IPv4 CIDR such as 10.77.0.0/24."
  }
}

variable "bridge" {
  type        = string
  description = "Linux bridge name for the cluster network (at most 15 characters)."
  validation {
    condition     = length(var.bridge) <= 15 && can(regex("^[a-z0-9-]+$", var.bridge))
    error_message = "bridge must be at most 15 characters of [a-z0-9-]."
  }
}

variable "ssh_user" {
  type        = string
  description = "Non-root cluster user created in every node, with passwordless sudo as on a cloud image."
  default     = "deployer"
}

variable "shared_dir" {
  type        = string
  description = "Path of the shared directory inside every node (where NFS mounts it on the cloud)."
  default     = "/shared"
}

variable "shared_host_dir" {
  type        = string
  description = "Host directory bind-mounted at shared_dir on every node."
}

variable "boot_dir" {
  type        = string
  description = "Directory of each node's cloud-init user-data, <node name>.user-data (rendered by the deployer)."
  validation {
    condition     = startswith(var.boot_dir, "/")
    error_message = "boot_dir must be an absolute path."
  }
}

variable "access" {
  type        = string
  description = "How the host reaches the nodes: direct (every node) or via_master (the master only; workers through it)."
  default     = "direct"
  validation {
    condition     = contains(["direct", "via_master"], var.access)
    error_message = "access must be direct or via_master."
  }
}

variable "memory_mb" {
  type        = number
  description = "Memory limit of each node container, in MiB."
  default     = 2048
}

variable "image" {
  type        = string
  description = "A baked image's name (`deployer image list`) the nodes stand on; null: the Debian base image."
  default     = null
  nullable    = true

  validation {
    condition     = var.image == null || can(regex("^[a-z0-9][a-z0-9.-]{0,62}$", var.image))
    error_message = "image: a baked image's name, lower-case letters, digits, '.' and '-'."
  }
}

variable "host_cpus" {
  type        = number
  description = "CPUs this machine gives the nodes: each node gets cores of its own when there are at least as many as nodes, else they share them (the benchmarks size their threads by it)."
  default     = 1

  validation {
    condition     = var.host_cpus >= 1
    error_message = "host_cpus must be at least 1."
  }
}

variable "driver" {
  type        = list(string)
  description = "Command that runs the deployer's LXC node driver (deployer/providers/local/lxc.py, run as a module)."
}
