"""Ansible filters that hand baked-image decisions to deployer/image_manifest.py (one source
of truth): whether a node keeps what its image holds, and the one line that says why not.
They run on the controller, inside the venv deployer runs from.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

try:
    import deployer  # noqa: F401 - installed (editable or wheel) beside Ansible
except ImportError:  # run straight from a checkout: ansible/filter_plugins -> repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deployer import image_manifest


def dpkg_packages(lines):
    """The common role's first task's lines -> the packages installed (its `@@` lines left out).

    A Python filter, not `reject('match', '@@')`: group_vars/all.yml's variables are
    rendered again wherever they are read, on every node, and a Jinja test per line of a
    few hundred went through Ansible's plugin wrappers each time (~10 % of the controller's
    CPU in an 8-node `up`, profiled)."""
    return [line for line in lines or () if not str(line).startswith("@@")]


def dpkg_tagged(lines, tag):
    """What follows `@@<tag> ` on the first such line of those lines ('' for none, or nothing)."""
    for line in lines or ():
        line = str(line)
        if line == f"@@{tag}" or line.startswith(f"@@{tag} "):
            return line[len(tag) + 3:]
    return ""


def _manifest(data):
    return image_manifest.Manifest.from_dict(data) if data else None


def manifest(text):
    """The manifest file's text (the common role's first task reads it) -> a dict; {} for none."""
    try:
        m = image_manifest.parse(str(text or ""))
    except ValueError as e:
        from ansible.errors import AnsibleFilterError

        raise AnsibleFilterError(f"baked image: {e}") from None
    return asdict(m) if m else {}


def unfit(data, roles, gpus=0, driver_branch=None):
    """'' when the node keeps what the image holds (or has no baked image), else why not."""
    branch = int(driver_branch) if driver_branch not in (None, "", "None") else None
    return image_manifest.unfit(_manifest(data), roles=str(roles), gpus=int(gpus), driver_branch=branch) or ""


def torch_unfit(data, requirement):
    """'' when the image's training environment is the build the cluster gets, else why not."""
    return image_manifest.torch_unfit(_manifest(data), str(requirement)) or ""


class FilterModule:
    def filters(self):
        return {
            "deployer_dpkg_packages": dpkg_packages,
            "deployer_dpkg_tagged": dpkg_tagged,
            "deployer_image_manifest": manifest,
            "deployer_image_unfit": unfit,
            "deployer_image_torch_unfit": torch_unfit,
        }
