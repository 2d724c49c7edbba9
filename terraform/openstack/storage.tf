# The shared volume: a Cinder volume attached to the master, formatted and
# exported over NFS by the nfs_server role, mounted by the workers (nfs_client).

resource "openstack_blockstorage_volume_v3" "shared" {
  name        = "${var.cluster_name}-shared"
  description = "deployer ${var.cluster_name}: the cluster's shared directory (NFS from the master)"
  size        = var.volume_size
  volume_type = var.volume_type

  metadata = merge({
    deployer_cluster    = var.cluster_name
    deployer_cluster_id = var.cluster_id
  }, var.expires_at == null ? {} : { deployer_expires_at = var.expires_at })
}

resource "openstack_compute_volume_attach_v2" "shared" {
  instance_id = openstack_compute_instance_v2.node[local.master].id
  volume_id   = openstack_blockstorage_volume_v3.shared.id
}

locals {
  # The attachment's `device` is only the hypervisor's guess; the guest's stable
  # name carries the volume ID (virtio-blk serial: its first 20 characters).
  # nfs_server falls back to a search of /dev/disk/by-id for that serial.
  shared_device = "/dev/disk/by-id/virtio-${substr(openstack_blockstorage_volume_v3.shared.id, 0, 20)}"
}
