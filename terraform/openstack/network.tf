# The cluster network: a dedicated network + subnet + router to the external
# network (create_network = true), or an existing network of the project.

# By ID when the preflight resolved one (a name can be ambiguous or be an ID itself).
data "openstack_networking_network_v2" "external" {
  name       = var.external_network_id == null ? var.external_network : null
  network_id = var.external_network_id
  external   = true
}

resource "openstack_networking_network_v2" "cluster" {
  count          = var.create_network ? 1 : 0
  name           = "${var.cluster_name}-net"
  description    = "deployer cluster ${var.cluster_name}"
  admin_state_up = true
  tags           = local.tags
}

resource "openstack_networking_subnet_v2" "cluster" {
  count           = var.create_network ? 1 : 0
  name            = "${var.cluster_name}-subnet"
  network_id      = openstack_networking_network_v2.cluster[0].id
  cidr            = var.network_cidr
  ip_version      = 4
  enable_dhcp     = true
  dns_nameservers = var.dns_nameservers
  tags            = local.tags
}

resource "openstack_networking_router_v2" "cluster" {
  count               = var.create_network ? 1 : 0
  name                = "${var.cluster_name}-router"
  description         = "deployer cluster ${var.cluster_name}: NAT and floating IPs"
  admin_state_up      = true
  external_network_id = data.openstack_networking_network_v2.external.id
  tags                = local.tags
}

resource "openstack_networking_router_interface_v2" "cluster" {
  count     = var.create_network ? 1 : 0
  router_id = openstack_networking_router_v2.cluster[0].id
  subnet_id = openstack_networking_subnet_v2.cluster[0].id
}

data "openstack_networking_network_v2" "existing" {
  count      = var.create_network ? 0 : 1
  name       = var.network_id == null ? var.network_name : null
  network_id = var.network_id
}

# The deployer's preflight checks that an existing network has exactly one IPv4
# subnet; every node gets its address there.
data "openstack_networking_subnet_v2" "existing" {
  count      = var.create_network ? 0 : 1
  network_id = data.openstack_networking_network_v2.existing[0].id
  ip_version = 4
}

locals {
  network_id   = var.create_network ? openstack_networking_network_v2.cluster[0].id : data.openstack_networking_network_v2.existing[0].id
  subnet_id    = var.create_network ? openstack_networking_subnet_v2.cluster[0].id : data.openstack_networking_subnet_v2.existing[0].id
  cluster_cidr = var.create_network ? openstack_networking_subnet_v2.cluster[0].cidr : data.openstack_networking_subnet_v2.existing[0].cidr
}

# One port per node, keyed by name: the security groups sit on the ports (not on
# the instances), and the master's port is what the floating IP points at.
resource "openstack_networking_port_v2" "node" {
  for_each       = module.design.nodes
  name           = "${each.key}-port"
  network_id     = local.network_id
  admin_state_up = true
  security_group_ids = concat(
    [openstack_networking_secgroup_v2.cluster.id],
    each.value.role == "master" ? [openstack_networking_secgroup_v2.master.id] : [],
  )
  tags = local.tags

  fixed_ip {
    subnet_id = local.subnet_id
  }
}

# A floating IP on the master only; workers are reached through it (access = "via_master").
# `pool` is a name only: the provider (v3.4.0, resource_openstack_networking_floatingip_v2.go)
# lists networks of that name and takes the first, external or not. value_specs are
# merged into the create request last (util.go, AddValueSpecs), so floating_network_id
# there is what Neutron gets: the external network the preflight resolved, by ID. `pool`
# must still name some network (the provider refuses an empty look-up) and is what Read
# sets back from the ID, so the name it carries is that network's.
resource "openstack_networking_floatingip_v2" "master" {
  count       = var.floating_ip == null ? 1 : 0
  pool        = data.openstack_networking_network_v2.external.name
  value_specs = { floating_network_id = data.openstack_networking_network_v2.external.id }
  description = "deployer ${var.cluster_name} master"
  tags        = local.tags

  # value_specs is ForceNew: a floating IP allocated before it was set keeps its address.
  lifecycle {
    ignore_changes = [value_specs]
  }
}

resource "openstack_networking_floatingip_associate_v2" "master" {
  floating_ip = var.floating_ip != null ? var.floating_ip : openstack_networking_floatingip_v2.master[0].address
  port_id     = openstack_networking_port_v2.node[local.master].id

  # A floating IP needs the subnet routed to the external network first.
  depends_on = [openstack_networking_router_interface_v2.cluster]
}
