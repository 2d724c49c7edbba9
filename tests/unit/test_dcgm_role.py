"""The dcgm_exporter role on bare metal, pass-through and NVIDIA vGPU guests, without a GPU.

DCGM cannot profile in a vGPU guest, and the guest has no temperature or power
readings. These check what follows from the nvidia_driver role's fact
nvidia_driver_virtualization: the counters CSV the role writes (rendered here with
Jinja2, as Ansible's template module would), the readiness check, the unit's flags,
and that the GPU dashboard asks only for fields the exporter is told to collect and
says "not reported on vGPU" where a vGPU leaves a panel empty.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule

from tests import dashboard_checks as dashboard
from tests.unit.test_monitoring_ansible import ANSIBLE_PLAYBOOK, inventory, run_playbook

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "ansible" / "roles" / "dcgm_exporter"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
GPU_DASHBOARD = json.loads((REPO / "monitoring" / "grafana" / "dashboards" / "gpu.json").read_text())
MODES = ["none", "pass-through", "vgpu"]
NO_VALUE = "not reported on vGPU"
# Collected everywhere, but a vGPU guest has no sensor behind them.
NO_SENSOR_ON_VGPU = {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE",
                     "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}
METRIC = re.compile(r"\bDCGM_FI_[A-Z0-9_]+")


def jinja() -> jinja2.Environment:
    # Ansible's template module: trim_blocks on, and its `bool` filter (Ansible's own
    # `default` works with Ansible's Undefined only; Jinja2's does the same job here).
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters["bool"] = FilterModule().filters()["bool"]
    return env


def role_vars(virtualization: str | None, **overrides) -> dict:
    """The role's defaults, templated the way Ansible would for a host with this fact."""
    facts = {} if virtualization is None else {"nvidia_driver_virtualization": virtualization}
    env = jinja()
    out = {**facts, "private_ip": "10.77.0.12", "ansible_facts": {"architecture": "x86_64"}}
    for name, value in DEFAULTS.items():  # in file order: a default may use an earlier one
        out[name] = env.from_string(value).render(out) if isinstance(value, str) else value
    out.update(overrides)
    return out


def render(template: str, virtualization: str | None, **overrides) -> str:
    return jinja().get_template(template).render(role_vars(virtualization, **overrides))


def counters(text: str) -> dict[str, str]:
    """{field: Prometheus type} as dcgm-exporter reads the CSV (strictly: 3 fields a record)."""
    rows = csv.reader(ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))
    out = {}
    for row in rows:
        assert len(row) == 3, f"dcgm-exporter refuses a record without exactly 3 fields: {row}"
        field, kind, help_text = (c.strip() for c in row)
        assert re.fullmatch(r"DCGM_FI_[A-Z0-9_]+", field), field
        assert kind in ("gauge", "counter", "label"), row
        assert help_text and '"' not in help_text, row
        assert field not in out, f"{field} listed twice"
        out[field] = kind
    return out


def dashboard_metrics() -> dict[str, set[str]]:
    """{panel title: DCGM fields its queries read}, the template variable included."""
    out = {q.panel: set() for q in dashboard.panel_queries(GPU_DASHBOARD)}
    for q in dashboard.panel_queries(GPU_DASHBOARD):
        out[q.panel] |= set(METRIC.findall(q.expr))
    for var in GPU_DASHBOARD["templating"]["list"]:
        out[f"${var['name']}"] = set(METRIC.findall(var["query"]))
    return out


# ------------------------------------------------------------------ counters CSV


def test_profiling_default_follows_the_virtualization_fact():
    assert role_vars(None)["dcgm_exporter_profiling"] == "True", "no fact: taken as bare metal"
    assert {m: role_vars(m)["dcgm_exporter_profiling"] for m in MODES} == {
        "none": "True", "pass-through": "True", "vgpu": "False"}


@pytest.mark.parametrize("mode", MODES + [None])
def test_profiling_fields_only_where_dcgm_can_profile(mode):
    fields = counters(render("dcgm-counters.csv.j2", mode))
    prof = {f for f in fields if f.startswith("DCGM_FI_PROF_")}
    if mode == "vgpu":
        assert not prof
    else:
        assert {"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"} <= prof


@pytest.mark.parametrize("mode", MODES)
def test_basic_device_fields_in_every_mode(mode):
    fields = counters(render("dcgm-counters.csv.j2", mode))
    for f in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE",
              "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_XID_ERRORS"):
        assert fields.get(f) == "gauge", f
    assert all(f.startswith("DCGM_FI_DEV_") or f == "DCGM_FI_DRIVER_VERSION" or f.startswith("DCGM_FI_PROF_")
               for f in fields)


@pytest.mark.parametrize(("mode", "override", "expected"), [
    ("vgpu", True, True), ("none", False, False), ("pass-through", "false", False)])
def test_profiling_can_be_overridden(mode, override, expected):
    fields = counters(render("dcgm-counters.csv.j2", mode, dcgm_exporter_profiling=override))
    assert any(f.startswith("DCGM_FI_PROF_") for f in fields) is expected


# ------------------------------------------------------------------ readiness and unit


