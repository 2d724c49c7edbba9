"""What every part of the LXC driver shares: host commands that fail as one line in the
deployer's error family, the log that goes to Terraform's output, and file locks."""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import OperationFailed

LXC_PATH = Path("/var/lib/lxc")
# What the local provider keeps once per machine: the wheelhouse nodes install from, the
# prepared training environments (runtime_env), read by image.py too (the nodes' pip.conf).
CACHE_ROOT = Path(os.environ.get("DEPLOYER_CACHE_DIR", "/var/cache/deployer"))
WHEELHOUSE = CACHE_ROOT / "wheels"


class DriverError(OperationFailed):
    """A host command of the driver failed: in the error family, so an in-process caller
    gets exit 1 and one line; only `main` turns it into an exit status."""


# Progress lines go to Terraform's log when the driver runs as a command; called in
# process (repair), the deployer says what happened in its own words.
VERBOSE = False


def log(msg: str) -> None:
    if not VERBOSE:
        return
    print(f"[lxc] {msg}", file=sys.stderr, flush=True)


def sh(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(args), text=True, capture_output=True)
    except OSError as e:  # the tool itself is missing or cannot run
        raise DriverError(f"[lxc] {args[0]} cannot run: {e.strerror}") from None
    if check and proc.returncode != 0:
        raise DriverError(f"[lxc] {shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    if not quiet and proc.stderr.strip() and proc.returncode != 0:
        log(proc.stderr.strip())
    return proc


@contextmanager
def file_lock(path: Path, shared: bool = False) -> Iterator[None]:
    """Exclusive while the image is built or refreshed; shared while a node is cloned from it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)  # waits: parallel node-ups share one image build
        yield
