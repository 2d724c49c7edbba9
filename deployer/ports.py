"""Each service's TCP port, read from the one place that sets it: the default of the role
that binds it (ansible/roles/<role>/defaults/main.yml). The deployer's own code (tunnels,
the Pushgateway push, the Prometheus query, the URLs it prints) takes them from here; the
prometheus role's scrape targets are held to the same values by tests/unit/test_ports.py.
"""

from __future__ import annotations

from functools import cache

import yaml

from .paths import ansible_dir


@cache
def _role_default(role: str, key: str) -> int:
    defaults = yaml.safe_load((ansible_dir() / "roles" / role / "defaults" / "main.yml").read_text())
    value = defaults[key]
    if not isinstance(value, int):
        raise TypeError(f"ansible/roles/{role}/defaults/main.yml: {key} is {value!r}, not a port number")
    return value


def grafana() -> int:
    return _role_default("grafana", "grafana_port")


def prometheus() -> int:
    return _role_default("prometheus", "prometheus_port")


def pushgateway() -> int:
    return _role_default("pushgateway", "pushgateway_port")


def jupyterlab() -> int:
    return _role_default("jupyterlab", "jupyterlab_port")


def node_exporter() -> int:
    return _role_default("node_exporter", "node_exporter_port")


def dcgm_exporter() -> int:
    return _role_default("dcgm_exporter", "dcgm_exporter_port")
