"""The records deployer keeps on disk, typed: one reader and one writer each.

Every record is a JSON object with a `version`, written whole or not at all (a temporary
file renamed over the old one), so a crash never leaves half a record and a record from
another deployer version is refused with one line instead of misread. The state dir's
records are reached through ClusterState (state.py: `state.origin()`, `state.write_origin`);
a run's timings.json (pipeline/timings.py) and the teardown credential
(providers/openstack/provider.py) use `read`/`write` here.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from .errors import RecordError

RECORD_VERSION = 1


def write(path: Path, data: dict[str, Any], *, secret: bool = False) -> None:
    """`data` as a versioned record at `path`, atomically; `secret`: 0600, in a 0700 dir."""
    path.parent.mkdir(mode=0o700 if secret else 0o777, parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"version": RECORD_VERSION, **data}, indent=2, default=str) + "\n")
    tmp.replace(path)  # atomic: a crash never leaves half a record


def read(path: Path) -> dict[str, Any] | None:
    """The record at `path` without its version (None when absent); a damaged one, or one
    of another version, is one line naming the file and the fix."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RecordError(
            f"{path} is damaged ({e.__class__.__name__} at {getattr(e, 'pos', '?')}): restore it from a backup, "
            f"or delete it and run `deployer up` again (it is rewritten from Terraform's state)"
        ) from None
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        found = data.get("version") if isinstance(data, dict) else None
        raise RecordError(f"{path}: record version {found} is not {RECORD_VERSION}; use the deployer version that wrote it")
    data.pop("version")
    return data


R = TypeVar("R")


def read_as(cls: type[R], path: Path) -> R | None:
    """The record at `path` as the dataclass `cls` (None when absent); missing or unknown
    fields are a damaged record, named with its file."""
    data = read(path)
    if data is None:
        return None
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # cls is one of the dataclasses below
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}  # type: ignore[arg-type]
    missing, unknown = required - data.keys(), data.keys() - known
    if missing or unknown:
        what = f"no {', '.join(sorted(missing))}" if missing else f"unknown {', '.join(sorted(unknown))}"
        raise RecordError(f"{path} is damaged ({what}): delete it and run `deployer up` again")
    return cls(**data)


def write_as(path: Path, record: Any, *, secret: bool = False) -> None:
    write(path, asdict(record), secret=secret)


@dataclass(frozen=True)
class Origin:
    """origin.json: how to reach, recognise and destroy what `up` made, apart from the spec
    (`down` needs it when the spec record is lost)."""
    provider: str
    terraform_env: dict[str, str]
    # Made once, when the cluster first made anything; on OpenStack it is in every server's
    # metadata and every resource's tags, and whatever finds, expires or deletes the
    # cluster's resources matches it: a same-named cluster of someone else is not ours.
    cluster_id: str


@dataclass(frozen=True)
class Lifetime:
    """lifetime.json: the expiry `--ttl` set (lifetime.py says when). Times are ISO UTC."""
    ttl: str
    set_at: str
    expires_at: str


@dataclass(frozen=True)
class Configured:
    """configured.json: the last successful configuration (pipeline/drift.py): what it
    depended on, and per node the identity of the machine it configured."""
    fingerprint: str
    nodes: dict[str, str | None] = field(default_factory=dict)  # node name -> the machine's id
    run: str | None = None
