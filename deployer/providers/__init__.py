"""Providers: each cloud behind the small interface in base.py."""

from __future__ import annotations

from .base import ImageStore, Provider


def get_provider(name: str) -> Provider:
    # Imported lazily: openstacksdk alone costs ~1 s of import time.
    if name == "local":
        from .local.provider import LocalProvider

        return LocalProvider()
    if name == "openstack":
        from .openstack.provider import OpenStackProvider

        return OpenStackProvider()
    raise ValueError(name)


def get_images(name: str, cloud: str | None = None) -> ImageStore:
    """The provider's baked images (`deployer image ...`, `image:` in the spec); `cloud`:
    the clouds.yaml entry (OpenStack; default $OS_CLOUD)."""
    if name == "local":
        from .local.baked import LocalImages

        return LocalImages()
    if name == "openstack":
        from .openstack.images import GlanceImages

        return GlanceImages(cloud)
    raise ValueError(name)
