"""The per-cluster state directory: every verb reads and writes only this.

.deployer/<cluster>/
  spec.json          the resolved spec (versioned record)
  origin.json        the provider, the environment Terraform needs and the cluster's random
                     id: enough to find and destroy the cluster when spec.json is gone
  configured.json    the last successful configuration: fingerprint, and per node the
                     identity of the machine it configured (deployer/pipeline/drift.py)
  lifetime.json      the expiry `--ttl` set (deployer/lifetime.py); absent: no expiry
  cluster.json       the last Terraform `cluster` output (a cache of the source of truth,
                     refreshed by every apply/destroy, so `status` needs no Terraform run)
  terraform/         Terraform working dir and state; modules/ beside it
  inventory/         Ansible inventory + MPI hostfile rendered from cluster.json
  check.json         the last `deployer check` report (deployer/check/model.py)
  ssh/               cluster key pair, known_hosts, ssh_config (0600); host_keys/: each node's
                     bootstrap key for its next server and the key pinned for its server now
                     (deployer/pipeline/boot.py, rekey.py)
  boot/              each node's cloud-init user-data (0600: it holds the bootstrap host key)
  secrets/           generated secrets (0700 dir, 0600 files)
  shared/            local provider only: the host side of every node's /shared (the
                     training venv, hard-linked from the machine's prepared one, lives here)
  runs/<time>-<verb>/ full logs of each run (Terraform and Ansible events as JSON lines)
  bench/<run-id>/    benchmark results
  lock               flock: one changing verb per cluster at a time

Beside the cluster dirs, the state root holds ledger.jsonl (deployer/ledger.py). This
docstring is the one listing of the layout; the README and docs/architecture.md point here.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import records
from .cluster import Cluster, ClusterOutputError
from .errors import LockedError, RecordError, UsageError
from .nodes import CLUSTER_NAME_PATTERN, DEFAULT_NAME
from .records import Configured, Lifetime, Origin

if TYPE_CHECKING:
    from .spec import ClusterSpec

@dataclass(frozen=True)
class ClusterState:
    root: Path  # the state root (.deployer)
    name: str

    @property
    def dir(self) -> Path:
        return (self.root / self.name).absolute()

    # -- paths -------------------------------------------------------------
    @property
    def spec_file(self) -> Path:
        return self.dir / "spec.json"

    @property
    def origin_file(self) -> Path:
        return self.dir / "origin.json"

    @property
    def configured_file(self) -> Path:
        return self.dir / "configured.json"

    @property
    def lifetime_file(self) -> Path:
        return self.dir / "lifetime.json"

    @property
    def cluster_file(self) -> Path:
        return self.dir / "cluster.json"

    @property
    def terraform_dir(self) -> Path:
        return self.dir / "terraform"

    @property
    def inventory_dir(self) -> Path:
        return self.dir / "inventory"

    @property
    def ssh_dir(self) -> Path:
        return self.dir / "ssh"

    @property
    def ssh_private_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def ssh_public_key(self) -> Path:
        return self.ssh_dir / "id_ed25519.pub"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.ssh_dir / "config"

    @property
    def host_keys_dir(self) -> Path:
        # The nodes' own SSH host keys, generated before boot and handed over in user-data.
        return self.ssh_dir / "host_keys"

    @property
    def boot_dir(self) -> Path:
        # Each node's cloud-init user-data (it holds the node's private host key: 0600).
        return self.dir / "boot"

    @property
    def secrets_dir(self) -> Path:
        return self.dir / "secrets"

    @property
    def shared_host_dir(self) -> Path:
        # Local provider only: the host side of the /shared bind mount.
        return self.dir / "shared"

    @property
    def bench_dir(self) -> Path:
        return self.dir / "bench"

    def exists(self) -> bool:
        return self.spec_file.exists()

    # -- records (deployer/records.py: versioned, atomic, one reader and one writer each) --
    def spec(self) -> ClusterSpec | None:
        """The spec `up` made the cluster with (None before the first `up`)."""
        data = records.read(self.spec_file)
        if data is None:
            return None
        from pydantic import ValidationError

        from .spec import ClusterSpec

        try:
            return ClusterSpec.model_validate(data["spec"], context={"recorded": True})
        except (KeyError, ValidationError) as e:
            raise RecordError(f"{self.spec_file} is damaged ({str(e).splitlines()[0]}): delete it and run `deployer up` "
                              f"again") from None

    def write_spec(self, spec: ClusterSpec) -> None:
        records.write(self.spec_file, {"spec": spec.model_dump(mode="json")})

    def origin(self) -> Origin | None:
        return records.read_as(Origin, self.origin_file)

    def write_origin(self, origin: Origin) -> None:
        records.write_as(self.origin_file, origin)

    def lifetime(self) -> Lifetime | None:
        """The expiry `--ttl` set; None: no expiry."""
        return records.read_as(Lifetime, self.lifetime_file)

    def write_lifetime(self, lifetime: Lifetime | None) -> None:
        if lifetime is None:
            self.lifetime_file.unlink(missing_ok=True)
        else:
            records.write_as(self.lifetime_file, lifetime)

    def configured(self) -> Configured | None:
        return records.read_as(Configured, self.configured_file)

    def write_configured(self, configured: Configured) -> None:
        records.write_as(self.configured_file, configured)

    def cluster(self) -> Cluster | None:
        """The `cluster` output of the last apply, typed (None before the first)."""
        data = records.read(self.cluster_file)
        if data is None:
            return None
        try:
            return Cluster.parse(data)
        except ClusterOutputError as e:
            raise RecordError(f"{self.cluster_file}: {e.message}; delete it and run `deployer up` again (it is rewritten from "
                              f"Terraform's state)") from None

    def write_cluster(self, cluster: Cluster) -> None:
        records.write(self.cluster_file, cluster.to_output())

    @property
    def cluster_id(self) -> str | None:
        """The identity `up` gave the cluster when it first made anything (origin.json);
        None: this state dir has made nothing. On OpenStack it is in every server's
        metadata and every resource's tags, and whatever finds, expires or deletes the
        cluster's resources matches it: a same-named cluster of someone else is not ours."""
        origin = self.origin()
        return origin.cluster_id if origin else None

    # -- layout ------------------------------------------------------------
    def create(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for d in (self.ssh_dir, self.secrets_dir):
            d.mkdir(mode=0o700, exist_ok=True)
            d.chmod(0o700)
        if not self.ssh_private_key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"deployer-{self.name}", "-f", str(self.ssh_private_key)],
                check=True,
            )
        self.known_hosts.touch(mode=0o600, exist_ok=True)

    def new_run_dir(self, verb: str) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        d = self.dir / "runs" / f"{stamp}-{verb}"
        n = 1
        while d.exists():
            n += 1
            d = self.dir / "runs" / f"{stamp}-{verb}-{n}"
        d.mkdir(parents=True)
        return d

    @contextmanager
    def lock(self, verb: str) -> Iterator[None]:
        """Hold the cluster's lock for the verb's lifetime; refuse, never wait."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another deployer process"
                raise LockedError(
                    f"cluster {self.name!r} is busy ({holder}); wait for it to finish, then run this again"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{verb} by pid {os.getpid()}".encode(), 0)
            yield
        finally:
            os.close(fd)  # closing drops the flock


def new_cluster_id() -> str:
    """12 hex digits (48 random bits): unique among a project's clusters, short enough for
    a Neutron tag (deployer-id-<id>) and readable in `openstack server show`."""
    import secrets

    return secrets.token_hex(6)


def resolve_name(root: Path, name: str | None, config_name: str | None = None) -> str:
    """--name, else the config's name, else the only cluster in the state root, else 'demo'.

    A name given by hand is checked as `up` checks it, on every verb: `--name ../x` or
    `a/b` would otherwise resolve outside the state root."""
    for given, where in ((name, "--name"), (config_name, "the config's name")):
        if given:
            return _valid_name(given, where)
    if root.is_dir():
        clusters = sorted(p.name for p in root.iterdir() if (p / "spec.json").exists())
        if len(clusters) == 1:
            return clusters[0]
        if len(clusters) > 1:
            raise UsageError(f"several clusters in {root}: {', '.join(clusters)}; pick one with --name")
    return DEFAULT_NAME


def _valid_name(name: str, where: str) -> str:
    import re

    if not re.match(CLUSTER_NAME_PATTERN, name):
        raise UsageError(f"{where} {name!r} is not a cluster name: use lowercase letters, digits and '-', starting with "
                         f"a letter, at most 20 characters (e.g. demo)")
    return name
