# Every variable is typed, described and validated. The deployer writes them from
# cluster.yaml (deployer/providers/openstack/provider.py: OpenStackProvider.tfvars); no
# credential is ever one of them.

# ---- cloud and cluster -------------------------------------------------------------

variable "cloud" {
  type        = string
  description = "Entry in clouds.yaml holding the credentials; null: $OS_CLOUD (or the OS_* variables of an openrc)."
  default     = null
  validation {
    condition     = var.cloud == null || can(regex("^[^\\s]+$", var.cloud))
    error_message = "cloud must be a clouds.yaml entry name without spaces, or null."
  }
}

variable "cluster_name" {
  type        = string
  description = "Cluster name; prefixes every node, port, volume, network and security group name."
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.cluster_name))
    error_message = "cluster_name: 1-20 characters, lowercase letters, digits and '-', starting with a letter."
  }
}

variable "cluster_id" {
  type        = string
  description = "The cluster's random identity, made by the deployer when the cluster is first made (origin.json in its state dir): in every server's and the volume's metadata (deployer_cluster_id) and every network resource's tags (deployer-id-<id>). What finds, counts, expires or deletes the cluster's resources matches it, never the name: another cluster of the same name in the project is not this one."
  validation {
    condition     = can(regex("^[0-9a-f]{12}$", var.cluster_id))
    error_message = "cluster_id: 12 lowercase hex digits (the deployer makes it)."
  }
}

variable "expires_at" {
  type        = string
  description = "When the cluster's lifetime (--ttl) ends, UTC, e.g. 2026-11-23T20:00:00Z; put in every server's and the volume's metadata (deployer_expires_at) for `deployer gc`. null: no expiry."
  default     = null
  validation {
    condition     = var.expires_at == null || can(regex("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$", var.expires_at))
    error_message = "expires_at must be a UTC time like 2026-11-23T20:00:00Z, or null."
  }
}

variable "node_count" {
  type        = number
  description = "Number of nodes, the master included."
  validation {
    condition     = var.node_count >= 1 && var.node_count <= 64 && floor(var.node_count) == var.node_count
    error_message = "node_count must be a whole number from 1 to 64."
  }
}

variable "ssh_user" {
  type        = string
  description = "User that cloud-init creates (or keeps: the image's default user) with the cluster key and passwordless sudo."
  default     = "ubuntu"
  validation {
    condition     = can(regex("^[a-z_][a-z0-9_-]{0,31}$", var.ssh_user)) && var.ssh_user != "root"
    error_message = "ssh_user must be a valid non-root Linux user name (lowercase, at most 32 characters)."
  }
}

variable "shared_dir" {
  type        = string
  description = "Path of the shared directory on every node (NFS export on the master, mount on the workers)."
  default     = "/shared"
  validation {
    condition     = can(regex("^/[A-Za-z0-9_./-]+$", var.shared_dir))
    error_message = "shared_dir must be an absolute path of letters, digits, '_', '.', '/' and '-'."
  }
}

# ---- compute ---------------------------------------------------------------------------

variable "flavor_name" {
  type        = string
  description = "Nova flavor of every node (e.g. a V100 flavor for GPU nodes)."
  validation {
    condition     = length(trimspace(var.flavor_name)) > 0
    error_message = "flavor_name must not be empty."
  }
}

variable "flavor_id" {
  type        = string
  description = "The flavor's ID as the deployer's preflight resolved flavor_name (any string: DevStack's are 1..5, 42, c1); null: look flavor_name up."
  default     = null
  validation {
    condition     = var.flavor_id == null || length(trimspace(coalesce(var.flavor_id, " "))) > 0
    error_message = "flavor_id must not be empty; use null to look flavor_name up."
  }
}

variable "image_name" {
  type        = string
  description = "Glance image name for every node; set this or image_id, not both."
  default     = null
  validation {
    condition     = var.image_name == null || length(trimspace(coalesce(var.image_name, " "))) > 0
    error_message = "image_name must not be empty; use null to pick the image by image_id."
  }
}

variable "image_id" {
  type        = string
  description = "Glance image UUID for every node; set this or image_name, not both."
  default     = null
  validation {
    condition     = var.image_id == null || can(regex("^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$", coalesce(var.image_id, "x")))
    error_message = "image_id must be a UUID; use image_name for a name."
  }
}

variable "key_pair" {
  type        = string
  description = "Existing Nova key pair to put on the nodes as well; null: upload public_key as <cluster_name>-key-<cluster_id>."
  default     = null
  validation {
    condition     = var.key_pair == null || length(trimspace(coalesce(var.key_pair, " "))) > 0
    error_message = "key_pair must not be empty; use null to upload the cluster key."
  }
}

