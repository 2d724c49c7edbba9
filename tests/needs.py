"""A test that needs a tool the machine lacks: a skip on a developer's machine, a failure in
CI (.ci/run sets CI), where `make` installs every tool and a skip would hide a test."""

from __future__ import annotations

import os

import pytest


def missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI installs it (make deps), so this is a broken install, not a skip")
    pytest.skip(reason)
