"""Load Ansible's Jinja filter and test plugins once, in the controller, before any task runs.

Ansible runs every task on every node in a worker process forked from the controller.
ansible-core loads the filter and test plugins (every plugin file on the configured
paths, a wrapper per name) the first time a template uses a filter or test, and caches
them in the process that asked. The controller itself never asks before it forks, so
every worker loaded them again: measured on 8 local nodes, ~0.1-0.4 s of CPU per
task per node, 65 % of the workers' time in a `--reconfigure`. Loaded here, in the
controller, at the start of the playbook, every worker inherits them through fork.

It changes no output and no result; DEPLOYER_WARM_JINJA=0 switches it off (to measure).
"""

from __future__ import annotations

import os

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

DOCUMENTATION = """
    name: deployer_warm_jinja
    type: aggregate
    short_description: load Jinja filter and test plugins before workers fork
    description:
      - Loads every Jinja filter and test plugin in the controller at playbook start, so
        the worker processes forked for each task inherit them instead of loading them again.
    requirements:
      - enabled in callbacks_enabled (deployer/tools/ansible.py does)
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "deployer_warm_jinja"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook) -> None:
        if os.environ.get("DEPLOYER_WARM_JINJA", "1") == "0":
            return
        for loader in (filter_loader, test_loader):
            for _ in loader.all():  # fills the loader's per-process cache of wrappers
                pass
