"""Where the deployer's own files are: the Terraform modules, roles, benchmarks.

In a checkout (or an editable install) they sit beside the package; a wheel
carries them under deployer/_assets (see pyproject's force-include).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@cache
def assets_root() -> Path:
    for root in (_PKG / "_assets", _PKG.parent):
        if (root / "terraform" / "modules" / "design").is_dir():
            return root
    raise FileNotFoundError("deployer's terraform/ansible assets are missing; reinstall the package")


def terraform_dir() -> Path:
    return assets_root() / "terraform"


def ansible_dir() -> Path:
    return assets_root() / "ansible"
