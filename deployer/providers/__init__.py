"""Providers: each cloud behind the small interface in base.py."""

from __future__ import annotations

from .base import Provider


def get_provider(name: str) -> Provider:
    # Imported lazily: openstacksdk alone costs ~1 s of import time.
    if name == "local":
        from .local.provider import LocalProvider

        return LocalProvider()
    if name == "openstack":
        from .openstack.provider import OpenStackProvider

        return OpenStackProvider()
    raise ValueError(name)
