"""Nova's fake virt driver with a GPU: a child resource provider holding VGPU inventory.

This is how Nova's libvirt driver reports vGPUs (one child provider per physical GPU,
named `<node>_pci_...`, with VGPU inventory), so a flavor asking `resources:VGPU=1` is
scheduled through placement's nested allocation candidates exactly as on a GPU cloud.
Loaded by nova-compute as `compute_driver = deployer_testcloud.virt.GPUFakeDriver`.
"""

import os_traits
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
