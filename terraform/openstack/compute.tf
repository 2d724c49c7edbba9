# The nodes. Each boots from its own cloud-init user-data, rendered by the deployer
# (deployer/pipeline/boot.py) into boot_dir before Terraform runs: the cluster user with the
# cluster key and passwordless sudo, and the node's own SSH host key, which the
# deployer pins in known_hosts before the first connection. The local provider boots
# its containers from the same text. key_pair, when given, adds an existing Nova key
# pair (e.g. the user's own); otherwise the cluster key is uploaded as one.

# Nova keeps key pair names unique per user: the id keeps two same-named clusters apart.
resource "openstack_compute_keypair_v2" "cluster" {
  count      = var.key_pair == null ? 1 : 0
  name       = "${var.cluster_name}-key-${var.cluster_id}"
  public_key = var.public_key
}

locals {
  key_pair = var.key_pair != null ? var.key_pair : openstack_compute_keypair_v2.cluster[0].name
  # Boot from a volume needs the image's id; a name is looked up once.
  image_id = var.image_id != null ? var.image_id : data.openstack_images_image_v2.node[0].id
}

data "openstack_images_image_v2" "node" {
  count       = var.image_id == null ? 1 : 0
  name        = var.image_name
  most_recent = true
}

# Where Nova puts the nodes (openstack.placement): one server group per cluster, which
# every node joins at creation. Its name carries the id (a group can carry neither
# metadata nor tags: down's leftover check and gc find it by the name). The soft
# policies need compute microversion 2.15, which the provider asks for itself
# (compute_servergroup_v2.go). `policies` is ForceNew: the deployer's preflight refuses a
# changed placement on a running cluster instead of letting a replaced group orphan it.
resource "openstack_compute_servergroup_v2" "cluster" {
  count    = var.placement_policy == null ? 0 : 1
  name     = "${var.cluster_name}-${var.cluster_id}"
  policies = [var.placement_policy]
}

resource "openstack_compute_instance_v2" "node" {
  for_each = module.design.nodes
  name     = each.key
  # The ID the preflight resolved when it ran (openstack.flavor may be a name or an ID).
  flavor_id   = var.flavor_id
  flavor_name = var.flavor_id == null ? var.flavor_name : null
  # Booted from a volume (root_volume_size) the image is the volume's source instead.
  image_id  = var.root_volume_size == null ? local.image_id : null
  key_pair  = local.key_pair
  user_data = file("${var.boot_dir}/${each.key}.user-data")
  # The user-data (the cluster key, the node's host key) on a config drive: cloud-init
  # reads it there at first boot, with no metadata service on the way (the emulated VMs
  # of tests/vm boot the same way). A cloud without config drives still has Nova's
  # metadata service, reached through the router (depends_on below).
  config_drive = true

  # deployer_cluster_id decides what is this cluster's (the name is for people);
  # deployer_expires_at (--ttl) lets `deployer gc` find an expired cluster without
  # this machine's state.
  metadata = merge({
    deployer_cluster    = var.cluster_name
    deployer_cluster_id = var.cluster_id
    deployer_role       = each.value.role
    deployer_index      = tostring(each.value.index)
  }, var.expires_at == null ? {} : { deployer_expires_at = var.expires_at })

  network {
    port = openstack_networking_port_v2.node[each.key].id
  }

  # Into the cluster's server group, when it has one. The hint is read at creation only.
  dynamic "scheduler_hints" {
    for_each = openstack_compute_servergroup_v2.cluster[*].id
    content {
      group = scheduler_hints.value
    }
  }

  # GPU flavors often have a small (or 0 GB) root disk: boot from a Cinder volume
  # made from the image, deleted with the server.
  dynamic "block_device" {
    for_each = var.root_volume_size == null ? [] : [var.root_volume_size]
    content {
      uuid                  = local.image_id
      source_type           = "image"
      destination_type      = "volume"
      volume_size           = block_device.value
      boot_index            = 0
      delete_on_termination = true
    }
  }

  # Where cloud-init falls back to the metadata service (169.254.169.254), the path to it
  # is the subnet's router interface: the servers boot only once it exists (an existing
  # network has its own router; the list is then empty).
  depends_on = [openstack_networking_router_interface_v2.cluster]

  lifecycle {
    precondition {
      condition     = (var.image_id == null) != (var.image_name == null)
      error_message = "Set exactly one of image_id and image_name."
    }

    # A changed image, key or user_data would rebuild or replace running nodes
    # (and the master's shared volume with them): they apply to new nodes only.
    # `deployer down` + `deployer up` rebuilds everything.
    # The flavor too: the provider updates flavor_id in place, resizing and confirming a
    # running server (a GPU passthrough VM under a running job). The deployer's preflight
    # refuses a flavor the running nodes do not have unless `--replace` names every one of
    # them (they are made anew with it); this keeps Terraform from resizing even if run
    # by hand. config_drive is ForceNew: nodes made before it was set are kept as they are.
    # scheduler_hints too (its group is ForceNew, and the provider never reads it back):
    # nodes made before the cluster had a server group stay where they are, outside it;
    # only nodes made from then on join it.
    ignore_changes = [image_id, key_pair, user_data, block_device, flavor_id, flavor_name, config_drive, scheduler_hints]
  }
}
