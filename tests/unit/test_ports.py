"""Each service port is set once, by the role that binds it (deployer/ports.py reads it there);
every other place that names it is held to that value here."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from deployer import credentials, dashboard, notebook, ports, pushgateway
from deployer.bench import storage_reads

ROLES = Path(__file__).resolve().parents[2] / "ansible" / "roles"
VARIABLES = ROLES.parents[1] / "terraform" / "openstack" / "variables.tf"


def _defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())


def test_the_deployer_reads_each_port_from_the_role_that_binds_it():
    assert ports.grafana() == _defaults("grafana")["grafana_port"] == dashboard.GRAFANA.port
    assert ports.prometheus() == _defaults("prometheus")["prometheus_port"] == dashboard.PROMETHEUS.port == storage_reads.PROMETHEUS_PORT
    assert ports.pushgateway() == _defaults("pushgateway")["pushgateway_port"] == dashboard.PUSHGATEWAY.port == pushgateway.PORT
    assert ports.jupyterlab() == _defaults("jupyterlab")["jupyterlab_port"] == notebook.REMOTE_PORT


def test_prometheus_scrapes_the_ports_the_exporters_bind():
    p = _defaults("prometheus")
    assert p["prometheus_node_exporter_port"] == ports.node_exporter()
    assert p["prometheus_pushgateway_port"] == ports.pushgateway()
    assert p["prometheus_dcgm_exporter_port"] == ports.dcgm_exporter()
    assert p["prometheus_jupyterlab_port"] == ports.jupyterlab()


def test_the_module_opens_grafana_alone_and_refuses_every_other_service_port():
    text = VARIABLES.read_text()
    block = text[text.index('variable "monitoring_ports"'):]
    block = block[: block.index("\n}\n")]
    assert re.search(r"default\s*=\s*\[(\d+)\]", block).group(1) == str(ports.grafana())
    refused = {int(n) for n in re.search(r"contains\(\[([\d, ]+)\], p\)", block).group(1).split(",")}
    assert refused == {ports.prometheus(), ports.pushgateway(), ports.node_exporter(), ports.dcgm_exporter()}


def test_the_printed_grafana_address_uses_the_port(tmp_path):
    from deployer.spec import MonitoringSpec
    from tests.clusters import typed

    cluster = typed({"name": "c", "grafana_installable": True,
                     "nodes": [{"name": "c-master", "private_ip": "10.0.0.10", "public_ip": "203.0.113.9"}]})
    monitoring = MonitoringSpec(enabled=True, expose=True, grafana=True, allowed_cidrs=["198.51.100.0/24"])
    said = credentials.prepare(tmp_path, monitoring, cluster)
    assert f"https://203.0.113.9:{ports.grafana()} " in said
