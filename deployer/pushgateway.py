"""The Pushgateway on the master: where `deployer bench` and `deployer check` leave their
results for Prometheus (each in its own job and group: bench/metrics.py, check/metrics.py).

A push replaces one group (job, grouping key) and nothing else. The Pushgateway takes only the
deployer's basic-auth login (deployer/credentials.py) and listens on the cluster's private
network, so from the user's machine a push goes through an SSH tunnel to the master.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.error import URLError

from prometheus_client import CollectorRegistry, push_to_gateway
from prometheus_client.exposition import basic_auth_handler, default_handler

from . import ports
from .credentials import Login, pushgateway_login
from .errors import OperationFailed
from .remote import ssh_argv
from .tunnel import open_tunnel

if TYPE_CHECKING:
    from .cluster import Cluster
    from .state import ClusterState

PORT = ports.pushgateway()


def url(host: str, port: int = PORT) -> str:
    """The Pushgateway's URL on a host (the master's private IP, or 127.0.0.1 through a tunnel)."""
    return f"http://{host}:{port}"


def push(gateway_url: str, job: str, registry: CollectorRegistry, grouping_key: dict[str, str], what: str, *,
         login: Login | None = None, timeout: float = 10.0) -> None:
    """Replace the Pushgateway group (job, grouping_key) with `registry`'s series; one line
    naming `what` when the Pushgateway cannot be reached or refuses it."""
    handler = default_handler
    if login is not None:
        def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                    data: bytes) -> Callable[[], None]:  # prometheus_client's handler signature
            return basic_auth_handler(url, method, timeout, headers, data, login.user, login.password)
    try:
        push_to_gateway(gateway_url, job=job, registry=registry, grouping_key=grouping_key, timeout=timeout, handler=handler)
    except (URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise OperationFailed(f"could not push {what} to the Pushgateway at {gateway_url}: {reason}") from None


def push_to_master(state: ClusterState, cluster: Cluster, send: Callable[[str, Login | None], None]) -> None:
    """`send(url, login)` (a push: bench/metrics.py's, check/metrics.py's) to the cluster's own
    Pushgateway, through an SSH tunnel to the master, with the cluster's login.
    OperationFailed (or OSError) when the tunnel or the push fails."""
    master = cluster.master
    with open_tunnel(ssh_argv(state, master), master.private_ip, PORT) as port:
        send(url("127.0.0.1", port), pushgateway_login(state.secrets_dir))
