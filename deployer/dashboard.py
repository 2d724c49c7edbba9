"""`deployer dashboard`: SSH tunnels to the monitoring services on the master, and their URLs.

Nothing on the master listens beyond the cluster network except Grafana when
monitoring.expose is on (HTTPS with the deployer's self-signed certificate; Prometheus
and the Pushgateway never), so the way in is an SSH local forward through the master
(deployer.tunnel), bound to 127.0.0.1 on this machine. describe() is what `deployer
dashboard` and `deployer dashboard --print` show: URLs, where the logins' passwords are
(never the passwords themselves), and the certificate's fingerprint.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import ports
from .credentials import PUSHGATEWAY_PASSWORD, PUSHGATEWAY_USER, grafana_fingerprint
from .tunnel import open_tunnels, tunnel_command

if TYPE_CHECKING:
    from .cluster import Cluster

GRAFANA_PASSWORD_FILE = "grafana_admin_password"  # in the state dir's secrets dir; the grafana role writes it
GRAFANA_ADMIN_USER = "admin"


@dataclass(frozen=True)
class Service:
    name: str
    title: str
    port: int
    path: str = "/"


GRAFANA = Service("grafana", "Grafana", ports.grafana(), "/")
PROMETHEUS = Service("prometheus", "Prometheus", ports.prometheus(), "/")
PUSHGATEWAY = Service("pushgateway", "Pushgateway", ports.pushgateway(), "/")


def view(cluster: Cluster, grafana_wanted: bool, exposed: bool = False) -> dict[str, Any]:
    """What the cluster output says about its monitoring: whether Grafana runs (the
    spec asks for it and the nodes can install it: `grafana_installable`), whether
    this machine sits on the cluster network (the master's public address is its
    private one), so the services answer without a tunnel, and the master's public
    address when monitoring.expose opened the services on it."""
    master = cluster.master
    direct = master.public_ip == master.private_ip
    return {
        "grafana": bool(grafana_wanted and cluster.grafana_installable),
        "wanted": grafana_wanted,
        "direct": direct,
        "public_host": master.public_ip if (exposed and master.public_ip and not direct) else None,
    }


def services(*, grafana: bool) -> list[Service]:
    """The monitoring services that run on the master for this cluster."""
    return ([GRAFANA] if grafana else []) + [PROMETHEUS, PUSHGATEWAY]


# ----------------------------------------------------------------------------- access


@contextmanager
def open_dashboard(
    ssh_base_cmd: Sequence[str], master_ip: str, *, grafana: bool, timeout: float = 20.0
) -> Iterator[dict[str, int]]:
    """Tunnels to every monitoring service on the master; yields {service name: local port}."""
    targets = {s.name: (master_ip, s.port) for s in services(grafana=grafana)}
    with open_tunnels(ssh_base_cmd, targets, timeout=timeout) as ports:
        yield ports


def describe(
    master_ip: str,
    *,
    grafana: bool,
    secrets_dir: Path,
    wanted: bool | None = None,
    direct: bool = False,
    local_ports: Mapping[str, int] | None = None,
    public_host: str | None = None,
    ssh_base_cmd: Sequence[str] | None = None,
) -> dict[str, Any]:
    """What `deployer dashboard` shows, as a JSON-ready dict.

    URLs, in order of preference: through open tunnels (`local_ports`, from
    open_dashboard); the master's private IP when this machine is on the cluster
    network (`direct`: locally, the bridge is on this host); the master's public
    address when monitoring.expose is on (`public_host`). Otherwise a service's url is
    None and `ssh_command` (given `ssh_base_cmd`) is a command to open the tunnels by
    hand, on the same port numbers locally. `grafana`: Grafana runs; `wanted`: the spec
    asked for it (default: the same), so a note can say why it does not run.
    """
    wanted = grafana if wanted is None else wanted
    # Grafana serves HTTPS only when exposed: the deployer made it a certificate then.
    fingerprint = grafana_fingerprint(Path(secrets_dir)) if grafana else None
    entries = []
    for s in services(grafana=grafana):
        scheme = "https" if (s is GRAFANA and fingerprint) else "http"
        public = public_host if s is GRAFANA else None  # Prometheus and the Pushgateway are never exposed
        if local_ports and s.name in local_ports:
            url, via = f"{scheme}://127.0.0.1:{local_ports[s.name]}{s.path}", "ssh tunnel"
        elif direct:
            url, via = f"{scheme}://{master_ip}:{s.port}{s.path}", "cluster network"
        elif public:
            url, via = f"{scheme}://{public}:{s.port}{s.path}", "public address (security group)"
        else:
            url, via = None, None
        public_url = f"{scheme}://{public}:{s.port}{s.path}" if public else None
        entries.append({"name": s.name, "title": s.title, "url": url, "via": via, "remote": f"{master_ip}:{s.port}",
                        "public_url": public_url})

    notes: list[str] = []
    login = None
    if grafana:
        login = {"user": GRAFANA_ADMIN_USER, "password_file": str(Path(secrets_dir) / GRAFANA_PASSWORD_FILE)}
    elif wanted:
        notes.append(
            "Grafana runs on OpenStack only (no package source for local nodes); "
            "Prometheus has the same data: its Graph page takes the dashboards' queries."
        )
    else:
        notes.append("Grafana is off (monitoring.grafana: false).")

    if fingerprint:
        notes.append(f"Grafana's certificate is self-signed: SHA-256 {fingerprint}; log in only if your browser shows this.")
    push_file = Path(secrets_dir) / PUSHGATEWAY_PASSWORD
    push_login = {"user": PUSHGATEWAY_USER, "password_file": str(push_file)} if push_file.exists() else None

    ssh_command = None
    if ssh_base_cmd and any(e["url"] is None for e in entries):
        forwards = [(s.port, master_ip, s.port) for s in services(grafana=grafana)]
        ssh_command = shlex.join(tunnel_command(ssh_base_cmd, forwards))
    return {"services": entries, "grafana_login": login, "pushgateway_login": push_login, "grafana_tls_sha256": fingerprint,
            "ssh_command": ssh_command, "notes": notes}


def render(desc: Mapping[str, Any]) -> list[str]:
    """describe()'s result as lines for the console."""
    lines = []
    for e in desc["services"]:
        where = e["url"] or f"(tunnel needed to {e['remote']})"
        if e.get("public_url") and e["public_url"] != e["url"]:
            where += f"  (exposed: {e['public_url']})"
        lines.append(f"{e['title']:<12} {where}")
    login = desc.get("grafana_login")
    if login:
        lines.append(f"Grafana login: {login['user']} / password in {login['password_file']}")
    push = desc.get("pushgateway_login")
    if push:
        lines.append(f"Pushgateway login: {push['user']} / password in {push['password_file']}")
    if desc.get("ssh_command"):
        lines.append(f"Tunnel by hand: {desc['ssh_command']}")
    lines.extend(desc.get("notes", []))
    return lines
