"""Baked images on OpenStack: Glance images made from a builder server (Nova's createImage),
their manifest as image properties (image_manifest.Manifest.as_properties), found by the
property `deployer_roles_hash` that every bake carries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ...image_manifest import PROPERTY_PREFIX, Manifest
from .session import cloud_errors, connect, quiet_sdk_logs

if TYPE_CHECKING:
    from ...cluster import Cluster
    from ...spec import ClusterSpec
    from ...state import ClusterState

MARK = PROPERTY_PREFIX + "roles_hash"
ACTIVE_TIMEOUT_S = 1800  # a snapshot of a GPU image's disk is uploaded to Glance: minutes


def _props(image: Any) -> dict[str, Any]:
    props = dict(getattr(image, "properties", None) or {})
    return props


class GlanceImages:
    """The OpenStack provider's ImageStore (providers/base.py)."""

    provider = "openstack"

    def __init__(self, cloud: str | None = None) -> None:
        self.cloud = cloud
        self._conn: Any = None

    def _c(self) -> Any:
        if self._conn is None:
            with quiet_sdk_logs():
                self._conn, _ = connect(self.cloud)
        return self._conn

    def _baked(self) -> list[Any]:
        conn = self._c()
        with cloud_errors(conn, "listing images"):
            return [i for i in conn.image.images() if MARK in _props(i)]

    def images(self) -> list[Manifest]:
        found = [m for i in self._baked() if (m := Manifest.from_properties(_props(i))) is not None]
        return sorted(found, key=lambda m: m.created_at)

    def _image(self, name: str) -> Any:
        return next((i for i in self._baked() if i.name == name), None)

    def lookup(self, name: str) -> Manifest | None:
        image = self._image(name)
        return Manifest.from_properties(_props(image)) if image is not None else None

    def users(self, name: str) -> list[str]:
        image = self._image(name)
        if image is None:
            return []
        conn = self._c()
        with cloud_errors(conn, f"listing the servers of image {name}"):
            return [f"server {s.name}" for s in conn.compute.servers(details=True)
                    if (s.image or {}).get("id") == image.id]

    def remove(self, name: str) -> None:
        image = self._image(name)
        if image is None:
            raise UsageError(f"no baked image {name!r} in this project (`deployer image list --provider openstack`)")
        conn = self._c()
        with cloud_errors(conn, f"deleting image {name}"):
            conn.image.delete_image(image)

    def save(self, state: ClusterState, cluster: Cluster, name: str, manifest: Manifest) -> str:
        """Nova's createImage of the builder (stopped first, so its disk is quiet), its
        properties the manifest, waited for until Glance says active."""
        conn = self._c()
        server_id = cluster.master.id
        with cloud_errors(conn, f"snapshotting the builder into image {name}"):
            server = conn.compute.get_server(server_id)
            if server.status == "ACTIVE":
                conn.compute.stop_server(server)
                conn.compute.wait_for_server(server, status="SHUTOFF", wait=600)
            image = conn.compute.create_server_image(server, name, metadata=manifest.as_properties(), wait=False)
            try:
                image = conn.image.wait_for_status(conn.image.get_image(image.id), status="active",
                                                   failures=["killed", "deleted"], wait=ACTIVE_TIMEOUT_S)
            except BaseException:
                # Ctrl-C, a timeout, a snapshot that failed: a queued or half-uploaded image is
                # no bake, and would be listed and booted as one.
                delete_quietly(conn, image.id)
                raise
            missing = {k: v for k, v in manifest.as_properties().items() if _props(image).get(k) != v}
            if missing:  # a cloud that keeps createImage's metadata elsewhere: set them on the image itself
                conn.image.update_image(image, **missing)
        return f"Glance image {name} ({image.id})"

    def flavor_gpus(self, spec: ClusterSpec, checked: object) -> tuple[int, str]:
        from .preflight import PreflightResult

        if isinstance(checked, PreflightResult):
            # What the flavor's extra specs ask for, not gpus_per_node: the preflight assumes 1
            # GPU per node on an enable_gpu spec whose flavor asks for none, and a bake's fit
            # must not be an assumption.
            return checked.flavor_gpus, checked.flavor
        return 0, spec.openstack.flavor

    def base(self, spec: ClusterSpec) -> str:
        return spec.openstack.image


def delete_quietly(conn: Any, image_id: str) -> None:
    """Delete an image on the way out of a failed save; a failure here must not hide the first."""
    import contextlib

    with contextlib.suppress(Exception):
        conn.image.delete_image(image_id, ignore_missing=True)
