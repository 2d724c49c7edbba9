"""After the first verified connection, each node's bootstrap host key is replaced by one
made on the node itself and pinned here (boot.py, "after the first contact").

The bootstrap key came in user-data, which Nova's metadata service serves to any process
on the VM for the server's life, and which cloud-init keeps a copy of on disk. Over the
connection that key authenticated, the node makes a fresh key (its private half never
leaves the node); the deployer accepts it beside the bootstrap key (pending), swaps it in
and reloads sshd, proves a new connection with the new key alone, then pins it for that
server and forgets the bootstrap pair. An interrupt at any point leaves a key that SSH
still accepts, and the next `up` finishes the job.

With the swap the node also gets a host certificate for its new key, signed by the
cluster's host CA (boot.sign_host_key) and served by sshd (HostCertificate): the other
nodes trust the CA, not each key (ssh_mesh), so a node made anew changes nothing on them.
A node rotated before its cluster had a CA gets its certificate the same way (certify),
its key kept.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ..errors import OperationFailed
from ..remote import ssh_argv
from .boot import (
    HOST_KEY_TYPE,
    host_key,
    needs_certificate,
    needs_rotation,
    pinned_path,
    read_pinned,
    sign_host_key,
    write_access,
    write_cert,
    write_pinned,
)
from .readiness import KEY_REFUSED

if TYPE_CHECKING:
    from ..cluster import Cluster, Node
    from ..state import ClusterState

KEY = f"/etc/ssh/ssh_host_{HOST_KEY_TYPE}_key"
# Debian's unit is ssh.service (others name it sshd): a reload re-executes the listener, which
# reads the host keys again; open sessions stay.
RELOAD = 'systemctl reload ssh.service 2>/dev/null || systemctl reload sshd.service 2>/dev/null || kill -HUP "$(cat /run/sshd.pid)"'
AS_ROOT = ["sudo", "-n"]  # the cluster user's passwordless sudo (the user-data gives it)
# Where sshd is told to serve the certificate: Debian's and Ubuntu's sshd_config include
# this directory before anything else.
SSHD_DROPIN = "/etc/ssh/sshd_config.d/deployer-host-certificate.conf"


def make_script(key: str) -> str:
    """As root: a new key beside the live one; its public half on stdout."""
    return f"""set -e
umask 077
rm -f {key}.next {key}.next.pub
ssh-keygen -q -t {HOST_KEY_TYPE} -N '' -C "$(hostname) host key" -f {key}.next </dev/null
cat {key}.next.pub"""


def cert_script(key: str, cert: str) -> str:
    """As root: the key's certificate beside it, and sshd's drop-in that serves it (read at
    the next reload)."""
    return f"""printf '%s\\n' {shlex.quote(cert)} > {key}-cert.pub
chmod 644 {key}-cert.pub
mkdir -p "$(dirname {SSHD_DROPIN})"
printf '%s\\n' '# Written by deployer: the host certificate of the cluster CA, which the nodes trust.' \\
  'HostCertificate {key}-cert.pub' > {SSHD_DROPIN}"""


def swap_script(key: str, reload: str, cert: str) -> str:
    """As root: the new key in place of the bootstrap one, its certificate beside it, and
    sshd told. Run again after a dropped connection, it only tells sshd again (the proof
    then says whether it took)."""
    return f"""set -e
if [ -s {key}.next ]; then
  mv -f {key}.next.pub {key}.pub
  mv -f {key}.next {key}
fi
{cert_script(key, cert)}
{reload}"""


TIMEOUT_S = 60


def rotate(state: "ClusterState", cluster: Cluster) -> list[str]:
    """Every node still on its bootstrap key gets its own, in parallel; returns their names.
    Raises OperationFailed naming the first node that could not (its old key still works)."""
    todo = [n for n in cluster.nodes if needs_rotation(state, n)]
    if not todo:
        return []
    records = threading.Lock()  # one writer of the key records and known_hosts at a time

    def one(node: Node) -> str:
        new = _public_key(_root(state, node, make_script(KEY), "make a new host key"))
        with records:
            write_pinned(state, node, new, pending=True)
            write_access(state, cluster)  # bootstrap and new key both accepted from here on
        cert = sign_host_key(state, node, new)
        _root(state, node, swap_script(KEY, RELOAD, cert), "swap in the new host key", tries=3)
        with records:  # the new key alone, for the proof
            write_pinned(state, node, new)
            write_access(state, cluster)
        try:
            _root(state, node, "true", "connect with the new host key alone", tries=5)
        except OperationFailed:
            with records:  # back to accepting both: nothing is locked out
                pinned_path(state, node.name).unlink(missing_ok=True)
                write_access(state, cluster)
            raise
        with records:
            write_cert(state, node, new, cert)
            pinned_path(state, node.name, pending=True).unlink(missing_ok=True)
            bootstrap = host_key(state, node.name).private_path
            bootstrap.unlink(missing_ok=True)
            bootstrap.with_suffix(".pub").unlink(missing_ok=True)
        return node.name

    return _master_first(todo, one)


def certify(state: "ClusterState", cluster: Cluster) -> list[str]:
    """Every node rotated before its cluster had a host CA gets a certificate for the key it
    serves (the pinned one), and sshd serves it; returns their names."""
    todo = [n for n in cluster.nodes if needs_certificate(state, n)]
    records = threading.Lock()

    def one(node: Node) -> str:
        key = read_pinned(state, node)[0]
        cert = sign_host_key(state, node, key)
        _root(state, node, f"set -e\n{cert_script(KEY, cert)}\n{RELOAD}", "install its host certificate", tries=3)
        with records:
            write_cert(state, node, key, cert)
        return node.name

    return _master_first(todo, one)


def _master_first(todo: list[Node], one: Callable[[Node], str]) -> list[str]:
    """`one` on each node of `todo`, the workers in parallel; their results.

    The master first, alone: every connection to a worker hops through it, and one made
    while its sshd reloads is dropped ("Connection closed by UNKNOWN port 65535", seen)."""
    done = [one(n) for n in todo if n.is_master]
    workers = [n for n in todo if not n.is_master]
    if workers:
        with ThreadPoolExecutor(max_workers=min(16, len(workers))) as pool:
            futures = [pool.submit(one, n) for n in workers]
            done += [f.result() for f in futures]
    return done


def _root(state: "ClusterState", node: Node, script: str, what: str, tries: int = 1) -> str:
    """`script` as root on `node`; its stdout. A connection refused right after sshd's reload
    is tried again (up to `tries`); a refused host key never is."""
    argv = [*ssh_argv(state, node), *AS_ROOT, "sh", "-c", shlex.quote(script)]
    for attempt in range(1, tries + 1):
        try:
            p = subprocess.run(argv, text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise OperationFailed(f"{node.name}: could not {what} (no answer in {TIMEOUT_S}s); `deployer up` again retries") from None
        if p.returncode == 0:
            return p.stdout
        if p.returncode != 255 or KEY_REFUSED in p.stderr or attempt == tries:
            last = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            raise OperationFailed(f"{node.name}: could not {what} ({last}); `deployer up` again retries")
        time.sleep(1)
    raise AssertionError("unreachable")


def _public_key(out: str) -> str:
    fields = out.split()
    if len(fields) < 2 or fields[0] != f"ssh-{HOST_KEY_TYPE}":
        raise OperationFailed(f"the node printed no {HOST_KEY_TYPE} public key ({out.strip()[:80]!r})")
    return " ".join(fields[:2])

