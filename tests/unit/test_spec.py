"""Spec validation: every bad input is one UsageError line (exit 2) naming the fix."""

import ipaddress

import pytest

from deployer.errors import UsageError
from deployer.spec import ClusterSpec, build_spec


def test_defaults_are_local_with_a_non_root_user(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = build_spec(nodes="3")
    assert spec.provider == "local"
    assert spec.nodes == 3
    assert spec.ssh_user == "deployer"
    assert spec.shared_dir == "/shared"
    assert spec.monitoring.enabled


def test_openstack_defaults_to_ubuntu_user(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert build_spec(provider="openstack").ssh_user == "ubuntu"


@pytest.mark.parametrize(
    "nodes, fragment",
    [
        ("0", "at least 1"),
        ("-2", "at least 1"),
        ("two", "whole number"),
        ("2.5", "whole number"),
        ("", "whole number"),
        ("65", "at most 64"),
    ],
)
def test_bad_node_counts(nodes, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as e:
        build_spec(nodes=nodes)
    assert fragment in str(e.value)
    assert "--nodes" in str(e.value)
    assert e.value.exit_code == 2
    assert "\n" not in str(e.value)


def test_unknown_provider_names_the_choices(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="use one of: local, openstack"):
        build_spec(provider="aws")


def test_unknown_key_in_yaml(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes: 2\nnodez: 3\n")
    with pytest.raises(UsageError, match=r"c.yaml: nodez: unknown key"):
        build_spec(cfg)


def test_unknown_nested_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("local:\n  subnett: 10.0.0.0/24\n")
    with pytest.raises(UsageError, match=r"local.subnett: unknown key"):
        build_spec(cfg)


def test_malformed_yaml_names_the_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nodes: 2\nlocal: [unclosed\n")
    with pytest.raises(UsageError, match=r"line \d+: not valid YAML"):
        build_spec(cfg)


def test_yaml_that_is_not_a_mapping(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("- nodes\n")
    with pytest.raises(UsageError, match="expected a mapping"):
        build_spec(cfg)


def test_missing_config_file(tmp_path):
    with pytest.raises(UsageError, match="deployer init"):
        build_spec(tmp_path / "nope.yaml")


def test_flags_override_the_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: lab\nnodes: 2\n")
    spec = build_spec(cfg, nodes="5")
    assert (spec.name, spec.nodes) == ("lab", 5)


def test_monitoring_false_switch(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("monitoring: false\n")
    assert build_spec(cfg).monitoring.enabled is False


def test_expose_without_cidr_is_refused(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("monitoring:\n  expose: true\n")
    with pytest.raises(UsageError, match="allowed_cidrs"):
        build_spec(cfg)


def test_exposure_is_grafana_only(tmp_path):
    """expose opens Grafana (HTTPS, login) and nothing else (the OpenStack preflight refuses
    expose without Grafana: tests/unit/test_openstack_preflight.py)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("monitoring:\n  expose: true\n  allowed_cidrs: [0.0.0.0/0]\n")
    assert build_spec(cfg).exposed_to_world()
    cfg.write_text("monitoring:\n  expose: true\n  allowed_cidrs: [198.51.100.0/24]\n")
    assert not build_spec(cfg).exposed_to_world()


def test_admin_cidr_has_no_world_default(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("provider: openstack\n")
    assert build_spec(cfg).openstack.admin_cidr is None  # the preflight takes this machine's public address, or asks


@pytest.mark.parametrize("subnet, fragment", [("8.8.8.0/24", "private"), ("10.1.2.0/28", "/26"), ("10.1.2.300/24", "local.subnet")])
def test_bad_subnets(subnet, fragment, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"local:\n  subnet: {subnet}\n")
    with pytest.raises(UsageError, match=fragment):
        build_spec(cfg)


@pytest.mark.parametrize("name", ["Demo", "1lab", "a" * 21, "lab_1", ""])
def test_bad_names(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="lowercase"):
        build_spec(name=name)


def test_init_template_is_a_valid_spec(tmp_path):
    from deployer.spec import INIT_TEMPLATE

    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(INIT_TEMPLATE)
    spec = build_spec(cfg)
    assert spec.nodes == 3 and spec.local.subnet == ipaddress.IPv4Network("10.77.0.0/24")


def test_spec_round_trips_through_json():
    spec = ClusterSpec(nodes=4)
    again = ClusterSpec.model_validate(spec.model_dump(mode="json"))
    assert again == spec


def test_a_bare_rerun_starts_from_the_recorded_spec(tmp_path, monkeypatch):
    # `deployer up` again, without cluster.yaml or flags, keeps the cluster as it was made
    # (not the defaults: 2 nodes would mean a scale-in).
    from deployer import cli
    from deployer.spec import build_spec
    from deployer.state import ClusterState

    monkeypatch.chdir(tmp_path)
    made = build_spec(None, name="lab", nodes="5")
    st = ClusterState(tmp_path / ".deployer", "lab")
    st.write_spec(made)
    recorded = cli._recorded_spec(None, tmp_path / ".deployer", None)
    assert build_spec(None, recorded) == made
    assert build_spec(None, recorded, nodes="6").nodes == 6  # flags still win
    assert cli._recorded_spec("other", tmp_path / ".deployer", None) is None  # a new cluster: defaults
    (tmp_path / "cluster.yaml").write_text("name: lab\nnodes: 2\n")
    assert cli._recorded_spec(None, tmp_path / ".deployer", None) is None  # the file is the source then


# -- shared_dir: a directory of its own, never one the node's system needs (issue 44, item 7)
@pytest.mark.parametrize("shared_dir", [
    "/etc", "/shared/../etc", "/usr", "/usr/local", "/home", "/home/deployer", "/", "//", "/proc", "/var", "/var/lib",
    "/boot", "/root", "/bin", "/sbin", "/lib", "/lib64", "/dev", "/sys", "/run", "/tmp", "/opt", "/snap", "/./etc",
    "/shared/.", "//etc",
])
def test_a_system_path_as_shared_dir_is_one_line_naming_the_fix(shared_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cluster.yaml").write_text(f"shared_dir: {shared_dir}\n")
    with pytest.raises(UsageError) as e:
        build_spec(tmp_path / "cluster.yaml")
    msg = str(e.value)
    assert "\n" not in msg and e.value.exit_code == 2
    assert "shared_dir" in msg and "e.g. /shared" in msg, msg


@pytest.mark.parametrize("shared_dir", ["/shared", "/data", "/data/shared", "/srv/lab", "/mnt/nfs", "/scratch/x", "/home2"])
def test_a_directory_of_its_own_is_a_shared_dir(shared_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cluster.yaml").write_text(f"shared_dir: {shared_dir}\n")
    assert build_spec(tmp_path / "cluster.yaml").shared_dir == shared_dir


def test_up_with_a_system_shared_dir_exits_2_and_makes_nothing(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "cluster.yaml").write_text("shared_dir: /etc\n")
    # No lxc or terraform on PATH: should the spec pass, the preflight refuses before it makes
    # anything on this machine (the test runs as root).
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPLOYER_")} | {"PATH": str(tmp_path / "no-tools")}
    p = subprocess.run([sys.executable, "-m", "deployer", "up", "--config", "cluster.yaml", "--name", "zzspec"], cwd=tmp_path,
                       text=True, capture_output=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "shared_dir" in lines[0], p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cluster.yaml"]


def test_a_recorded_spec_with_a_system_shared_dir_still_reads(tmp_path):
    # A cluster made before the rule must stay reachable by `down` and `status`.
    from deployer.state import ClusterState

    st = ClusterState(tmp_path, "old")
    st.write_spec(ClusterSpec(name="old", shared_dir="/data"))
    st.spec_file.write_text(st.spec_file.read_text().replace('"/data"', '"/home"'))
    assert st.spec().shared_dir == "/home"
