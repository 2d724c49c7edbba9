"""The LXC node driver: what Terraform's local-exec provisioners call.

    python -m deployer.providers.local.lxc network-up  --cluster C --bridge B --subnet S --gateway G/P [--only-master IP]
    python -m deployer.providers.local.lxc network-down --cluster C --bridge B
    python -m deployer.providers.local.lxc node-up --name N --ip IP/P --gateway G --bridge B \
        --shared HOST:GUEST --memory-mb M --user-data FILE [--instance-id ID] [--cluster-id CID]
    python -m deployer.providers.local.lxc node-down --name N [--cluster-id CID]
    python -m deployer.providers.local.lxc base-image

Each node is a Debian system container (its own systemd, sshd, hostname, static IP)
on an overlay of a base image built once with debootstrap (made in a moment, whatever N). It boots as a cloud VM does:
the image has Debian's cloud-init, and the node's user-data (deployer/pipeline/boot.py, the
same text OpenStack hands to Nova) goes in as a NoCloud seed, so cloud-init creates
the user, installs its key and the node's pinned host key. The driver itself writes
only what a cloud image would already have: the host's package sources.

Every command is idempotent: Terraform may re-run a create after an interruption, and
`down` may run twice. Kept free of third-party imports so Terraform can call it
cheaply, many at a time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import host
from .host import DriverError
from .image import ensure_base_image
from .network import network_down, network_up
from .node import node_down, node_up


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployer.providers.local.lxc", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    nu = sub.add_parser("network-up")
    nd = sub.add_parser("network-down")
    for sp in (nu, nd):
        sp.add_argument("--cluster", required=True)
        sp.add_argument("--bridge", required=True)
    nu.add_argument("--subnet", required=True)
    nu.add_argument("--gateway", required=True)
    nu.add_argument("--only-master", help="drop host -> node traffic except to this address (access: via_master)")
    up = sub.add_parser("node-up")
    for flag in ("--name", "--ip", "--gateway", "--bridge", "--shared"):
        up.add_argument(flag, required=True)
    up.add_argument("--memory-mb", type=int, required=True)
    up.add_argument("--user-data", type=Path, required=True)
    up.add_argument("--instance-id", help="the node's identity (Terraform's id of it), seeded as cloud-init's instance-id")
    down = sub.add_parser("node-down")
    down.add_argument("--name", required=True)
    for sp in (up, down):
        sp.add_argument("--cluster-id", help="the cluster's id (state.py): recorded on create; another's container is refused")
    sub.add_parser("base-image")
    a = p.parse_args(argv)
    host.VERBOSE = True
    try:
        _dispatch(a)
    except DriverError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def _dispatch(a: argparse.Namespace) -> None:
    if a.cmd == "network-up":
        network_up(a.cluster, a.bridge, a.subnet, a.gateway, a.only_master)
    elif a.cmd == "network-down":
        network_down(a.cluster, a.bridge)
    elif a.cmd == "node-up":
        node_up(a.name, a.ip, a.gateway, a.bridge, a.shared, a.memory_mb, a.user_data, a.instance_id, a.cluster_id)
    elif a.cmd == "node-down":
        node_down(a.name, a.cluster_id)
    elif a.cmd == "base-image":
        print(ensure_base_image())


if __name__ == "__main__":
    sys.exit(main())