def test_readiness_waits_on_a_field_every_mode_reports():
    tasks = yaml.safe_load((ROLE / "tasks" / "dcgm_exporter.yml").read_text())
    (check,) = [t for t in tasks if "ansible.builtin.uri" in t]
    assert check is tasks[-1]
    assert "'DCGM_FI_DEV_FB_USED' in dcgm_exporter_check.content" in check["until"]
    assert "GPU_TEMP" not in check["until"] and "POWER" not in check["until"]
    assert check["retries"] == "{{ (dcgm_exporter_start_timeout | int) // 10 }}" and check["delay"] == 10
    for mode in MODES:
        assert "DCGM_FI_DEV_FB_USED" in counters(render("dcgm-counters.csv.j2", mode))


def test_counters_csv_is_installed_before_the_unit_and_restarts_the_exporter():
    tasks = yaml.safe_load((ROLE / "tasks" / "dcgm_exporter.yml").read_text())
    templates = [t for t in tasks if "ansible.builtin.template" in t]
    srcs = [t["ansible.builtin.template"]["src"] for t in templates]
    assert srcs == ["dcgm-counters.csv.j2", "dcgm-exporter.service.j2"]
    csv_task = templates[0]
    assert csv_task["ansible.builtin.template"]["dest"] == "{{ dcgm_exporter_counters_file }}"
    assert csv_task["notify"] == "Restart dcgm-exporter"


def execstart(unit: str) -> str:
    (line,) = [ln for ln in unit.splitlines() if ln.startswith("ExecStart=")]
    return line


@pytest.mark.parametrize("mode", MODES)
def test_unit_mounts_the_counters_and_grants_sys_admin_only_for_profiling(mode):
    line = execstart(render("dcgm-exporter.service.j2", mode))
    path = DEFAULTS["dcgm_exporter_counters_file"]
    assert f"--volume {path}:{path}:ro" in line
    assert f"--env DCGM_EXPORTER_COLLECTORS={path}" in line
    assert ("--cap-add SYS_ADMIN" in line) is (mode != "vgpu")
    assert line.endswith(DEFAULTS["dcgm_exporter_image"]), "the image's entrypoint, with no arguments"


def test_unit_uses_a_csv_from_the_image_when_asked():
    line = execstart(render("dcgm-exporter.service.j2", "none",
                            dcgm_exporter_collectors="/etc/dcgm-exporter/dcp-metrics-included.csv"))
    assert "--env DCGM_EXPORTER_COLLECTORS=/etc/dcgm-exporter/dcp-metrics-included.csv" in line


# ------------------------------------------------------------------ the GPU dashboard


def test_dashboard_reads_only_fields_the_exporter_collects_on_bare_metal():
    collected = set(counters(render("dcgm-counters.csv.j2", "none")))
    used = dashboard_metrics()
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in set().union(*used.values())
    missing = {panel: sorted(fields - collected) for panel, fields in used.items() if fields - collected}
    assert not missing, f"panels ask for fields the counters CSV does not list: {missing}"


def test_panels_a_vgpu_leaves_empty_say_so():
    collected = set(counters(render("dcgm-counters.csv.j2", "vgpu")))
    panels = {p["title"]: p for p in dashboard.iter_panels(GPU_DASHBOARD)}
    for title, fields in dashboard_metrics().items():
        if title.startswith("$"):
            # The node list must fill on a vGPU, or every panel is empty.
            assert fields and fields <= collected - NO_SENSOR_ON_VGPU, title
            continue
        empty_on_vgpu = bool(fields - collected or fields & NO_SENSOR_ON_VGPU)
        no_value = panels[title]["fieldConfig"]["defaults"].get("noValue")
        assert (no_value == NO_VALUE) is empty_on_vgpu, f"{title}: noValue={no_value!r}"


# ------------------------------------------------------------------ through Ansible itself


@pytest.mark.slow
@pytest.mark.skipif(ANSIBLE_PLAYBOOK is None, reason="ansible-playbook not installed (pip install ansible-core)")
@pytest.mark.parametrize("mode", [None, "vgpu"], ids=["no-fact", "vgpu"])
def test_ansible_renders_the_role_for_the_fact(tmp_path, mode):
    """The template module and the role's argument spec, with the fact as the nvidia_driver
    role leaves it (a host variable); Ansible's own templating of the computed default."""
    inv = inventory(tmp_path, gpu_hosts=("demo-worker-2",))
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    templates = [{"ansible.builtin.template": {"src": str(ROLE / "templates" / name), "dest": str(tmp_path / name),
                                               "mode": "0644"}}
                 for name in ("dcgm-counters.csv.j2", "dcgm-exporter.service.j2")]
    play = [{"hosts": "demo-worker-2", "gather_facts": False,
             "vars_files": [str(ROLE / "defaults" / "main.yml")],
             "tasks": [{"ansible.builtin.validate_argument_spec": {"argument_spec": spec}}, *templates]}]
    ev = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
          "dcgm_exporter_apt_arch": "amd64"}
    if mode is not None:
        ev["nvidia_driver_virtualization"] = mode
    r = run_playbook(play, inv, tmp_path, "-e", json.dumps(ev))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    fields = counters((tmp_path / "dcgm-counters.csv.j2").read_text())
    line = execstart((tmp_path / "dcgm-exporter.service.j2").read_text())
    profiling = mode != "vgpu"
    assert any(f.startswith("DCGM_FI_PROF_") for f in fields) is profiling
    assert ("--cap-add SYS_ADMIN" in line) is profiling
    assert "DCGM_FI_DEV_FB_USED" in fields
