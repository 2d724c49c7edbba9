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
        (["up", "--replace", "worker-1"], "--replace: cluster 'demo' has no nodes yet"),
        (["up", "--ttl", "0"], "--ttl: must be a duration like 30m, 8h, 2d or 1w"),
        (["up", "--ttl", "banana"], "--ttl: must be a duration"),
        (["up", "--ttl", "0h"], "--ttl: 0h is no lifetime"),
        (["up", "--ttl", "400d"], "--ttl: 400d is beyond the maximum of 14d"),
        (["gc", "--yes", "--cloud"], "requires an argument"),
        (["bench", "--nodes", "1,2"], "cluster 'demo' is not up"),
        (["check"], "cluster 'demo' is not up"),
        (["check", "--level", "deep"], "--level 'deep': use one of quick, standard, full"),
        (["up", "--replace-failed"], "--replace-failed: cluster 'demo' has no check yet: run `deployer check` first"),
        (["up", "--no-check", "--replace-failed"], "drop --no-check"),
        (["up", "--no-setup", "--replace-failed"], "drop --no-setup"),
        (["up", "--no-setup", "--reconfigure"], "--reconfigure runs Ansible, which --no-setup skips"),
        (["notebook"], "cluster 'demo' is not up"),
        # Checked on every verb, not only by `up`: these resolved outside the state root.
        (["down", "--yes", "--name", "../x"], "--name '../x' is not a cluster name"),
        (["down", "--yes", "--name", "a/b"], "--name 'a/b' is not a cluster name"),
        (["status", "--name", "Lab 1"], "lowercase letters"),
        (["ssh", "--name", "../../etc"], "is not a cluster name"),
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


@pytest.mark.parametrize("word", ["off", "no", "yes"])
def test_a_name_yaml_reads_as_a_boolean_says_to_quote_it(word, tmp_path):
    (tmp_path / "cluster.yaml").write_text(f"name: {word}\nnodes: 1\n")
    p = run("up", cwd=tmp_path)
    assert p.returncode == 2 and "quote it" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
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
    assert p.returncode == 0, p.stderr
    # Each verb as an entry of the Commands list (its name first on a line), not a word anywhere.
    listed = {line.split()[0] for line in p.stdout.split("Commands:", 1)[1].splitlines() if line.strip()}
    assert {"init", "up", "status", "check", "ssh", "ssh-config", "bench", "down", "gc"} <= listed


@pytest.mark.parametrize(
    "setup, fragment",
    [
        ("os_cloud", "OpenStack cloud 'nope' is not in any clouds.yaml (none found"),
        ("unreadable", "clouds.yaml (found in the working directory) cannot be read"),
    ],
)
def test_openstack_credentials_problems_are_one_line_exit_2(setup, fragment, tmp_path, monkeypatch):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OS_")}
    env |= {"HOME": str(tmp_path / "home"), "OS_CLOUD": "nope", "OS_CLIENT_CONFIG_FILE": str(tmp_path / "none.yaml")}
    work = tmp_path / "work"
    work.mkdir()
    if setup == "unreadable":
        (work / "clouds.yaml").mkdir()
        del env["OS_CLIENT_CONFIG_FILE"]
    p = subprocess.run([*DEPLOYER, "up", "--provider", "openstack", "--nodes", "2"], cwd=work, env=env,
                       text=True, capture_output=True, timeout=120)
    assert p.returncode == 2, p.stderr
    # A progress line ("==> Checking OpenStack project…") may come first; the error is one line.
    lines = [line for line in p.stderr.splitlines() if line.strip() and not line.startswith("==>")]
    assert len(lines) == 1 and fragment in lines[0], p.stderr
    assert sorted(x.name for x in work.iterdir()) == (["clouds.yaml"] if setup == "unreadable" else [])