variable "public_key" {
  type        = string
  description = "The cluster's OpenSSH public key (the deployer's <state>/ssh/id_ed25519.pub), installed for ssh_user through cloud-init."
  validation {
    condition     = can(regex("^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+", var.public_key))
    error_message = "public_key must be one OpenSSH public key line (ssh-ed25519 AAAA...)."
  }
}

variable "boot_dir" {
  type        = string
  description = "Directory of each node's cloud-init user-data, <node name>.user-data, rendered by the deployer (it holds the node's SSH host key)."
  validation {
    condition     = startswith(var.boot_dir, "/")
    error_message = "boot_dir must be an absolute path."
  }
}

variable "root_volume_size" {
  type        = number
  description = "Boot every node from a Cinder volume of this many GiB made from the image (for flavors with a small root disk); null: boot from the flavor's disk."
  default     = null
  validation {
    condition     = var.root_volume_size == null || (coalesce(var.root_volume_size, 1) >= 1 && coalesce(var.root_volume_size, 1) <= 16384 && floor(coalesce(var.root_volume_size, 1)) == coalesce(var.root_volume_size, 1))
    error_message = "root_volume_size must be a whole number of GiB from 1 to 16384, or null."
  }
}

variable "enable_gpu" {
  type        = bool
  description = "Whether the nodes have GPUs (sets gpus in the cluster output, which puts them in the Ansible 'gpu' group)."
  default     = false
}

variable "gpus_per_node" {
  type        = number
  description = "GPUs per node when enable_gpu (the deployer reads it from the flavor's extra specs)."
  default     = 1
  validation {
    condition     = var.gpus_per_node >= 0 && var.gpus_per_node <= 16 && floor(var.gpus_per_node) == var.gpus_per_node
    error_message = "gpus_per_node must be a whole number from 0 to 16."
  }
}

variable "flavor_vcpus" {
  type        = number
  description = "vCPUs the flavor promises (the deployer's preflight read them from Nova); in the cluster output, for `deployer check`. null: unknown."
  default     = null
  validation {
    condition     = var.flavor_vcpus == null || try(var.flavor_vcpus >= 1 && floor(var.flavor_vcpus) == var.flavor_vcpus, false)
    error_message = "flavor_vcpus must be a whole number of at least 1, or null."
  }
}

variable "flavor_ram_mb" {
  type        = number
  description = "RAM in MiB the flavor promises (the deployer's preflight read it from Nova); in the cluster output, for `deployer check`. null: unknown."
  default     = null
  validation {
    condition     = var.flavor_ram_mb == null || try(var.flavor_ram_mb >= 1 && floor(var.flavor_ram_mb) == var.flavor_ram_mb, false)
    error_message = "flavor_ram_mb must be a whole number of MiB, at least 1, or null."
  }
}

variable "placement_policy" {
  type        = string
  description = "Policy of the cluster's Nova server group, which every node joins: soft-anti-affinity (spread over hypervisors while one has room), soft-affinity (pack), anti-affinity or affinity (a rule: a node Nova cannot place so fails to build); null: no server group. Fixed at creation: the deployer refuses a change on a running cluster."
  default     = null
  validation {
    condition     = var.placement_policy == null || contains(["soft-anti-affinity", "soft-affinity", "anti-affinity", "affinity"], coalesce(var.placement_policy, "-"))
    error_message = "placement_policy must be soft-anti-affinity, soft-affinity, anti-affinity, affinity or null."
  }
}

# ---- network -------------------------------------------------------------------------------

variable "external_network" {
  type        = string
  description = "External network: the floating-IP pool and, with create_network, the router's gateway."
  default     = "public"
  validation {
    condition     = length(trimspace(var.external_network)) > 0
    error_message = "external_network must name the cloud's external network (e.g. public)."
  }
}

variable "floating_ip" {
  type        = string
  description = "An existing, unassociated floating IP address of the project for the master; null: allocate one from external_network."
  default     = null
  validation {
    condition     = var.floating_ip == null || can(cidrhost("${coalesce(var.floating_ip, "x")}/32", 0))
    error_message = "floating_ip must be an IPv4 address such as 203.0.113.10, or null."
  }
}

variable "create_network" {
  type        = bool
  description = "true: create <cluster_name>-net with network_cidr and a router to external_network; false: use network_name."
  default     = true
}

