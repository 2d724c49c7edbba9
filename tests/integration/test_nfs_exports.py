"""The NFS server role's export on a real Debian 12 node: the package installs, the
exports directory is made and the export written, as far as a container allows (the
kernel here has no nfsd, so the server itself is not started; the whole role with a
volume runs on the emulated VMs of tests/vm and on OpenStack).

On the code before the fix the template task failed: Debian's nfs-kernel-server ships no
/etc/exports.d and Ansible's template module makes no parent directory.
"""

from __future__ import annotations

import pytest

from .conftest import NAME

pytestmark = pytest.mark.integration

PLAY = """\
---
- name: NFS export, without starting nfsd
  hosts: {host}
  become: true
  gather_facts: false
  tasks:
    - name: Install the NFS server's package (its service may not start in a container)
      ansible.builtin.apt:
        name: "{{{{ nfs_server_packages }}}}"
        state: present
      vars:
        nfs_server_packages: [nfs-kernel-server]
    - name: The role's export tasks
      ansible.builtin.include_role:
        name: nfs_server
        tasks_from: export.yml
"""


def test_the_export_is_written_on_a_debian_node(local_cluster, tmp_path):
    from deployer.tools.ansible import run_playbook

    host = f"{NAME}-worker-1"
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(host=host))
    ssh = lambda *argv: local_cluster.deployer("ssh", host, "--", *argv)  # noqa: E731
    assert ssh("test", "-e", "/etc/exports.d").returncode != 0, "the package ships no exports directory"
    try:
        result = run_playbook(local_cluster.state / "inventory" / "hosts.yml", tmp_path / "run", playbook=str(play), limit=[host])
        assert not result.failures, result.failures
        text = ssh("cat", "/etc/exports.d/deployer.exports").stdout
        cidr = local_cluster.cluster_output().cluster_cidr
        assert f"/shared {cidr}(rw,sync,no_subtree_check,root_squash)" in text, text
    finally:  # the shared cluster's node as it was
        ssh("sh", "-c", "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq nfs-kernel-server >/dev/null; rm -rf /etc/exports.d")
