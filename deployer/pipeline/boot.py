"""The boot contract: every node's first boot is one `#cloud-config`, rendered here.

Both providers boot nodes from the same text: OpenStack hands it to Nova as the
server's `user_data`; the local provider writes it as a NoCloud seed into the
container before its first boot. It carries the cluster user (the cluster key,
passwordless sudo), the hostname and the node's own SSH host key. The host keys are
generated here, into the state dir, before Terraform runs, so `known_hosts` is written
from them before the first connection: host key checking is on from the start and
nothing is trusted on first use.

After Terraform, the same module writes what every SSH of the deployer reads: the
pinned `known_hosts` and an `ssh_config` with one `Host` block per node (workers hop
through the master when the cluster's `access` says so).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..credentials import write_secret
from ..errors import UsageError

if TYPE_CHECKING:
    from ..cluster import Cluster, Node
    from ..spec import ClusterSpec
    from ..state import ClusterState

# Nova refuses a server whose base64-encoded user_data is longer than this.
NOVA_USER_DATA_LIMIT = 65535
HOST_KEY_TYPE = "ed25519"

# From its first boot each node counts the bytes it receives from outside its own
# subnet (package mirrors, PyPI, the NVIDIA repos): `up` reads the counter at the end of
# Ansible (site.yml's last play) and reports what every node pulled (deployer/pipeline/timings.py),
# so a worker that downloads what the master already has shows. Counted before anything
# is fetched, on the cloud and locally alike. nftables is in every Debian and Ubuntu
# cloud image (priority important); a node without `nft` is simply not counted. The
# cluster subnet is read on the node, so an existing OpenStack network needs no lookup.
ACCOUNTING_TABLE = "deployer_acct"
ACCOUNTING_COUNTER = "from_outside"
ACCOUNTING_SCRIPT = f"""command -v nft >/dev/null 2>&1 || exit 0
nets=$(ip -o -4 route show scope link | awk '$1 ~ /[/]/ {{print $1}}' | sort -u | paste -sd, -)
inside=${{nets:+"ip saddr {{ $nets }} return"}}
nft -f - <<EOF
table inet {ACCOUNTING_TABLE}
delete table inet {ACCOUNTING_TABLE}
table inet {ACCOUNTING_TABLE} {{
  counter {ACCOUNTING_COUNTER} {{ }}
  chain input {{
    type filter hook input priority -150; policy accept;
    iif lo return
    $inside
    ip6 saddr fe80::/10 return
    counter name {ACCOUNTING_COUNTER}
  }}
}}
EOF
"""


@dataclass(frozen=True)
class HostKey:
    name: str
    private_path: Path

    @property
    def public(self) -> str:
        """'ssh-ed25519 AAAA…' without the comment, as known_hosts wants it."""
        return " ".join(self.private_path.with_suffix(".pub").read_text().split()[:2])

    @property
    def private(self) -> str:
        return self.private_path.read_text()


def host_key(state: "ClusterState", name: str) -> HostKey:
    """The node's bootstrap key: the one its user-data carries to the next server of that name."""
    return HostKey(name, state.host_keys_dir / f"{name}_{HOST_KEY_TYPE}")


# ---- after the first contact: the node's own key (deployer/pipeline/rekey.py) ----------------------
#
# The bootstrap key travels in user-data, which any process on an OpenStack VM can read from
# the metadata service for the server's life. So it only opens the first connection: over
# it the node makes a fresh key, the deployer pins that one for that server (by its id, so a
# server made anew under the same name is known by its new bootstrap key again) and forgets
# the bootstrap pair; the next `up` makes a new pair for whatever server is created next.


@dataclass(frozen=True)
class PinnedKey:
    server: str | None  # the node's id in the cluster output: the key is that server's only
    key: str  # 'ssh-ed25519 AAAA…'


def pinned_path(state: "ClusterState", name: str, *, pending: bool = False) -> Path:
    return state.host_keys_dir / f"{name}_{HOST_KEY_TYPE}.{'pending' if pending else 'pinned'}"


def read_pinned(state: "ClusterState", node: "Node", *, pending: bool = False) -> list[str]:
    """The rotated key of this very server ([] or one), or (`pending`) the keys made for it by
    rotations not yet finished: any of them may be the one its sshd serves now."""
    path = pinned_path(state, node.name, pending=pending)
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(rec, dict) or rec.get("server") != node.id:
        return []
    return [k for k in rec.get("keys", []) if isinstance(k, str)]


def write_pinned(state: "ClusterState", node: "Node", key: str, *, pending: bool = False) -> None:
    """Pin `key` for this server, or (`pending`) accept it beside the keys accepted already."""
    keys = [*read_pinned(state, node, pending=True), key] if pending else [key]
    write_secret(pinned_path(state, node.name, pending=pending), (json.dumps({"server": node.id, "keys": keys}) + "\n").encode())


