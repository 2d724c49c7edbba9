"""Nothing secret is readable by an unprivileged user on any node (issue 44, item 3).

The shared cluster was made with a credential planted in the host's pip configuration
(conftest.PLANTED_ENV: a user:token in a pip option's URL, as `PIP_INDEX_URL=https://user:
token@…` would carry one). On each node, as `nobody`, every file it can read (the shared dir
included) and every process's command line is searched for the token; root's own pip.conf
and the cluster user's copy hold it (so it was carried, and both still reach the index),
0600 each. On the host, the nodes' upper dirs are searched the same way.

The apt side (credentials of the host's sources and proxies, moved to auth.conf.d) is
checked in tests/unit/test_local_secrets.py: planting it here would mean changing this
machine's /etc/apt and making a new image."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from .conftest import PIP_MARKER

pytestmark = pytest.mark.integration

# Files over this size are a node's wheels and venvs (torch): no configuration is that big.
MAX_SIZE = "-64M"
# The token as a pattern: the search's own command line must not hold the token itself.
PATTERN = "itest-pip-token-[0-9a-f]{12}"


def _attach(node: str, script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["lxc-attach", "-n", node, "--", "sh", "-c", script], capture_output=True, text=True, timeout=timeout)


def _readable_holding(top: str = "/", processes: bool = True) -> str:
    """A shell script, run as nobody: each file under `top` it can read that holds the token,
    and (`processes`) each process whose command line holds it."""
    script = (
        f"find {shlex.quote(top)} \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o "
        f"-type f -readable -size {MAX_SIZE} -print0 2>/dev/null | xargs -0 -r grep -l -s -E -e '{PATTERN}' -- ; "
    )
    if processes:
        script += f"for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\" 2>/dev/null | grep -q -E -e '{PATTERN}' && echo \"$f\"; done; "
    return script + "true"


def test_no_node_user_but_root_and_the_cluster_user_reads_a_host_credential(local_cluster):
    assert re.fullmatch(PATTERN, PIP_MARKER)
    cluster = local_cluster.cluster_output()
    user = cluster.ssh_user
    files = f"/root/.config/pip/pip.conf ~{user}/.config/pip/pip.conf"
    for name in cluster.names:
        # Carried: root's own pip.conf has it, and the cluster user's copy (the common role), 0600 each.
        carried = _attach(name, f"stat -c '%U %a' {files}; grep -c -F -e {shlex.quote(PIP_MARKER)} {files}")
        lines = carried.stdout.splitlines()
        assert lines[:2] == ["root 600", f"{user} 600"], f"{name}: {carried.stdout} {carried.stderr}"
        assert [line.rsplit(":", 1)[1] for line in lines[2:]] == ["1", "1"], f"{name}: the planted credential was not carried: {lines}"
        # /etc/pip.conf still names the index, without the credential.
        assert "https://pypi.invalid/pypi" in _attach(name, "cat /etc/pip.conf").stdout
        # Everything else: nothing an unprivileged user reads holds it, the shared dir included.
        found = _attach(name, f"runuser -u nobody -- sh -c {shlex.quote(_readable_holding())}", timeout=1200)
        assert found.returncode == 0, f"{name}: {found.stderr}"
        assert found.stdout.split() == [], f"{name}: readable by nobody and holding the planted credential: {found.stdout}"


def test_the_host_shows_no_host_credential_of_a_node_to_its_unprivileged_users(local_cluster):
    # The node's own files on the host (its overlay's upper dir), as the host's unprivileged users see them.
    for name in local_cluster.cluster_output().names:
        found = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", _readable_holding(f"/var/lib/lxc/{name}/upper", False)],
                               capture_output=True, text=True, timeout=600)
        assert found.returncode == 0, found.stderr
        assert found.stdout.split() == [], f"{name}: readable by nobody on the host and holding the planted credential: {found.stdout}"


def test_a_set_uid_file_in_the_shared_dir_gives_no_node_root(local_cluster):
    # The nodes are privileged containers (docs/architecture.md, "Security model"): the
    # shared dir, bind-mounted from the host, is nosuid and nodev on every node.
    cluster = local_cluster.cluster_output()
    shared = cluster.shared_dir
    planted = f"{shared}/.itest-suid-id"
    made = _attach(cluster.master.name, f"cp /usr/bin/id {planted} && chmod 4755 {planted}")
    assert made.returncode == 0, made.stderr
    try:
        for name in cluster.names:
            opts = _attach(name, f"findmnt -n -o OPTIONS --target {shared}").stdout
            assert {"nosuid", "nodev"} <= set(opts.strip().split(",")), (name, opts)
            # As nobody, the set-uid copy of id(1) runs as nobody: the bit is ignored.
            ran = _attach(name, f"setpriv --reuid=65534 --regid=65534 --clear-groups {planted} -u")
            assert ran.returncode == 0 and ran.stdout.strip() == "65534", (name, ran.stdout, ran.stderr)
    finally:
        _attach(cluster.master.name, f"rm -f {planted}")
