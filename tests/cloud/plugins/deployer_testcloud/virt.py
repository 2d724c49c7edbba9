"""Nova's fake virt driver with a GPU (a child resource provider holding VGPU inventory)
and snapshots that reach Glance.

This is how Nova's libvirt driver reports vGPUs (one child provider per physical GPU,
named `<node>_pci_...`, with VGPU inventory), so a flavor asking `resources:VGPU=1` is
scheduled through placement's nested allocation candidates exactly as on a GPU cloud.
Loaded by nova-compute as `compute_driver = deployer_testcloud.virt.GPUFakeDriver`.

Nova's FakeDriver.snapshot only sets the task state, so the image that createImage made
stays `queued` forever and nothing can wait for a snapshot to finish. Here it does what
the libvirt driver's standard (non-direct) snapshot does once the disk is extracted: the
task states PENDING_UPLOAD then UPLOADING, and an upload through Nova's own Glance client
with the same metadata (nova/virt/libvirt/driver.py, LibvirtDriver.snapshot and
_create_snapshot_metadata). The disk is a few bytes: these servers have no disk.
"""

import io

import os_traits
from nova import exception
from nova.compute import task_states
from nova.image import glance
from nova.virt import fake

VGPUS = 64  # enough for the scale tests' flavors that ask for one each


class GPUFakeDriver(fake.FakeDriver):
    def update_provider_tree(self, provider_tree, nodename, allocations=None):
        super().update_provider_tree(provider_tree, nodename, allocations=allocations)
        child = f"{nodename}_pci_0000_81_00_0"
        if not provider_tree.exists(child):
            provider_tree.new_child(name=child, parent=nodename)
        provider_tree.update_inventory(child, {
            "VGPU": {"total": VGPUS, "reserved": 0, "min_unit": 1, "max_unit": VGPUS, "step_size": 1, "allocation_ratio": 1.0},
        })
        provider_tree.add_traits(child, os_traits.OWNER_NOVA)

    def snapshot(self, context, instance, image_id, update_task_state):
        if instance.uuid not in self.instances:
            raise exception.InstanceNotRunning(instance_id=instance.uuid)
        update_task_state(task_state=task_states.IMAGE_PENDING_UPLOAD)
        update_task_state(task_state=task_states.IMAGE_UPLOADING, expected_state=task_states.IMAGE_PENDING_UPLOAD)
        api = glance.API()
        name = api.get(context, image_id)["name"]
        metadata = {
            "status": "active", "name": name, "disk_format": "raw", "container_format": "bare",
            "properties": {"image_location": "snapshot", "image_state": "available", "owner_id": instance.project_id},
        }
        disk = f"test cloud snapshot of server {instance.uuid}\n".encode()
        api.update(context, image_id, metadata, io.BytesIO(disk), purge_props=False)
