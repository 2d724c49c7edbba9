"""Ansible filters that hand Slurm decisions to deployer/slurm.py (one source of truth).

The slurm role's templates call these with the nodes' raw facts (its slurm-node-facts
helper's JSON); the decisions themselves are unit-tested on recorded output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The deployer of the tree these roles belong to (a checkout: ansible/filter_plugins ->
# the repository root), before one installed beside Ansible: a second checkout (a git
# worktree) run with the first's editable install must not judge by the first's code.
# Installed as a wheel the roles sit in deployer/_assets/, with no package beside them.
_TREE = Path(__file__).resolve().parents[2]
if (_TREE / "deployer" / "__init__.py").is_file():
    sys.path.insert(0, str(_TREE))

from deployer import slurm  # noqa: E402 - after the path above


def _errors(fn):
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, KeyError) as e:
            from ansible.errors import AnsibleFilterError

            raise AnsibleFilterError(f"slurm: {e}") from None

    return wrapped


def facts(results):
    """The helper's loop results (one per node, delegated) → {node: facts}."""
    return {r["item"]: json.loads(r["stdout"]) for r in results}


def node_line(all_facts, name, addr, gpus=0):
    return slurm.node_line(name, addr, dict(all_facts[name]), int(gpus))


def gres_line(all_facts, name, gpus):
    return slurm.gres_line(name, dict(all_facts[name]), int(gpus)) or ""


def plugins(all_facts):
    return slurm.plugins({k: dict(v) for k, v in dict(all_facts).items()})


def not_ready(sinfo, names):
    return slurm.not_ready(str(sinfo), list(names))


class FilterModule:
    def filters(self):
        return {
            "deployer_slurm_facts": _errors(facts),
            "deployer_slurm_node_line": _errors(node_line),
            "deployer_slurm_gres_line": _errors(gres_line),
            "deployer_slurm_plugins": _errors(plugins),
            "deployer_slurm_not_ready": _errors(not_ready),
        }
