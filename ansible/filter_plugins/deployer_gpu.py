"""Ansible filters that hand GPU decisions to deployer's own Python (one source of truth).

The torch build a cluster gets (deployer/gpu_runtime.py + gpu_runtime.yaml), the node's
virtualization mode and the after-install verdict (deployer/gpu_facts.py) are decided by
code the unit tests cover on recorded outputs; these filters only move the nodes' raw
command output into it. They run on the controller, inside the venv deployer runs from.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The deployer of the tree these roles belong to (a checkout: ansible/filter_plugins ->
# the repository root), before one installed beside Ansible: a second checkout (a git
# worktree) run with the first's editable install must not judge by the first's code.
# Installed as a wheel the roles sit in deployer/_assets/, with no package beside them.
_TREE = Path(__file__).resolve().parents[2]
if (_TREE / "deployer" / "__init__.py").is_file():
    sys.path.insert(0, str(_TREE))

from deployer import gpu_facts, gpu_runtime  # noqa: E402 - after the path above


def torch_choice(hosts, hostvars, fact="training_runtime_gpu_query", torch=None, cuda=None, python=None):
    """The cluster's torch build from every GPU host's nvidia-smi query (registered as `fact`).

    Returns Choice.as_dict() plus ok=True, or {ok: False, reason} when nothing fits.
    """
    gpus = []
    for host in hosts:
        result = hostvars[host].get(fact) or {}
        gpus += gpu_runtime.parse_smi(host, str(result.get("stdout", "")))
    try:
        py = tuple(int(p) for p in str(python).split(".")[:2]) if python else None
        return {"ok": True, **gpu_runtime.choose(gpus, torch=torch or None, cuda=cuda or None, python=py).as_dict()}
    except (gpu_runtime.NoFit, ValueError) as e:
        return {"ok": False, "reason": str(e)}


def gpu_virtualization(smi_q):
    return gpu_facts.virtualization(str(smi_q))


def pci_virtualization(lspci):
    return gpu_facts.pci_virtualization(str(lspci))


def driver_packages(distribution, branch=None):
    try:
        return gpu_facts.driver_packages(str(distribution), int(branch) if branch not in (None, "", "None") else None)
    except ValueError as e:
        from ansible.errors import AnsibleFilterError

        raise AnsibleFilterError(str(e)) from None


def kernel_packages(kernel, architecture, running_headers_available):
    return gpu_facts.kernel_packages(str(kernel), str(architecture), bool(running_headers_available))


def nvswitch_count(lspci):
    return gpu_facts.nvswitch_count(str(lspci))


def fabricmanager_packages(distribution, driver_packages):
    try:
        return gpu_facts.fabricmanager_packages(str(distribution), [str(p) for p in driver_packages])
    except ValueError as e:
        from ansible.errors import AnsibleFilterError

        raise AnsibleFilterError(str(e)) from None


def fabricmanager_unavailable(distribution):
    return gpu_facts.fabricmanager_unavailable(str(distribution))


def fabric_ready(smi_q):
    return gpu_facts.fabric_ready(str(smi_q))


def driver_utils_package(dpkg_list):
    return gpu_facts.driver_utils_package(str(dpkg_list))


def gpu_check_problems(record, host, choice):
    return gpu_facts.check_problems(host, dict(record), dict(choice))


class FilterModule:
    def filters(self):
        return {
            "deployer_torch_choice": torch_choice,
            "deployer_gpu_virtualization": gpu_virtualization,
            "deployer_pci_virtualization": pci_virtualization,
            "deployer_gpu_check_problems": gpu_check_problems,
            "deployer_driver_packages": driver_packages,
            "deployer_driver_utils_package": driver_utils_package,
            "deployer_kernel_packages": kernel_packages,
            "deployer_nvswitch_count": nvswitch_count,
            "deployer_fabricmanager_packages": fabricmanager_packages,
            "deployer_fabric_ready": fabric_ready,
            "deployer_fabricmanager_unavailable": fabricmanager_unavailable,
        }
