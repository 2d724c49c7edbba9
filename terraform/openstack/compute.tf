# The nodes. The deployer's cluster key always goes in through cloud-init for
# ssh_user (Ansible and MPI use it); key_pair, when given, adds an existing Nova key
# pair (e.g. the user's own) and otherwise the cluster key is uploaded as one.

resource "openstack_compute_keypair_v2" "cluster" {
  count      = var.key_pair == null ? 1 : 0
  name       = "${var.cluster_name}-key"
  public_key = var.public_key
}

locals {
  key_pair = var.key_pair != null ? var.key_pair : openstack_compute_keypair_v2.cluster[0].name

  # `default` keeps the image's own user (ubuntu, debian, ...); a named entry with
  # the same name is merged into it by cloud-init, so ssh_user = "ubuntu" is fine.
  user_data = join("\n", ["#cloud-config", yamlencode({
    users = [
      "default",
      {
        name                = var.ssh_user
        shell               = "/bin/bash"
        sudo                = "ALL=(ALL) NOPASSWD:ALL"
        lock_passwd         = true
        ssh_authorized_keys = [trimspace(var.public_key)]
      },
    ]
    ssh_pwauth   = false
    disable_root = true
  })])
}

resource "openstack_compute_instance_v2" "node" {
  for_each    = module.design.nodes
  name        = each.key
  flavor_name = var.flavor_name
  image_id    = var.image_id
  image_name  = var.image_name
  key_pair    = local.key_pair
  user_data   = local.user_data

  metadata = {
    deployer_cluster = var.cluster_name
    deployer_role    = each.value.role
    deployer_index   = tostring(each.value.index)
  }

  network {
    port = openstack_networking_port_v2.node[each.key].id
  }

  lifecycle {
    precondition {
      condition     = (var.image_id == null) != (var.image_name == null)
      error_message = "Set exactly one of image_id and image_name."
    }

    # A changed image, key or user_data would rebuild or replace running nodes
    # (and the master's shared volume with them): they apply to new nodes only.
    # `deployer down` + `deployer up` rebuilds everything.
    ignore_changes = [image_id, image_name, key_pair, user_data]
  }
}