def accepted_keys(state: "ClusterState", node: "Node") -> list[str]:
    """The keys SSH accepts for `node`: its own once rotated; before that its bootstrap key,
    and the new ones while a rotation is half done (so an interrupt never locks us out)."""
    pinned = read_pinned(state, node)
    if pinned:
        return pinned
    keys = []
    if host_key(state, node.name).private_path.with_suffix(".pub").exists():
        keys.append(host_key(state, node.name).public)
    return keys + read_pinned(state, node, pending=True)


def needs_rotation(state: "ClusterState", node: "Node") -> bool:
    return not read_pinned(state, node)


# ---- the cluster's host CA: what the nodes trust of each other ---------------------------
#
# The deployer pins every node's own key (above), and signs it with a CA of the cluster's
# own (state dir, 0600): a host certificate for the node's name and addresses. The nodes
# trust the CA (ssh_mesh writes one `@cert-authority` line into /etc/ssh/ssh_known_hosts),
# not each key, so a node made anew needs its own certificate and nothing on the others
# changes: `up --replace` configures the new node only (drift.py).


def host_ca_path(state: "ClusterState") -> Path:
    return state.ssh_dir / f"host_ca_{HOST_KEY_TYPE}"


def ensure_host_ca(state: "ClusterState") -> str:
    """The cluster's host CA (made once, 0600); its public key ('ssh-ed25519 AAAA…')."""
    path = host_ca_path(state)
    if not path.exists() or not path.with_suffix(".pub").exists():
        path.unlink(missing_ok=True)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", HOST_KEY_TYPE, "-N", "", "-C", f"{state.name} host CA", "-f", str(path)],
                       check=True, capture_output=True)
    path.chmod(0o600)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def host_principals(node: "Node") -> list[str]:
    """The names a certificate vouches for: what nodes and users reach the node by."""
    return list(dict.fromkeys([node.name, node.private_ip] + ([node.public_ip] if node.public_ip else [])))


def sign_host_key(state: "ClusterState", node: "Node", key: str) -> str:
    """A host certificate ('ssh-ed25519-cert-v01@openssh.com AAAA…') for `key`, signed by the
    cluster's CA, valid for the node's principals (ssh-keygen -s … -h -n …)."""
    import tempfile

    ensure_host_ca(state)
    with tempfile.TemporaryDirectory(prefix="deployer-sign-") as d:
        pub = Path(d) / "key.pub"
        pub.write_text(key + "\n")
        subprocess.run(["ssh-keygen", "-q", "-s", str(host_ca_path(state)), "-h", "-I", f"{state.name}/{node.name}/{node.id}",
                        "-n", ",".join(host_principals(node)), str(pub)], check=True, capture_output=True)
        return " ".join((Path(d) / "key-cert.pub").read_text().split()[:2])


def cert_path(state: "ClusterState", name: str) -> Path:
    return state.host_keys_dir / f"{name}_{HOST_KEY_TYPE}.cert"