variable "network_cidr" {
  type        = string
  description = "IPv4 CIDR of the created cluster subnet (create_network = true)."
  default     = "192.168.77.0/24"
  validation {
    condition     = can(cidrhost(var.network_cidr, 0)) && can(regex("^[0-9.]+/([0-9]|[12][0-9])$", var.network_cidr))
    error_message = "network_cidr must be an IPv4 CIDR of /29 or larger, such as 192.168.77.0/24."
  }
}

variable "dns_nameservers" {
  type        = list(string)
  description = "DNS servers of the created cluster subnet (create_network = true); empty (the default): none set, so the nodes use the cloud's own resolvers (Neutron's DHCP/DNS), which a cloud that blocks outbound DNS still answers."
  default     = []
  validation {
    condition     = alltrue([for ip in var.dns_nameservers : can(cidrhost("${ip}/32", 0))])
    error_message = "dns_nameservers must be IPv4 addresses such as 1.1.1.1."
  }
}

variable "network_name" {
  type        = string
  description = "Existing project network for the nodes (create_network = false); it must have exactly one IPv4 subnet routed to external_network."
  default     = null
  validation {
    condition     = var.network_name == null || length(trimspace(coalesce(var.network_name, " "))) > 0
    error_message = "network_name must not be empty; use null with create_network = true."
  }
}

variable "network_id" {
  type        = string
  description = "The existing network's ID as the preflight resolved network_name; null: look network_name up."
  default     = null
  validation {
    condition     = var.network_id == null || can(regex("^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$", coalesce(var.network_id, "x")))
    error_message = "network_id must be a UUID."
  }
}

variable "external_network_id" {
  type        = string
  description = "The external network's ID as the preflight resolved external_network; null: look it up by name."
  default     = null
  validation {
    condition     = var.external_network_id == null || can(regex("^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$", coalesce(var.external_network_id, "x")))
    error_message = "external_network_id must be a UUID."
  }
}

variable "admin_cidr" {
  type        = string
  description = "IPv4 CIDR allowed to SSH to the master (port 22 on the floating IP). No default: the deployer passes the spec's, or this machine's public address (/32)."
  validation {
    condition     = can(cidrhost(var.admin_cidr, 0)) && can(regex("^[0-9.]+/[0-9]+$", var.admin_cidr))
    error_message = "admin_cidr must be an IPv4 CIDR such as 203.0.113.0/24."
  }
}

# ---- monitoring --------------------------------------------------------------------------

variable "monitoring_expose" {
  type        = bool
  description = "Open monitoring_ports on the master to monitoring_allowed_cidrs; false: reachable only through `deployer dashboard` (SSH tunnel)."
  default     = false
}

variable "monitoring_allowed_cidrs" {
  type        = list(string)
  description = "IPv4 CIDRs allowed to reach the monitoring ports when monitoring_expose."
  default     = []
  validation {
    condition     = alltrue([for c in var.monitoring_allowed_cidrs : can(cidrhost(c, 0)) && can(regex("^[0-9.]+/[0-9]+$", c))])
    error_message = "monitoring_allowed_cidrs must be IPv4 CIDRs such as 203.0.113.0/24."
  }
}

variable "monitoring_ports" {
  type        = list(number)
  description = "TCP ports opened by monitoring_expose: Grafana's 3000 (HTTPS, login required). Prometheus (9090: no authentication), the Pushgateway (9091) and the exporters never leave the cluster network."
  default     = [3000]
  validation {
    condition     = alltrue([for p in var.monitoring_ports : p >= 1 && p <= 65535 && floor(p) == p && !contains([9090, 9091, 9100, 9400], p)])
    error_message = "monitoring_ports must be TCP port numbers (1-65535), never Prometheus's 9090, the Pushgateway's 9091 or an exporter's (9100, 9400)."
  }
}

# ---- storage -----------------------------------------------------------------------------------

variable "volume_size" {
  type        = number
  description = "Size in GiB of the Cinder volume attached to the master and shared over NFS."
  default     = 100
  validation {
    condition     = var.volume_size >= 1 && var.volume_size <= 65536 && floor(var.volume_size) == var.volume_size
    error_message = "volume_size must be a whole number of GiB from 1 to 65536."
  }
}

variable "volume_type" {
  type        = string
  description = "Cinder volume type of the shared volume (e.g. an SSD type); null: the cloud's default type."
  default     = null
  validation {
    condition     = var.volume_type == null || length(trimspace(coalesce(var.volume_type, " "))) > 0
    error_message = "volume_type must not be empty; use null for the cloud's default."
  }
}
