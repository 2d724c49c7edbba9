"""The NVIDIA driver role's package choice on the local Debian 12 nodes, with apt's
simulation mode: the non-free components are really enabled and read, and apt really
resolves the packages the role names (nvidia-driver + nvidia-smi, or a Tesla branch) —
only the installation itself is simulated, since no node here has an NVIDIA GPU.
"""

from __future__ import annotations

import json

import pytest
import yaml

from .conftest import NAME

pytestmark = pytest.mark.integration

PLAY = """\
---
- name: Driver packages, simulated
  hosts: {host}
  become: true
  gather_facts: true
  tasks:
    - name: Choose and simulate the packages
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: packages.yml
      vars:
        nvidia_driver_simulate: true
        nvidia_driver_branch: {branch}
    - name: Keep apt's answer
      ansible.builtin.copy:
        content: "{{{{ {{'packages': nvidia_driver_packages, 'apt': nvidia_driver_apt, 'kernel': nvidia_driver_kernel,
                       'kernel_apt': nvidia_driver_kernel_apt | default(none),
                       'held': nvidia_driver_hold}} | to_json }}}}"
        dest: "{out}"
        mode: "0644"
      delegate_to: localhost
      become: false
"""


# Each set with the CUDA driver library: without it torch sees no GPU where nvidia-smi works.
@pytest.mark.parametrize(("branch", "expect"), [
    (None, ["nvidia-driver", "nvidia-smi", "libcuda1"]),
    (535, ["nvidia-tesla-535-driver", "nvidia-tesla-535-smi", "libnvidia-tesla-535-cuda1"]),
    (470, ["nvidia-tesla-470-driver", "nvidia-tesla-470-smi", "libnvidia-tesla-470-cuda1"]),
])
def test_driver_packages_resolve_on_debian_12(local_cluster, tmp_path, branch, expect):
    from deployer.tools.ansible import run_playbook

    host = f"{NAME}-worker-1"
    out = tmp_path / "apt.json"
    play = tmp_path / "play.yml"
    play.write_text(PLAY.format(host=host, branch="null" if branch is None else branch, out=out))
    inv = local_cluster.state / "inventory" / "hosts.yml"
    assert yaml.safe_load(inv.read_text()), inv
    result = run_playbook(inv, tmp_path / "run", playbook=str(play), limit=[host])
    assert not result.failures, result.failures
    answer = json.loads(out.read_text())
    assert answer["packages"][:3] == expect
    sim = answer["apt"]["stdout"]
    # The containers run this host's kernel: its own headers where the archive has them (a
    # Debian kernel), else (this CI machine's kernel is not Debian's) the kernel and its
    # headers upgraded together, simulated, before the driver.
    kernel = local_cluster.deployer("ssh", host, "--", "uname", "-r").stdout.strip()
    policy = local_cluster.deployer("ssh", host, "--", "apt-cache", "policy", f"linux-headers-{kernel}").stdout
    if "Candidate:" in policy and "Candidate: (none)" not in policy:
        assert answer["kernel"]["upgrade"] is False and f"linux-headers-{kernel}" in answer["packages"]
        assert f"Inst linux-headers-{kernel} " in sim or f"linux-headers-{kernel} is already" in sim, sim[-2000:]
    else:
        assert answer["kernel"] == {"packages": ["linux-image-amd64", "linux-headers-amd64"], "upgrade": True}
        assert "Inst linux-headers-" in answer["kernel_apt"]["stdout"] and "Inst linux-image-" in answer["kernel_apt"]["stdout"]
    for package in expect:
        assert f"Inst {package} " in sim, sim[-2000:]  # apt resolved it, dependencies and all
    assert answer["apt"]["changed"]  # would install; nothing was
    # Held against unattended upgrades: the driver's packages, never a kernel's headers (DKMS needs the next ones)
    assert set(expect) <= set(answer["held"]) and not [p for p in answer["held"] if p.startswith(("linux-", "firmware-"))]
    held = local_cluster.deployer("ssh", host, "--", "dpkg", "--get-selections", expect[0]).stdout
    assert "hold" not in held  # simulated: nothing held either
    p = local_cluster.deployer("ssh", host, "--", "dpkg-query", "-W", expect[0])
    assert p.returncode != 0  # simulation only: the package is not installed
    # The security suite's non-free lists are read: the driver's security releases are in reach.
    p = local_cluster.deployer("ssh", host, "--", "apt-cache", "policy", "nvidia-driver")
    assert "bookworm-security/non-free" in p.stdout, p.stdout
