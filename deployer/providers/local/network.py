"""The local cluster's network: a bridge with the host as gateway, and one nftables table
per cluster (masquerade to the host's package sources, isolation, the hop through the
master for access: via_master)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .host import DriverError, file_lock, log, sh

TABLE_PREFIX = "deployer_"


def nft_table(cluster: str) -> str:
    return TABLE_PREFIX + cluster.replace("-", "_")


@dataclass(frozen=True)
class NetworkUp:
    """network-up's arguments, once: Terraform's network `input.network` (terraform/local/
    main.tf, as JSON) and LocalProvider.repair's."""
    cluster: str
    bridge: str
    subnet: str
    gateway: str  # address/prefix length
    only_master: str | None = None  # access: via_master: the host reaches this address only


def network_up(a: NetworkUp) -> None:
    cluster, bridge, subnet, gateway = a.cluster, a.bridge, a.subnet, a.gateway
    if sh("ip", "link", "show", bridge, check=False, quiet=True).returncode != 0:
        sh("ip", "link", "add", bridge, "type", "bridge")
    have = sh("ip", "-4", "-o", "addr", "show", "dev", bridge, quiet=True).stdout
    if gateway.split("/")[0] + "/" not in have:
        sh("ip", "addr", "add", gateway, "dev", bridge)
    sh("ip", "link", "set", bridge, "up")
    # One host-wide lock with every other cluster's network-up and network-down: another
    # cluster's `down` must not see no deployer table and switch forwarding off between
    # this check and this table's load.
    with file_lock(NETWORK_LOCK):
        forwarding_on()
        # Replaced whole on every run (a re-run converges and never duplicates rules), in
        # one transaction: never a moment without the drop and reject rules.
        proc = subprocess.run(["nft", "-f", "-"], input=transaction(cluster, bridge, subnet, a.only_master),
                              text=True, capture_output=True)
        if proc.returncode != 0:
            raise DriverError(f"[lxc] nft failed: {proc.stderr.strip()}")
    log(f"network {bridge} {gateway} with NAT table {nft_table(cluster)}")


def transaction(cluster: str, bridge: str, subnet: str, only_master: str | None = None) -> str:
    """The `nft -f` text that replaces the cluster's table atomically: declared (so the
    delete succeeds on a first run), deleted and defined anew in one transaction."""
    table = nft_table(cluster)
    return f"table ip {table}\ndelete table ip {table}\n" + ruleset(cluster, bridge, subnet, only_master)


def ruleset(cluster: str, bridge: str, subnet: str, only_master: str | None = None) -> str:
    """The cluster's nftables table: NAT to the host's networks, forwarding, and with
    `only_master` the rule that keeps the host off the workers.

    Forwarding: the nodes may open connections out; from elsewhere only replies come in
    (the host is no router into the cluster network). The chain's policy stays accept and
    the drop names the bridge: a drop policy in a base chain would drop every forwarded
    packet on this machine, other bridges' and other clusters' too."""
    table = nft_table(cluster)
    return f"""
table ip {table} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {subnet} ip daddr != {subnet} masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname "{bridge}" accept
    oifname "{bridge}" ct state established,related accept
    oifname "{bridge}" drop
  }}{_isolation(bridge, only_master)}
}}
"""


def _isolation(bridge: str, only_master: str | None) -> str:
    """access: via_master — the host may open connections to the master only, as a
    laptop reaches a cloud cluster through the master's floating IP. Replies to
    connections the nodes open (package mirrors on the host) still pass."""
    if not only_master:
        return ""
    return f"""
  chain output {{
    type filter hook output priority filter; policy accept;
    oifname "{bridge}" ip daddr != {only_master} ct state new reject
  }}"""


def network_down(cluster: str, bridge: str) -> None:
    with file_lock(NETWORK_LOCK):  # with network_up's check and load (above)
        sh("nft", "delete", "table", "ip", nft_table(cluster), check=False, quiet=True)
        sh("ip", "link", "del", bridge, check=False, quiet=True)
        forwarding_restored()
    log(f"network {bridge} removed")


# The nodes reach the host's networks through it: IPv4 forwarding, a host-wide switch.
# Turned on by the first cluster when it was off (the mark says so), and off again by the
# last cluster's `down`; left alone when it was on before (a router, Docker, a VM host).
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
FORWARD_MARK = Path("/var/lib/deployer/ip_forward-was-off")
NETWORK_LOCK = Path("/var/lib/deployer/network.lock")  # held while a table and the switch change together


def forwarding_on() -> None:
    if IP_FORWARD.read_text().strip() != "1":
        FORWARD_MARK.parent.mkdir(parents=True, exist_ok=True)
        FORWARD_MARK.touch()
        IP_FORWARD.write_text("1\n")


def forwarding_restored() -> None:
    if not FORWARD_MARK.exists():
        return
    proc = sh("nft", "list", "tables", check=False, quiet=True)
    if proc.returncode != 0 or f"ip {TABLE_PREFIX}" in proc.stdout:  # another cluster still needs it (or cannot tell)
        return
    IP_FORWARD.write_text("0\n")
    FORWARD_MARK.unlink(missing_ok=True)


# -- nodes --------------------------------------------------------------------------
def nft_table_exists(cluster: str) -> bool:
    """Whether the cluster's table is there; DriverError when nft cannot tell (any other
    failure than "No such file or directory" must not read as "gone": `down` trusts it)."""
    proc = sh("nft", "list", "table", "ip", nft_table(cluster), check=False, quiet=True)
    if proc.returncode == 0:
        return True
    if "No such file or directory" in proc.stderr:
        return False
    raise DriverError(f"[lxc] cannot tell whether nftables table ip {nft_table(cluster)} exists: "
                      f"`nft list table` failed ({proc.returncode}): {proc.stderr.strip() or 'no message'}")
