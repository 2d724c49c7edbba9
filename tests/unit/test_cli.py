"""The CLI as a user meets it: exit codes, one-line errors, nothing created on bad input."""

import subprocess
import sys

import pytest

DEPLOYER = [sys.executable, "-m", "deployer"]


def run(*args, cwd, input=None):
    return subprocess.run([*DEPLOYER, *args], cwd=cwd, text=True, capture_output=True, input=input, timeout=60)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["up", "--nodes", "0"], "--nodes: must be at least 1"),
        (["up", "--nodes", "-1"], "--nodes: must be at least 1"),
        (["up", "--nodes", "eight"], "--nodes: must be a whole number"),
        (["up", "--provider", "aws"], "use one of: local, openstack"),
        (["up", "--name", "My Lab"], "lowercase"),
        (["up", "--config", "missing.yaml"], "deployer init"),
        (["up", "--nodez", "2"], "No such option"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(args, fragment, tmp_path):
    p = run(*args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert fragment in lines[0]
    assert "Traceback" not in p.stderr
    assert list(tmp_path.iterdir()) == []  # no state dir, nothing


def test_malformed_cluster_yaml(tmp_path):
    (tmp_path / "cluster.yaml").write_text("nodes: [\n")
    p = run("up", cwd=tmp_path)
    assert p.returncode == 2 and "not valid YAML" in p.stderr
    assert not (tmp_path / ".deployer").exists()


def test_init_writes_a_spec_then_refuses_to_overwrite(tmp_path):
    assert run("init", cwd=tmp_path).returncode == 0
    assert "nodes:" in (tmp_path / "cluster.yaml").read_text()
    p = run("init", cwd=tmp_path)
    assert p.returncode == 2 and "--force" in p.stderr


def test_down_of_a_missing_cluster_is_a_no_op(tmp_path):
    p = run("down", "--yes", "--name", "ghost", cwd=tmp_path)
    assert p.returncode == 0 and "does not exist" in p.stderr


def test_down_without_yes_and_no_tty_refuses(tmp_path):
    st = tmp_path / ".deployer" / "lab"
    st.mkdir(parents=True)
    (st / "spec.json").write_text('{"version": 1, "spec": {"name": "lab", "nodes": 1}}')
    p = run("down", "--name", "lab", cwd=tmp_path, input="")
    assert p.returncode == 2 and "--yes" in p.stderr
    assert (st / "spec.json").exists()


def test_status_json_of_a_missing_cluster(tmp_path):
    p = run("status", "--json", "--name", "ghost", cwd=tmp_path)
    assert p.returncode == 0
    assert '"nodes": []' in p.stdout


def test_help_lists_the_verbs(tmp_path):
    p = run("--help", cwd=tmp_path)
    for verb in ("init", "up", "status", "ssh", "down"):
        assert verb in p.stdout