def read_cert(state: "ClusterState", node: "Node") -> str | None:
    """The certificate the node serves, as recorded when it was installed (None: none, or one
    of another server or key)."""
    try:
        rec = json.loads(cert_path(state, node.name).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("server") != node.id or rec.get("key") not in read_pinned(state, node):
        return None
    cert = rec.get("cert")
    return cert if isinstance(cert, str) else None


def write_cert(state: "ClusterState", node: "Node", key: str, cert: str) -> None:
    write_secret(cert_path(state, node.name), (json.dumps({"server": node.id, "key": key, "cert": cert}) + "\n").encode())


def needs_certificate(state: "ClusterState", node: "Node") -> bool:
    """Rotated, but serving no certificate of the cluster's CA (a node rotated before the CA)."""
    return bool(read_pinned(state, node)) and read_cert(state, node) is None


def ensure_host_keys(state: "ClusterState", names: list[str]) -> dict[str, HostKey]:
    """One ed25519 bootstrap key per node name (0600): the key the next server of that name
    boots with. Kept until the node's first contact replaces it (rekey.py), then made anew
    here for whatever server of that name is created next; a running server ignores a
    changed user-data (both modules), so this never touches one."""
    d = state.host_keys_dir
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = {}
    for name in names:
        key = host_key(state, name)
        if not key.private_path.exists() or not key.private_path.with_suffix(".pub").exists():
            key.private_path.unlink(missing_ok=True)
            subprocess.run(
                ["ssh-keygen", "-q", "-t", HOST_KEY_TYPE, "-N", "", "-C", f"{name} host key", "-f", str(key.private_path)],
                check=True, capture_output=True,
            )
        key.private_path.chmod(0o600)
        keys[name] = key
    return keys


def render_user_data(*, hostname: str, user: str, authorized_key: str, key: HostKey) -> str:
    """The `#cloud-config` of one node: valid for Debian/Ubuntu cloud images and the local image."""
    config: dict[str, Any] = {
        "hostname": hostname,
        "preserve_hostname": False,
        # Only the 127.0.1.1 line; the cluster's names go in through Ansible, and a
        # templated /etc/hosts would overwrite them on every boot.
        "manage_etc_hosts": "localhost",
        "users": [
            # `default` keeps the image's own user (ubuntu, debian…); an entry of the same
            # name is merged into it, so ssh_user = ubuntu works too.
            "default",
            {
                "name": user,
                "shell": "/bin/bash",
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "lock_passwd": True,
                "ssh_authorized_keys": [authorized_key.strip()],
            },
        ],
        "ssh_pwauth": False,
        "disable_root": True,
        # The node's own host key, made by the deployer and pinned before the first
        # connection. The image's keys go; no other type is generated.
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [HOST_KEY_TYPE],
        "ssh_keys": {
            f"{HOST_KEY_TYPE}_private": key.private,
            f"{HOST_KEY_TYPE}_public": key.public,
        },
        # Every boot (a reboot starts the count again), before anything is downloaded.
        "bootcmd": [["sh", "-c", ACCOUNTING_SCRIPT]],
    }
    return "#cloud-config\n" + yaml.safe_dump(config, sort_keys=False, width=1000)


def check_user_data_size(name: str, text: str) -> None:
    size = len(base64.b64encode(text.encode()))
    if size > NOVA_USER_DATA_LIMIT:
        raise UsageError(
            f"the user-data of {name} is {size} bytes base64-encoded, over Nova's limit of {NOVA_USER_DATA_LIMIT}: "
            f"shorten ssh_user or the keys, or report it as a deployer bug"
        )


def write_user_data(spec: "ClusterSpec", state: "ClusterState") -> Path:
    """Render every node's user-data into <state>/boot/<node>.user-data (0600); return the dir.

    Runs before Terraform: both modules read these files. Refuses (exit 2, nothing
    created in the cloud) when one is too big for Nova.
    """
    names = spec.node_names()
    keys = ensure_host_keys(state, names)
    ensure_host_ca(state)  # signs each node's own key after its first contact (rekey.py)
    authorized = state.ssh_public_key.read_text()
    assert spec.ssh_user is not None  # ClusterSpec's validator fills it in
    texts = {}
    for name in names:
        texts[name] = render_user_data(hostname=name, user=spec.ssh_user, authorized_key=authorized, key=keys[name])
        check_user_data_size(name, texts[name])
    d = state.boot_dir
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, text in texts.items():
        path = d / f"{name}.user-data"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    return d


def prune(state: "ClusterState", cluster: Cluster) -> None:
    """Forget the keys and user-data of nodes the cluster no longer has (after a scale-in)."""
    keep = {n.name for n in cluster.nodes}
    for d in (state.host_keys_dir, state.boot_dir):
        if d.is_dir():
            for f in d.iterdir():
                if f.name.split("_")[0].removesuffix(".user-data") not in keep:
                    f.unlink()


# ---- after Terraform: what every SSH reads ---------------------------------------------------


def known_hosts(state: "ClusterState", cluster: Cluster) -> str:
    """One line per accepted key of each node (accepted_keys): its name, cluster address and
    public address. A node with no key known gets no line: SSH refuses it."""
    lines = ["# Written by deployer from the host keys it generated or pinned; every SSH checks against these."]
    for node in cluster.nodes:
        names = [node.name, node.private_ip] + ([node.public_ip] if node.public_ip else [])
        lines += [f"{','.join(dict.fromkeys(names))} {key}" for key in accepted_keys(state, node)]
    return "\n".join(lines) + "\n"


def ssh_config(state: "ClusterState", cluster: Cluster) -> str:
    """An ssh_config with one Host block per node, keyed by node name.

    Everything the deployer runs over SSH (its verbs, Ansible, tunnels) uses this file
    through `ssh -F`, so users reach nodes the same way (`deployer ssh-config`).
    Workers of an `access: via_master` cluster hop through the master with a
    ProxyCommand that repeats `-F`, so both hops check the pinned keys (`ssh -J` would
    not carry command-line options to the jump).
    """
    master = cluster.master
    lines = [f"# Written by deployer for cluster {cluster.name}: `deployer ssh-config` prints it.", ""]
    for node in cluster.nodes:
        via_master = cluster.access == "via_master" and node is not master
        address = node.private_ip if via_master else (node.public_ip or node.private_ip)
        lines += [
            f"Host {node.name}",
            f"  HostName {address}",
            f"  User {cluster.ssh_user}",
            f"  IdentityFile {_quote(state.ssh_private_key)}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {_quote(state.known_hosts)}",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "  ConnectTimeout 10",
        ]
        if via_master:
            lines.append(f"  ProxyCommand ssh -F {shlex.quote(str(state.ssh_config))} -W %h:%p {master.name}")
        lines.append("")
    return "\n".join(lines)


def _quote(path: Path) -> str:
    return f'"{path}"' if " " in str(path) else str(path)


def write_access(state: "ClusterState", cluster: Cluster) -> None:
    """known_hosts and ssh_config for `cluster`, written (0600) before any SSH to it."""
    for path, text in ((state.known_hosts, known_hosts(state, cluster)), (state.ssh_config, ssh_config(state, cluster))):
        write_secret(path, text.encode())
