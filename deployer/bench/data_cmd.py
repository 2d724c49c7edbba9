"""`deployer data`: datasets onto the cluster's shared storage, once per cluster, on the master.

- `fetch NAME`: a known dataset (deployer/bench/datasets.py's catalog). digits is written here
  from the scikit-learn package and copied like an import; cifar10 is downloaded on the
  master itself (resumable, checksummed: datasets.fetch_cmd), so the bytes cross the
  internet once, to the cluster, not to this machine first; imagenet is not freely
  downloadable, so it is imported.
- `import PATH`: a folder of the user's (one with a dataset.json, or an ImageFolder tree)
  copied through the cluster's pinned SSH path (tar over `ssh -F <state>/ssh_config`).
- `list`: the datasets on the cluster.

Every way in checks the free space on the shared storage first (exit 2 with both sizes,
nothing copied), copies into `<name>.partial` and renames it when whole, and writes the
manifest last, so a folder with a dataset.json on the cluster is always complete; a
stopped copy starts over, a stopped download resumes. A dataset already there is left
as it is (`--force` replaces it).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import ui
from ..errors import OperationFailed, UsageError
from ..remote import MasterRunner, ssh_argv
from . import datasets

if TYPE_CHECKING:
    from ..cluster import Cluster
    from ..state import ClusterState

PROGRESS_EVERY_S = 5.0


def _remote(runner: MasterRunner, cmd: str, what: str, timeout: float = 300) -> str:
    rc, out, err = runner.run(cmd, timeout=timeout)
    if rc != 0:
        raise OperationFailed(f"{what} failed on the master: {(err.strip().splitlines() or ['exit ' + str(rc)])[-1]}")
    return out


def on_cluster(runner: MasterRunner, cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The manifest of dataset `name` on the cluster, or None when it is not there (whole)."""
    path = f"{datasets.dataset_dir(cluster.shared_dir, name)}/{datasets.MANIFEST}"
    rc, out, _ = runner.run(f"cat {shlex.quote(path)} 2>/dev/null", timeout=60)
    if rc != 0 or not out.strip():
        return None
    try:
        manifest: dict[str, Any] = json.loads(out)
    except ValueError:
        return None  # damaged: fetched again
    return manifest


def listing(runner: MasterRunner, cluster: Cluster) -> list[dict[str, Any]]:
    root = shlex.quote(f"{cluster.shared_dir.rstrip('/')}/datasets")
    out = _remote(runner, f"for m in {root}/*/{datasets.MANIFEST}; do [ -f \"$m\" ] && tr -d '\\n' < \"$m\" && echo; done; true",
                  "listing the datasets")
    found = []
    for line in out.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        found.append({"name": m["name"], "format": m["format"], "shape": m["shape"], "classes": len(m["classes"]),
                      "train": m["splits"]["train"]["samples"], "test": m["splits"]["test"]["samples"],
                      "bytes": sum(f.get("bytes", 0) for f in m["files"].values()) or None,
                      "path": datasets.dataset_dir(cluster.shared_dir, m["name"])})
    return found


def _free_bytes(runner: MasterRunner, cluster: Cluster) -> int:
    root = f"{cluster.shared_dir.rstrip('/')}/datasets"
    return datasets.parse_free_space(_remote(runner, datasets.free_space_cmd(root), "measuring the free space"))


def folder_bytes(src: Path) -> int:
    return sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())


