"""Test tiers (README, "Tests"):

- fast: `pytest -m "not integration and not slow and not cloud and not vm"` (`make fast`): no root, no cluster;
  real parts only where they take seconds (Terraform's parser, a two-task ansible-runner
  play on localhost, a stand-in sshd); ~80 s on two cores, most of it real subprocesses waited for.
- slow: heavier real parts that need no root (mpirun + torch benchmarks, Prometheus and
  its exporters, Ansible rendering every role, ansible-lint); `make unit` runs both.
- cloud: a real OpenStack control plane on 127.0.0.1 (root; tests/cloud/testcloud.py),
  started once for the run; every test under tests/cloud.
- integration: a real local cluster (root, LXC); every test under tests/integration.
- vm: two QEMU-emulated VMs booted as Nova boots servers (root; tests/vm), for the roles
  that need a kernel of their own; `make vm-tests`, not `make test`.

Order: a test marked `destroys_cluster` (it tears the shared local cluster down) runs
after every other test; nothing else depends on the order of files or names.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.replace("\\", "/")
        if "tests/integration/" in path:
            item.add_marker(pytest.mark.integration)
        if "tests/cloud/" in path:
            item.add_marker(pytest.mark.cloud)
        if "tests/vm/" in path:
            item.add_marker(pytest.mark.vm)
    # Stable: the destroying tests keep their own order, after all the others.
    items.sort(key=lambda item: item.get_closest_marker("destroys_cluster") is not None)
