"""`deployer notebook`: JupyterLab on the master, through an SSH tunnel.

The jupyterlab role binds JupyterLab to the master's loopback (127.0.0.1:8888) on the
cloud and locally alike, so the only way in is a local forward through the master,
whose host key the cluster's ssh_config pins. This machine's end is 127.0.0.1:8888, or
the next free port when that one is taken. The login password stays in the state dir's
secrets; what is shown is where it is, unless the user asks for the password itself.
"""

from __future__ import annotations

import shlex
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import ports
from .errors import OperationFailed
from .tunnel import first_free_port, open_tunnels, tunnel_command

PASSWORD_FILE = "jupyter_password"  # in the state dir's secrets dir; the jupyterlab role generates it
REMOTE_HOST, REMOTE_PORT = "127.0.0.1", ports.jupyterlab()  # as the master sees it (jupyterlab_address, jupyterlab_port)
DEFAULT_LOCAL_PORT = 8888
UNIT = "jupyterlab"


def password_file(secrets_dir: Path) -> Path:
    return Path(secrets_dir) / PASSWORD_FILE


def read_password(secrets_dir: Path) -> str:
    path = password_file(secrets_dir)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise OperationFailed(f"no JupyterLab password in {path}: run `deployer up` to install JupyterLab") from None


def local_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/lab"


def choose_port(requested: int) -> int:
    """The requested local port, or the next free one above it."""
    return first_free_port(requested)


def describe(
    *,
    local_port: int,
    requested_port: int,
    secrets_dir: Path,
    ssh_base_cmd: Sequence[str] | None = None,
    tunnel_open: bool = False,
    password: str | None = None,
) -> dict[str, Any]:
    """What `deployer notebook` shows, as a JSON-ready dict: the URL, where the password
    is (the password itself only when given), and the ssh command for the same tunnel."""
    notes = []
    if local_port != requested_port:
        notes.append(f"local port {requested_port} is in use; using {local_port}")
    ssh_command = None
    if ssh_base_cmd:
        ssh_command = shlex.join(tunnel_command(ssh_base_cmd, [(local_port, REMOTE_HOST, REMOTE_PORT)]))
    desc: dict[str, Any] = {
        "url": local_url(local_port),
        "local_port": local_port,
        "remote": f"{REMOTE_HOST}:{REMOTE_PORT} on the master",
        "tunnel_open": tunnel_open,
        "password_file": str(password_file(secrets_dir)),
        "ssh_command": ssh_command,
        "notes": notes,
    }
    if password is not None:
        desc["password"] = password
    return desc


def render(desc: Mapping[str, Any]) -> list[str]:
    """describe()'s result as lines for the console."""
    lines = list(desc["notes"])
    lines.append(f"JupyterLab   {desc['url']}")
    if "password" in desc:
        lines.append(f"Password     {desc['password']}")
    else:
        lines.append(f"Password in  {desc['password_file']}")
    if not desc["tunnel_open"] and desc.get("ssh_command"):
        lines.append(f"Tunnel by hand: {desc['ssh_command']}")
    return lines


def wait_ready(port: int, *, timeout: float = 30.0) -> None:
    """Until JupyterLab's login page answers through the tunnel; OperationFailed naming
    how to look at the service otherwise. (The tunnel's local port accepts as soon as
    ssh listens, whether or not anything answers on the master.)"""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=5) as r:
                if r.status == 200:
                    return
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except OSError as e:
            last = str(getattr(e, "reason", None) or e)
        time.sleep(0.5)
    raise OperationFailed(
        f"JupyterLab does not answer on the master ({last}); see `deployer ssh -- systemctl status {UNIT}`, "
        "or re-run `deployer up` to install it"
    )


@contextmanager
def open_notebook(ssh_base_cmd: Sequence[str], local_port: int, *, timeout: float = 30.0) -> Iterator[int]:
    """The tunnel to JupyterLab on 127.0.0.1:<local_port> (or the next free port, if it
    was taken meanwhile), once JupyterLab answers through it; yields the local port."""
    targets = {UNIT: (REMOTE_HOST, REMOTE_PORT)}
    with open_tunnels(ssh_base_cmd, targets, preferred={UNIT: local_port}, timeout=timeout) as ports:
        wait_ready(ports[UNIT], timeout=timeout)
        yield ports[UNIT]
