# Two security groups:
#   <name>-cluster  on every node: any traffic between members of the group (MPI,
#                   NCCL, NFS, exporters), nothing from outside.
#   <name>-master   on the master only: SSH from admin_cidr, and the monitoring
#                   ports from monitoring_allowed_cidrs only when monitoring_expose.
# Both keep Neutron's default egress rules.

resource "openstack_networking_secgroup_v2" "cluster" {
  name        = "${var.cluster_name}-cluster"
  description = "deployer ${var.cluster_name}: all traffic between cluster nodes"
  tags        = local.tags
}

resource "openstack_networking_secgroup_rule_v2" "cluster_internal" {
  for_each          = toset(["IPv4", "IPv6"])
  description       = "any protocol from members of ${var.cluster_name}-cluster"
  direction         = "ingress"
  ethertype         = each.key
  remote_group_id   = openstack_networking_secgroup_v2.cluster.id
  security_group_id = openstack_networking_secgroup_v2.cluster.id
}

resource "openstack_networking_secgroup_v2" "master" {
  name        = "${var.cluster_name}-master"
  description = "deployer ${var.cluster_name}: SSH and (optionally) monitoring to the master"
  tags        = local.tags
}

resource "openstack_networking_secgroup_rule_v2" "ssh" {
  description       = "SSH from the admin CIDR"
  direction         = "ingress"
  ethertype         = "IPv4"
  protocol          = "tcp"
  port_range_min    = 22
  port_range_max    = 22
  remote_ip_prefix  = var.admin_cidr
  security_group_id = openstack_networking_secgroup_v2.master.id
}

locals {
  monitoring_rules = var.monitoring_expose ? {
    for pair in setproduct(var.monitoring_allowed_cidrs, var.monitoring_ports) :
    "${pair[0]}:${pair[1]}" => { cidr = pair[0], port = pair[1] }
  } : {}
}

resource "openstack_networking_secgroup_rule_v2" "monitoring" {
  for_each          = local.monitoring_rules
  description       = "monitoring port ${each.value.port} from ${each.value.cidr}"
  direction         = "ingress"
  ethertype         = "IPv4"
  protocol          = "tcp"
  port_range_min    = each.value.port
  port_range_max    = each.value.port
  remote_ip_prefix  = each.value.cidr
  security_group_id = openstack_networking_secgroup_v2.master.id
}
