"""up / down / status: the pipeline, provider-blind after preflight.

spec -> provider.preflight -> user-data + host keys -> terraform (cluster output)
     -> known_hosts + ssh_config + inventory -> wait for boot -> ansible -> smoke check
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import boot, inventory, terraform, ui
from .errors import OperationFailed, UsageError
from .providers import get_provider
from .readiness import wait_for_boot
from .remote import MasterRunner
from .spec import ClusterSpec
from .state import ClusterState


def _check_same_cluster(spec: ClusterSpec, state: ClusterState) -> None:
    old = state.read_record(state.spec_file)
    if old and old["spec"]["provider"] != spec.provider:
        raise UsageError(
            f"cluster {spec.name!r} already exists on provider {old['spec']['provider']}: "
            f"run `deployer down --name {spec.name}` first, or pick another --name"
        )


def _terraform(spec: ClusterSpec, state: ClusterState, run_dir, env: dict[str, str]) -> terraform.Engine:
    workdir = terraform.stage_module(spec.provider, state.terraform_dir)
    return terraform.engine(workdir, run_dir / "terraform.jsonl", spec.terraform.binary, env=env)


def _fingerprint(inv_path, spec: ClusterSpec) -> str:
    """What Ansible's result depends on: the inventory, the spec and every role/benchmark file."""
    import hashlib

    from .paths import assets_root

    h = hashlib.sha256(inv_path.read_bytes())
    h.update(spec.model_dump_json().encode())
    root = assets_root()
    for part in ("ansible", "benchmarks", "monitoring"):
        for f in sorted((root / part).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()


def confirm_destructive(spec: ClusterSpec, state: ClusterState, yes: bool) -> None:
    """Scaling in destroys nodes (and what is on them): ask, or require --yes."""
    cluster = state.cluster()
    if not cluster or spec.nodes >= len(cluster["nodes"]) or yes:
        return
    doomed = [n["name"] for n in cluster["nodes"][spec.nodes:]]
    if not ui.err.is_terminal or not sys.stdin.isatty():
        raise UsageError(f"--nodes {spec.nodes} would destroy {', '.join(doomed)}: pass --yes to scale in")
    import typer

    if not typer.confirm(f"Scale in to {spec.nodes} node(s), destroying {', '.join(doomed)}?"):
        raise UsageError("scale-in cancelled; nothing changed")


def _replace_addresses(spec: ClusterSpec, state: ClusterState, replace: list[str]) -> list[str]:
    """--replace NODE (full or short name) -> the Terraform address of that node's machine."""
    if not replace:
        return []
    cluster = state.cluster()
    if cluster is None:
        raise UsageError(f"--replace: cluster {spec.name!r} has no nodes yet; run `deployer up` without it")
    provider = get_provider(spec.provider)
    return [provider.node_resource(inventory.find_node(cluster, name)["name"]) for name in replace]


def up(spec: ClusterSpec, state: ClusterState, reconfigure: bool = False, replace: list[str] | None = None) -> dict[str, Any]:
    provider = get_provider(spec.provider)
    _check_same_cluster(spec, state)
    replace_addrs = _replace_addresses(spec, state, replace or [])
    provider.preflight(spec, state)  # raises before anything exists
    tf_env = provider.terraform_env(spec)  # the credentials Terraform will see: refuses what it cannot read
    t0 = time.monotonic()
    with state.lock("up"):
        state.create()
        state.write_record(state.spec_file, {"spec": spec.model_dump(mode="json")})
        run_dir = state.new_run_dir("up")
        where = " (LXC containers on this machine; --provider openstack for a cloud)" if spec.provider == "local" else ""
        ui.info(f"cluster [bold]{spec.name}[/]: {spec.nodes} node(s) on provider [bold]{spec.provider}[/]{where}; logs in {run_dir}")
        boot.write_user_data(spec, state)  # each node's first boot, read by Terraform
        restarted = provider.prepare(spec, state)

        eng = _terraform(spec, state, run_dir, tf_env)
        eng.write_vars(provider.tfvars(spec, state))
        ui.step("terraform: provisioning nodes")
        eng.init()
        changes = {"add": 0, "change": 0, "remove": 0}

        def on_event(ev: dict[str, Any]) -> None:
            if ev.get("type") == "change_summary":
                changes.update(ev.get("changes", {}))
            line = terraform.describe(ev)
            if line and ev.get("type") != "provision_progress":
                ui.info(f"  {line}")

        eng.apply(on_event, replace=replace_addrs)
        cluster = eng.output()["cluster"]
        state.write_record(state.cluster_file, cluster)
        boot.prune(state, cluster)
        boot.write_access(state, cluster)  # pinned known_hosts + ssh_config, before any SSH
        tf_changed = changes.get("add", 0) + changes.get("change", 0) + changes.get("remove", 0)
        ui.ok(f"terraform: {changes.get('add', 0)} added, {changes.get('change', 0)} changed, {changes.get('remove', 0)} destroyed")

        inv = inventory.write(cluster, spec, state)
        fingerprint = _fingerprint(inv, spec)
        last = state.read_record(state.dir / "configured.json") or {}
        ansible_changed = 0
        configure = tf_changed > 0 or last.get("fingerprint") != fingerprint or reconfigure
        if configure or restarted:
            # Nothing runs on a node before it answers with its pinned key and cloud-init is done.
            ui.step(f"boot: waiting for SSH with each node's pinned host key and for cloud-init (up to {provider.boot_timeout_s}s)")
            ready = wait_for_boot(state, cluster, timeout_s=provider.boot_timeout_s, hint=provider.boot_log_hint)
            ui.ok(f"boot: {len(ready)} node(s) ready (slowest {max(ready.values()):.1f}s)")
        if not configure:
            # Same nodes, same inventory, same roles as the last successful run: Ansible
            # would find nothing to do. The smoke check below still proves the cluster works.
            ui.ok("ansible: configuration unchanged since the last successful run; skipped (--reconfigure runs it anyway)")
        else:
            ui.step("ansible: configuring nodes (common, ssh_mesh, shared storage, mpi, training runtime, monitoring)")
            from .ansible import run_playbook

            (state.dir / "configured.json").unlink(missing_ok=True)
            play = run_playbook(inv, run_dir)
            ansible_changed = play.total_changed
            state.write_record(state.dir / "configured.json", {"fingerprint": fingerprint, "run": run_dir.name})
            ui.ok(f"ansible: {sum(play.ok.values())} ok, {play.total_changed} changed on {len(cluster['nodes'])} node(s)")

        hosts = smoke_check(state, cluster)
        ui.ok(f"smoke check: mpirun reached {', '.join(hosts)}")
        converged = tf_changed == 0 and ansible_changed == 0
        ui.ok(("no changes: the cluster already matched the spec" if converged else "cluster is up")
              + f" ({time.monotonic() - t0:.0f}s). Next: `deployer ssh`, `deployer bench`, `deployer status`")
        return {"name": spec.name, "converged": converged, "seconds": round(time.monotonic() - t0, 1), "run_dir": str(run_dir)}


def smoke_check(state: ClusterState, cluster: dict[str, Any]) -> list[str]:
    """`mpirun -np N --hostfile /shared/hostfile hostname` on the master, as a user would type it."""
    n = len(cluster["nodes"])
    cmd = f"mpirun -np {n} --hostfile {cluster['shared_dir']}/hostfile hostname"
    rc, out, err = MasterRunner(state, cluster).run(cmd, timeout=120)
    got = sorted(set(out.split()))
    want = sorted(node["name"] for node in cluster["nodes"])
    if rc != 0 or got != want:
        missing = sorted(set(want) - set(got))
        detail = f"missing {', '.join(missing)}" if missing else (err.strip().splitlines() or [f"rc {rc}"])[-1]
        raise OperationFailed(f"smoke check `{cmd}` failed on the master: {detail}")
    return got


def down(state: ClusterState) -> bool:
    """Destroy everything of the cluster; keep runs/ (logs) and bench/ (results). False if nothing existed."""
    old = state.read_record(state.spec_file)
    if old is None and not terraform.has_resources(state.terraform_dir / "local"):
        return False
    spec = ClusterSpec.model_validate(old["spec"]) if old else None
    with state.lock("down"):
        run_dir = state.new_run_dir("down")
        if spec and terraform.has_resources(state.terraform_dir / spec.provider):
            eng = _terraform(spec, state, run_dir, get_provider(spec.provider).terraform_env(spec))
            ui.step(f"terraform: destroying cluster {state.name}")

            def on_event(ev: dict[str, Any]) -> None:
                line = terraform.describe(ev)
                if line and ev.get("type") != "provision_progress":
                    ui.info(f"  {line}")

            eng.destroy(on_event)
        if spec:
            left = get_provider(spec.provider).leftovers(spec, state)
            if left:
                raise OperationFailed(f"down left {', '.join(left)} behind; remove by hand and run down again", log=run_dir / "terraform.jsonl")
        for item in state.dir.iterdir():
            if item.name in ("runs", "bench", "lock"):
                continue
            shutil.rmtree(item) if item.is_dir() else item.unlink()
        ui.ok(f"cluster {state.name} is gone; logs stay in {state.dir / 'runs'}")
        return True


def _reachable(cluster: dict[str, Any], state: ClusterState) -> dict[str, bool]:
    def tcp(host: str) -> bool:
        try:
            with socket.create_connection((host, 22), timeout=1.5) as s:
                s.settimeout(1.5)
                return s.recv(4).startswith(b"SSH")
        except OSError:
            return False

    nodes = cluster["nodes"]
    if cluster.get("access") == "via_master":
        if not tcp(inventory.node_address(cluster, nodes[0])):
            return {n["name"]: False for n in nodes}
        probe = " ; ".join(f"(exec 3<>/dev/tcp/{n['private_ip']}/22) 2>/dev/null && echo {n['name']}" for n in nodes[1:])
        rc, out, _ = MasterRunner(state, cluster).run(probe or "true", timeout=20)
        up = set(out.split())
        return {n["name"]: (i == 0 or n["name"] in up) for i, n in enumerate(nodes)}
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda n: tcp(inventory.node_address(cluster, n)), nodes))
    return {n["name"]: r for n, r in zip(nodes, results, strict=True)}


def status(state: ClusterState) -> dict[str, Any] | None:
    cluster = state.cluster()
    if cluster is None:
        return None
    reach = _reachable(cluster, state)
    return {
        "name": cluster["name"],
        "provider": cluster["provider"],
        "nodes": [
            {k: n.get(k) for k in ("name", "role", "private_ip", "public_ip", "gpus")} | {"reachable": reach[n["name"]]}
            for n in cluster["nodes"]
        ],
    }


def ssh(state: ClusterState, node_name: str | None, command: list[str]) -> int:
    cluster = state.cluster()
    if cluster is None:
        raise UsageError(f"cluster {state.name!r} is not up: run `deployer up` first")
    from .remote import ssh_argv

    node = inventory.find_node(cluster, node_name)
    argv = ssh_argv(state, cluster, node, tty=not command and ui.err.is_terminal)
    # Like ssh itself: the words are joined by the remote shell; stdin, stdout and the
    # exit code pass straight through.
    return subprocess.call([*argv, "--", *command] if command else argv)