def test_bad_local_access_names_the_choices(tmp_path):
    (tmp_path / "cluster.yaml").write_text("local:\n  access: via-master\n")
    p = run("up", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "local.access" in p.stderr and "'direct' or 'via_master'" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cluster.yaml"]


def test_unknown_scheduler_is_one_line_exit_2_naming_the_allowed_values(tmp_path):
    (tmp_path / "cluster.yaml").write_text("scheduler: pbs\n")
    p = run("up", cwd=tmp_path)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "scheduler: unknown scheduler 'pbs'; use one of: none, slurm" in lines[0]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["cluster.yaml"]


def test_results_shows_a_past_run_and_names_the_runs_there(tmp_path):
    """`deployer results`: the latest run's tables, or a named run's report with --json,
    read through the report's one reader (bench.schema.load); a missing run lists the runs."""
    import json
    import shutil
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "results_local_3node.json"
    bench = tmp_path / ".deployer" / "lab" / "bench"
    for run_id in ("20261120-100000", "20261123-103645"):
        (bench / run_id).mkdir(parents=True)
        shutil.copy(fixture, bench / run_id / "results.json")
    shown = run("results", "--name", "lab", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "20261123-103645/results.json" in shown.stderr and "img/s" in shown.stderr
    as_json = run("results", "20261120-100000", "--name", "lab", "--json", cwd=tmp_path)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["results"][2]["nodes"] == 3
    missing = run("results", "1999", "--name", "lab", cwd=tmp_path)
    assert missing.returncode == 2
    assert "no benchmark run '1999'" in missing.stderr and "20261120-100000, 20261123-103645" in missing.stderr
    none = run("results", "--name", "other", cwd=tmp_path)
    assert none.returncode == 2 and "run `deployer bench` first" in none.stderr


# ---- up --no-setup: provision and record, nothing on the nodes ------------------------------

NO_SETUP_CLUSTER = {
    "name": "lab", "provider": "openstack", "ssh_user": "ubuntu", "shared_dir": "/shared", "access": "via_master",
    "cluster_cidr": "192.168.77.0/24", "shared_storage": "nfs",
    "nodes": [
        {"name": "lab-master", "role": "master", "private_ip": "192.168.77.10", "public_ip": "203.0.113.5", "id": "m1"},
        {"name": "lab-worker-1", "role": "worker", "private_ip": "192.168.77.11", "public_ip": None, "id": "w1"},
    ],
}


def _fake_up_world(monkeypatch, tmp_path, *, changes):
    """lifecycle.up with every outside part replaced: a provider that makes nothing, an
    engine whose apply reports `changes` and outputs NO_SETUP_CLUSTER; the boot wait,
    Ansible and the check fail the test if they are reached."""
    from deployer import lifecycle
    from deployer.providers.base import Repair
    from deployer.tools import ansible, terraform

    class Provider:
        name = "openstack"
        description = "fake"
        boot_timeout_s = 1

        def preflight(self, spec, state, replacing=()):
            return None

        def terraform_env(self, spec):
            return {}

        def prepare(self, spec, state):
            pass

        def tfvars(self, spec, state, checked=None):
            return {}

        def node_resource(self, node):
            return f"node[{node!r}]"

        def observe(self, state, env, nodes):
            # Only where the nodes landed, after Terraform (pipeline/placement.py): one host.
            from deployer.providers.base import Machine, Observation

            return Observation(nodes={n: Machine("running", f"id-{n}", host="h1", host_id="h1", zone="nova") for n in nodes})

        def repair(self, spec, state, cluster, seen):
            return Repair()

        def place(self, spec, state, cluster):
            return None

        def inventory_vars(self, spec, state, cluster):
            return {}

    class Engine:
        applied: list[list[str]] = []

        def write_vars(self, tfvars):
            pass

        def init(self):
            pass

        def apply(self, on_event, replace=None):
            Engine.applied.append(replace or [])
            on_event({"type": "change_summary", "changes": changes})

        def output(self):
            return {"cluster": NO_SETUP_CLUSTER}

    def unreachable(*a, **k):
        raise AssertionError("--no-setup reached the nodes")

    monkeypatch.setattr(lifecycle, "get_provider", lambda name: Provider())
    monkeypatch.setattr(lifecycle, "_terraform", lambda *a: Engine())
    monkeypatch.setattr(terraform, "preflight", lambda *a: None)
    monkeypatch.setattr(lifecycle, "wait_for_boot", unreachable)
    monkeypatch.setattr(lifecycle, "_check", unreachable)
    monkeypatch.setattr(ansible, "run_playbook", unreachable)
    return Engine


def test_up_no_setup_provisions_and_records_but_touches_no_node(tmp_path, monkeypatch):
    """--no-setup: Terraform applies, the cluster output, known_hosts, ssh_config and the
    inventory are written; no boot wait, no Ansible, no check, and no configuration is
    recorded, so the next plain `up` configures every node."""
    from deployer import lifecycle
    from deployer.pipeline import drift
    from deployer.spec import ClusterSpec
    from deployer.state import ClusterState

    engine = _fake_up_world(monkeypatch, tmp_path, changes={"add": 9, "change": 0, "remove": 0})
    spec = ClusterSpec(name="lab", nodes=2, provider="openstack", openstack={
        "cloud": "x", "flavor": "f", "image": "i", "external_network": "public"})
    st = ClusterState(tmp_path, "lab")
    result = lifecycle.up(spec, st, setup=False)
    # The fake cloud has one host: spread (the default) makes the worker anew once, it lands
    # there again, and the moves stop (lifecycle.spread_out).
    assert engine.applied == [[], ["node['lab-worker-1']"]]
    assert result["replaced_for_placement"] == [{"node": "lab-worker-1", "from": "h1", "to": "h1"}]
    assert result["setup"] is False and result["converged"] is False and result["configured"] == {}
    assert st.cluster() is not None and st.cluster().names == ["lab-master", "lab-worker-1"]
    assert "lab-worker-1" in st.ssh_config.read_text() and "lab-master" in st.known_hosts.read_text()
    assert (st.inventory_dir / "hosts.yml").exists() and (st.inventory_dir / "hostfile").exists()
    assert st.configured() is None
    assert set(result["to_configure"]) == {"lab-master", "lab-worker-1"}
    assert drift.configure_plan(st.cluster(), st.configured(), "any").every_node


def test_up_no_setup_again_with_nothing_to_change_is_converged(tmp_path, monkeypatch):
    from deployer import lifecycle
    from deployer.spec import ClusterSpec
    from deployer.state import ClusterState

    _fake_up_world(monkeypatch, tmp_path, changes={"add": 0, "change": 0, "remove": 0})
    spec = ClusterSpec(name="lab", nodes=2, provider="openstack", openstack={
        "cloud": "x", "flavor": "f", "image": "i", "external_network": "public"})
    result = lifecycle.up(spec, ClusterState(tmp_path, "lab"), setup=False)
    assert result["converged"] is True


def test_up_no_setup_refuses_what_needs_the_nodes(tmp_path):
    from deployer import lifecycle
    from deployer.errors import UsageError
    from deployer.spec import ClusterSpec
    from deployer.state import ClusterState

    for kw in ({"reconfigure": True}, {"replace_failed": True}):
        with pytest.raises(UsageError, match="--no-setup"):
            lifecycle.up(ClusterSpec(name="lab", nodes=1), ClusterState(tmp_path, "lab"), setup=False, **kw)
    assert list(tmp_path.iterdir()) == []


def test_cli_up_no_setup_reaches_lifecycle_as_setup_false(tmp_path, monkeypatch):
    """The flag's plumbing: `up --no-setup` calls lifecycle.up with setup=False and no
    check; a plain `up` with setup=True and the quick check."""
    from typer.testing import CliRunner

    from deployer import cli, lifecycle

    calls = []
    monkeypatch.setattr(lifecycle, "up", lambda spec, state, **kw: calls.append(kw) or {"name": spec.name})
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(cli.app, ["up", "--no-setup", "--name", "lab"]).exit_code == 0
    assert runner.invoke(cli.app, ["up", "--name", "lab"]).exit_code == 0
    assert [(c["setup"], c["check_level"]) for c in calls] == [(False, None), (True, "quick")]


def test_up_help_names_no_setup(tmp_path):
    p = run("up", "--help", cwd=tmp_path)
    assert p.returncode == 0 and "--no-setup" in p.stdout and "no Ansible" in p.stdout
