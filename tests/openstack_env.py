"""A test's own OpenStack client configuration: its clouds.yaml and nothing of the machine's.

openstacksdk fixes its clouds.yaml search path (cwd, ~/.config/openstack, /etc/openstack, and
$OS_CLIENT_CONFIG_FILE first) once, when `openstack.config.loader` is first imported. Were that
first import to happen inside a test after HOME and OS_CLIENT_CONFIG_FILE point at the test's
tmp_path, every later test in the process would read that test's clouds.yaml: in one pytest
run over unit and cloud tests, the test cloud's own admin login went to a fake cloud's
long-gone port (CI, 2026-11-27). So the loader is imported here, at collection, with the
machine's environment, and each test only swaps the module's lists for its lifetime.
"""

from __future__ import annotations

import os
from pathlib import Path

from openstack.config import loader


def isolate(monkeypatch, tmp_path: Path, clouds_yaml: Path | None = None) -> Path:
    """No OS_* variable, clouds.yaml or secure.yaml of the machine is seen; the client reads
    `clouds_yaml` (default tmp_path/clouds.yaml) and runs with tmp_path as HOME and cwd."""
    for key in list(os.environ):
        if key.startswith("OS_"):
            monkeypatch.delenv(key)
    clouds_yaml = clouds_yaml or tmp_path / "clouds.yaml"
    monkeypatch.setenv("OS_CLIENT_CONFIG_FILE", str(clouds_yaml))
    monkeypatch.setenv("OS_CLIENT_SECURE_FILE", str(tmp_path / "secure.yaml"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/openstack/clouds.yaml
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / ".config"))
    monkeypatch.chdir(tmp_path)  # no ./clouds.yaml
    monkeypatch.setattr(loader, "CONFIG_FILES", [])
    monkeypatch.setattr(loader, "SECURE_FILES", [])
    return clouds_yaml
