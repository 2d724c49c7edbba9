"""SSH local forwards through the master: how this machine reaches what listens only there.

Grafana, Prometheus and the Pushgateway listen on the master's cluster address,
JupyterLab on its loopback; none is on a public or floating address unless the spec
says so. open_tunnels() runs one `ssh -N -L ...` (through the cluster's ssh_config, so
the master's host key is pinned), waits until each local port accepts, and stops ssh on
exit. Local ports are bound on 127.0.0.1 only.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from . import ui
from .errors import OperationFailed

LAST_PORT = 65535


def free_port() -> int:
    """A port on 127.0.0.1 the kernel says is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def first_free_port(start: int, *, skip: set[int] | frozenset[int] = frozenset(), span: int = 100) -> int:
    """`start`, or the next port above it that is free on 127.0.0.1 (within `span`)."""
    for port in range(start, min(start + span, LAST_PORT + 1)):
        if port not in skip and port_is_free(port):
            return port
    raise OperationFailed(f"no free local port in {start}-{min(start + span, LAST_PORT + 1) - 1}; pass another --port")


def tunnel_command(ssh_base_cmd: Sequence[str], forwards: Sequence[tuple[int, str, int]]) -> list[str]:
    """ssh argv forwarding 127.0.0.1:<local> to <host>:<port> as seen from the master.

    `ssh_base_cmd` ends with the destination (user@master) and carries the identity
    and known_hosts options; the forwarding options go before the destination, since
    ssh reads anything after it as a remote command. Options given in the base
    command win (ssh takes the first value of each -o).
    """
    if not ssh_base_cmd:
        raise ValueError("ssh_base_cmd is empty")
    *base, destination = ssh_base_cmd
    cmd = [
        *base,
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=3",
        # Our own connection: a shared ControlMaster would take the forwards and exit.
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
    ]
    for local, host, port in forwards:
        cmd += ["-L", f"127.0.0.1:{local}:{host}:{port}"]
    cmd.append(destination)
    return cmd


def accepts(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:<port>."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def _choose_ports(names: Sequence[str], preferred: Mapping[str, int], attempt: int) -> dict[str, int]:
    """A free port per name: the preferred one or the next free above it (moved on by one
    per retry, since a retry means it was taken meanwhile); any free port otherwise."""
    ports: dict[str, int] = {}
    for name in names:
        if name in preferred:
            ports[name] = first_free_port(preferred[name] + attempt - 1, skip=set(ports.values()))
        else:
            ports[name] = free_port()
    return ports


@contextmanager
def open_tunnels(
    ssh_base_cmd: Sequence[str],
    targets: Mapping[str, tuple[str, int]],
    *,
    preferred: Mapping[str, int] | None = None,
    timeout: float = 20.0,
    attempts: int = 3,
) -> Iterator[dict[str, int]]:
    """One ssh process forwarding each target; yields {name: local port}.

    Local ports are free ports on 127.0.0.1: for a name in `preferred`, that port or the
    next free one above it. If one is taken between choosing and binding (ssh exits at
    once with ExitOnForwardFailure), new ports are tried. Raises OperationFailed with
    ssh's last message if the tunnel does not come up within `timeout` seconds.
    """
    if not targets:
        raise ValueError("no targets to forward")
    with tempfile.TemporaryDirectory(prefix="deployer-tunnel-") as tmp:
        errlog = Path(tmp) / "ssh.stderr"
        for attempt in range(1, attempts + 1):
            ports = _choose_ports(list(targets), preferred or {}, attempt)
            cmd = tunnel_command(ssh_base_cmd, [(ports[n], host, port) for n, (host, port) in targets.items()])
            with errlog.open("wb") as err:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
            try:
                deadline = time.monotonic() + timeout
                waiting = set(ports)
                while waiting and proc.poll() is None and time.monotonic() < deadline:
                    waiting = {n for n in waiting if not accepts(ports[n])}
                    if waiting:
                        time.sleep(0.1)
                if not waiting and proc.poll() is None:
                    yield ports
                    return
                message = _last_line(errlog)
                if proc.poll() is not None and attempt < attempts and ("in use" in message.lower() or "cannot listen" in message.lower()):
                    continue
                what = "exited" if proc.poll() is not None else f"did not open within {timeout:.0f}s"
                raise OperationFailed(f"SSH tunnel to the master {what}: {message}")
            finally:
                _stop(proc)
        raise OperationFailed("SSH tunnel to the master: no free local port could be bound")


@contextmanager
def open_tunnel(ssh_base_cmd: Sequence[str], remote_host: str, remote_port: int, *, timeout: float = 20.0) -> Iterator[int]:
    """`ssh -N -L 127.0.0.1:<free>:<remote_host>:<remote_port>`; yields the local port once it accepts."""
    with open_tunnels(ssh_base_cmd, {"target": (remote_host, remote_port)}, timeout=timeout) as ports:
        yield ports["target"]


def hold() -> None:
    """Keep an open tunnel until Ctrl-C or SIGTERM (`deployer dashboard`, `notebook`)."""
    import signal

    # Also when started in the background, where the shell leaves SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    ui.info("tunnel open; Ctrl-C closes it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        ui.ok("tunnel closed")
