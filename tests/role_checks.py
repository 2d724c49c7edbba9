"""Checks every Ansible role of this repository should pass, shared by the roles' tests."""

from __future__ import annotations

from pathlib import Path

import yaml

ROLE_FILES = ("defaults/main.yml", "tasks/main.yml", "handlers/main.yml", "meta/main.yml", "meta/argument_specs.yml")


def assert_layout_and_defaults(role: Path, prefix: str, unspecified: set[str], *, described: bool = False) -> dict:
    """The role's standard files exist; every default carries the role's prefix and is in
    meta/argument_specs.yml (with a description when `described`), except `unspecified`
    (secrets: the argument check would print them). Returns the argument spec's options."""
    for f in ROLE_FILES:
        assert (role / f).is_file(), f
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text())
    spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for name in defaults:
        assert name.startswith(prefix)
        if name not in unspecified:
            assert name in spec, name
            if described:
                assert spec[name].get("description"), name
    return spec
