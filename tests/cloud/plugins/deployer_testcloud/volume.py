"""Cinder's fake volume driver with each volume a sparse file, so that a volume can be made
from an image, as a node booted from a volume needs (`openstack.root_volume_size`).

The fake driver keeps volumes in Cinder's database only: its `local_path` is an LVM
device that does not exist, and `qemu-img convert` (how Cinder writes an image onto a new
volume) fails on it. Here each volume is a file under the service's state path, made at
create and removed at delete; the rest of the fake driver (no export, no iSCSI) is unchanged.
Loaded by cinder-volume as `volume_driver = deployer_testcloud.volume.FileBackedFakeDriver`.
"""

import os

from cinder.tests import fake_driver
from oslo_config import cfg


class FileBackedFakeDriver(fake_driver.FakeLoggingVolumeDriver):
    def local_path(self, volume, vg=None):
        return os.path.join(cfg.CONF.state_path, "volumes", f"volume-{volume.id}")

    def create_volume(self, volume):
        path = self.local_path(volume)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(volume.size * 1024**3)  # sparse: no disk is used for what is never written
        return super().create_volume(volume)

    def delete_volume(self, volume):
        try:
            os.remove(self.local_path(volume))
        except FileNotFoundError:
            pass
        return super().delete_volume(volume)
