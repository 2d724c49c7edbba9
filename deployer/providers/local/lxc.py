"""The LXC node driver: what Terraform's local-exec provisioners call.

    DEPLOYER_LXC_ARGS='{"cluster": ..., "bridge": ...}' python -m deployer.providers.local.lxc network-up|network-down
    DEPLOYER_LXC_ARGS='{"name": ..., "ip": ...}' python -m deployer.providers.local.lxc node-up|node-down
    python -m deployer.providers.local.lxc base-image

The arguments are one JSON object, the fields of network.NetworkUp or node.NodeUp: what
Terraform keeps in each resource's `input` (terraform/local/main.tf passes it whole), and
what LocalProvider.repair builds in-process. One list of arguments, no flags to keep in
step with a command line.

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
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, TypeVar

from . import host
from .host import DriverError
from .image import ensure_base_image
from .network import NetworkUp, network_down, network_up
from .node import NodeUp, node_down, node_up

T = TypeVar("T")


ARGS_ENV = "DEPLOYER_LXC_ARGS"
COMMANDS = ("network-up", "network-down", "node-up", "node-down", "base-image")


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    p = argparse.ArgumentParser(prog="python -m deployer.providers.local.lxc", description=(__doc__ or "").splitlines()[0])
    p.add_argument("cmd", choices=COMMANDS)
    a = p.parse_args(argv)
    host.VERBOSE = True
    try:
        _dispatch(a.cmd, environ)
    except DriverError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def _args(cls: type[T], environ: Mapping[str, str]) -> T:
    """The command's arguments from $DEPLOYER_LXC_ARGS, as the dataclass `cls`."""
    try:
        return cls(**json.loads(environ[ARGS_ENV]))
    except (KeyError, ValueError, TypeError) as e:
        raise DriverError(f"[lxc] ${ARGS_ENV} must hold the {cls.__name__} fields as one JSON object: {e}") from None


def _down_args(environ: Mapping[str, str], *keys: str) -> dict[str, Any]:
    """What a destroy needs of the resource's arguments (Terraform hands it all of them)."""
    try:
        given = json.loads(environ[ARGS_ENV])
        return {k: given[k] if k != "cluster_id" else given.get(k) for k in keys}
    except (KeyError, ValueError, TypeError) as e:
        raise DriverError(f"[lxc] ${ARGS_ENV} must hold {', '.join(keys)} as one JSON object: {e}") from None


def _dispatch(cmd: str, environ: Mapping[str, str]) -> None:
    if cmd == "network-up":
        network_up(_args(NetworkUp, environ))
    elif cmd == "network-down":
        network_down(**_down_args(environ, "cluster", "bridge"))
    elif cmd == "node-up":
        node_up(_args(NodeUp, environ))
    elif cmd == "node-down":
        node_down(**_down_args(environ, "name", "cluster_id"))
    elif cmd == "base-image":
        print(ensure_base_image())


if __name__ == "__main__":
    sys.exit(main())