def push_folder(state: ClusterState, cluster: Cluster, runner: MasterRunner, src: Path, name: str,
                manifest: dict[str, Any], total: int) -> None:
    """src (less any dataset.json) -> <shared>/datasets/<name>.partial on the master, through
    the cluster's ssh_config; then renamed to <name> and the manifest written last."""
    dest = datasets.dataset_dir(cluster.shared_dir, name)
    partial = dest + ".partial"
    unpack = f"rm -rf {shlex.quote(partial)} && mkdir -p {shlex.quote(partial)} && tar -xf - -C {shlex.quote(partial)}"
    ssh = [*ssh_argv(state, cluster.master), unpack]
    tar = subprocess.Popen(["tar", "-cf", "-", "--exclude", f"./{datasets.MANIFEST}", "-C", str(src), "."],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sink = subprocess.Popen(ssh, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sent, started, said = 0, time.monotonic(), time.monotonic()
    errors: list[bytes] = []
    drain = threading.Thread(target=lambda: errors.append(sink.stderr.read() if sink.stderr else b""), daemon=True)
    drain.start()
    try:
        assert tar.stdout is not None and sink.stdin is not None
        while chunk := tar.stdout.read(1 << 20):
            sink.stdin.write(chunk)
            sent += len(chunk)
            if time.monotonic() - said >= PROGRESS_EVERY_S:
                said = time.monotonic()
                rate = sent / max(said - started, 1e-6)
                ui.info(f"  {time.strftime('%H:%M:%S')} {ui.human_bytes(sent)} of about {ui.human_bytes(total)}"
                        f" · {ui.human_bytes(int(rate))}/s")
        sink.stdin.close()
    except BrokenPipeError:
        pass  # the remote end failed: its own words come below
    finally:
        tar_rc, sink_rc = tar.wait(), sink.wait()
        drain.join(timeout=10)
    if tar_rc != 0:
        raise OperationFailed(f"tar could not read {src}: {tar.stderr.read().decode(errors='replace').strip() if tar.stderr else ''}")
    if sink_rc != 0:
        why = b"".join(errors).decode(errors="replace").strip().splitlines() or [f"exit {sink_rc}"]
        raise OperationFailed(f"copying {name} to the master failed: {why[-1]} (run the same command again to start over)")
    took = time.monotonic() - started
    ui.ok(f"copied {ui.human_bytes(sent)} in {took:.1f} s to {dest}")
    _remote(runner, f"rm -rf {shlex.quote(dest)} && mv {shlex.quote(partial)} {shlex.quote(dest)} && "
            + datasets.write_manifest_cmd(dest, manifest), "putting the dataset in place")


def _summary(m: dict[str, Any], dest: str, fresh: bool) -> dict[str, Any]:
    return {"name": m["name"], "path": dest, "fetched": fresh, "format": m["format"], "shape": m["shape"],
            "classes": len(m["classes"]), "train": m["splits"]["train"]["samples"], "test": m["splits"]["test"]["samples"]}


def fetch(state: ClusterState, cluster: Cluster, name: str, *, force: bool = False) -> dict[str, Any]:
    ds = datasets.resolve(name)  # an unknown name: exit 2 listing the known ones, before any connection
    if ds.archive is None and ds.name != "digits":
        raise UsageError(f"{ds.name} is not freely downloadable: get it under its licence as a folder "
                         f"(train/<class>/*.JPEG, val/<class>/*.JPEG), then `deployer data import PATH --as {ds.name}`")
    runner = MasterRunner(state, cluster)
    dest = datasets.dataset_dir(cluster.shared_dir, ds.name)
    have = on_cluster(runner, cluster, ds.name)
    if have is not None and not force:
        ui.ok(f"{ds.name} is already on the cluster: {dest} (--force fetches it again)")
        return _summary(have, dest, False)
    if ds.name == "digits":
        with tempfile.TemporaryDirectory(prefix="deployer-digits-") as tmp:
            ui.step(f"digits: writing scikit-learn's 1,797 handwritten digits ({ds.description})")
            m = datasets.write_digits(Path(tmp))
            total = folder_bytes(Path(tmp))
            datasets.check_space(total, _free_bytes(runner, cluster), f"{cluster.shared_dir} on the master", ds.name)
            push_folder(state, cluster, runner, Path(tmp), ds.name, m, total)
        return _summary(m, dest, True)
    # a download on the master: the archive goes straight to the cluster
    a = ds.archive
    assert a is not None  # only digits has none, and it returned above
    part = _remote(runner, f"stat -c %s {shlex.quote(dest + '/' + a.file)} 2>/dev/null || echo 0", "looking for a partial download")
    needed = datasets.space_needed(ds, partial=int(part.strip() or 0))
    datasets.check_space(needed, _free_bytes(runner, cluster), f"{cluster.shared_dir} on the master", ds.name)
    if force:
        _remote(runner, f"rm -rf {shlex.quote(dest)}", "removing the old copy")
    ui.step(f"{ds.name}: downloading {ui.human_bytes(a.bytes)} on the master from {a.url} (resumes if stopped)")
    started = time.monotonic()
    out = _remote(runner, datasets.fetch_cmd(ds, dest), f"downloading {ds.name}", timeout=6 * 3600)
    m = datasets.manifest(ds, datasets.parse_files(out))
    _remote(runner, datasets.write_manifest_cmd(dest, m), "writing the manifest")
    ui.ok(f"{ds.name} in {dest} ({time.monotonic() - started:.0f} s)")
    return _summary(m, dest, True)


def import_(state: ClusterState, cluster: Cluster, path: Path, name: str | None, *, force: bool = False) -> dict[str, Any]:
    """Copy a user's dataset folder to the cluster: a folder with a dataset.json (checked
    first), or an ImageFolder tree (train/<class>/..., val/<class>/...) given --as."""
    src = Path(path).expanduser()
    if not src.is_dir():
        raise UsageError(f"{path}: no such folder: give the folder that holds the dataset")
    if (src / datasets.MANIFEST).is_file():
        m = datasets.read_manifest(src)
        problems = datasets.verify(src)
        if problems:
            raise UsageError(f"{src}: the dataset does not match its manifest ({'; '.join(problems[:3])}): fix or fetch it again")
        if name and name != m["name"]:
            m = {**m, "name": name}
    else:
        if not name:
            raise UsageError(f"{src} has no {datasets.MANIFEST}: name the dataset with --as (an ImageFolder tree "
                             "train/<class>/*.JPEG and val/<class>/*.JPEG is read as it is)")
        base = datasets.CATALOG.get(name) or dataclasses.replace(
            datasets.CATALOG["imagenet"], name=name, description=f"{name}: an ImageFolder tree imported by the user", classes=())
        m = datasets.imagefolder_manifest(src, base)
    name = m["name"]
    datasets.check_name(name)
    runner = MasterRunner(state, cluster)
    dest = datasets.dataset_dir(cluster.shared_dir, name)
    have = on_cluster(runner, cluster, name)
    if have is not None and not force:
        ui.ok(f"{name} is already on the cluster: {dest} (--force replaces it)")
        return _summary(have, dest, False)
    total = folder_bytes(src)
    datasets.check_space(total, _free_bytes(runner, cluster), f"{cluster.shared_dir} on the master", name)
    ui.step(f"{name}: copying {ui.human_bytes(total)} from {src} to the master")
    push_folder(state, cluster, runner, src, name, m, total)
    return _summary(m, dest, True)
