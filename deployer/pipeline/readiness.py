"""Wait for boot: nothing configures a node before it answers SSH with its pinned host
key and cloud-init has finished without errors.

A cloud VM is ACTIVE long before it is usable (sshd not up, cloud-init still creating
the user, the host key not yet written); a local container started a moment ago is
the same. Every node is waited for in parallel, each with backoff and one deadline.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from .. import ui
from ..errors import OperationFailed
from ..remote import ssh_argv

if TYPE_CHECKING:
    from ..cluster import Cluster, Node
    from ..state import ClusterState

# ssh's last word when the server's key is not the pinned one (or none is pinned); the
# line before it names the address ("Host key for A has changed…", "No … host key is
# known for A and…"), which tells a worker's own refusal from its jump host's.
KEY_REFUSED = "Host key verification failed"
CLOUD_INIT = "cloud-init status --wait --long"


class NotYet(Exception):
    """A transient state of a booting node: retried until the deadline."""


class Stopped(Exception):
    """Another node failed for good: this one stops waiting."""


class KeyRefused(OperationFailed):
    """The node serves another host key than the one pinned for it: never retried."""


@dataclass
class Probe:
    rc: int
    out: str
    err: str


class InFlight:
    """The probes running now, so an interrupted wait can stop them: `cloud-init status
    --wait` may block until cloud-init is done. Once stopped, a probe that starts is
    stopped at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[str]] = set()
        self._stopped = False

    def add(self, p: subprocess.Popen[str]) -> None:
        with self._lock:
            self._procs.add(p)
            if self._stopped:
                p.kill()

    def discard(self, p: subprocess.Popen[str]) -> None:
        with self._lock:
            self._procs.discard(p)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for p in self._procs:
                p.kill()


def probe(state: "ClusterState", cluster: Cluster, node: Node, timeout: float,
          running: InFlight | None = None) -> Probe:
    """One `ssh node cloud-init status --wait` (registered in `running` while it runs)."""
    argv = ssh_argv(state, node)
    argv[1:1] = ["-o", "ConnectTimeout=5"]  # before -F: the first value of an option wins
    running = InFlight() if running is None else running
    with subprocess.Popen([*argv, CLOUD_INIT], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL) as p:
        running.add(p)
        try:
            out, err = p.communicate(timeout=max(5.0, timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            return Probe(124, "", "no answer in time")
        finally:
            running.discard(p)
    return Probe(p.returncode, out, err)


def classify(node: Node, result: Probe) -> str:
    """'ready', or raise NotYet / KeyRefused / OperationFailed, from one probe's result."""
    err = result.err
    if result.rc == 255:
        addresses = {node.private_ip, node.public_ip} - {None}
        if KEY_REFUSED in err and any(f"for {a} " in err for a in addresses):
            raise KeyRefused(_key_message(node))
        # Connection refused / timed out / closed, permission denied while cloud-init
        # has not made the user yet, or the jump host not being up: all transient.
        raise NotYet(_last_line(err) or "sshd not answering yet")
    if result.rc == 127:  # no cloud-init on the image: the user and key came from elsewhere
        return "ready"
    status = _field(result.out, "status")
    if status == "done":
        return "ready"
    if status in ("running", "not run", "not started"):
        raise NotYet(f"cloud-init {status}")
    errors = [line.strip(" -") for line in result.out.splitlines() if line.startswith(("\t-", "  -", "- "))]
    detail = _field(result.out, "detail") or (errors[0] if errors else _last_line(result.out + result.err))
    raise OperationFailed(f"{node.name}: cloud-init finished with status {status or 'unknown'!r} ({detail})")


def _key_message(node: Node) -> str:
    return (
        f"{node.name} serves an SSH host key that is not the one deployer pinned for it, so the connection was "
        f"refused: the machine was rebuilt outside the deployer, or something intercepts the connection; "
        f"recreate it with `deployer up --replace {node.name}`"
    )


def _field(text: str, key: str) -> str:
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() == key:
            return v.strip()
    return ""


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Warning: Permanently added")]
    return lines[-1] if lines else ""


def wait_for_boot(
    state: "ClusterState", cluster: Cluster, *, timeout_s: float, hint: Callable[[str], str]
) -> dict[str, float]:
    """Every node ready, in parallel; returns seconds to ready per node. Raises on the first
    node that fails for good, naming it and where to look."""
    nodes = cluster.nodes
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    stop = threading.Event()
    pending: dict[str, str] = {n.name: "starting" for n in nodes}
    lock = threading.Lock()
    running = InFlight()
    spinner = ui.err.status("") if ui.err.is_terminal else None

    def show() -> None:
        if spinner:
            waiting = ", ".join(f"{k.removeprefix(cluster.name + '-')}: {v}" for k, v in sorted(pending.items()))
            spinner.update(f"boot: {len(nodes) - len(pending)}/{len(nodes)} ready ({waiting})")

    def one(node: Node) -> float:
        def attempt() -> str:
            if stop.is_set():
                raise Stopped
            try:
                return classify(node, probe(state, cluster, node, deadline - time.monotonic(), running))
            except NotYet as e:
                with lock:
                    pending[node.name] = str(e)[:60]
                    show()
                raise

        try:
            for tried in Retrying(
                retry=retry_if_exception_type(NotYet),
                # At most 2 s between tries: a node that is ready waits no longer than that.
                wait=wait_exponential(multiplier=0.25, max=2),
                stop=stop_after_delay(max(1.0, deadline - time.monotonic())),
                reraise=False,
            ):
                with tried:
                    attempt()
        except RetryError:
            reason = pending.get(node.name, "")
            raise OperationFailed(
                f"{node.name} did not come up within {timeout_s:.0f}s (last: {reason}); look at {hint(node.name)}. "
                f"`deployer up` again waits again"
            ) from None
        except KeyRefused:
            raise
        except OperationFailed as e:
            raise OperationFailed(f"{e.message}; look at {hint(node.name)}") from None
        elapsed = time.monotonic() - t0
        with lock:
            pending.pop(node.name, None)
            show()
        if not spinner:
            ui.info(f"  {node.name} booted: SSH with its pinned key, cloud-init done ({elapsed:.1f}s)")
        return elapsed

    if spinner:
        spinner.start()
        show()
    try:
        with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
            futures = {pool.submit(one, n): n.name for n in nodes}
            ready: dict[str, float] = {}
            try:
                for f in as_completed(futures):
                    ready[futures[f]] = f.result()
            except BaseException:  # a node failed for good, or Ctrl-C while waiting
                # The others give up at their next attempt; a probe in flight is stopped
                # now, or leaving the pool would wait for it (up to the whole deadline).
                stop.set()
                running.stop()
                raise
            return ready
    finally:
        if spinner:
            spinner.stop()
