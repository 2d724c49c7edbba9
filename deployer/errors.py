"""The error family and its exit codes (0 done, 1 failed, 2 bad input, 130 interrupted).

Every error the user can meet is one of these: `cli.run` turns it into one line on
stderr and the exit code, with a traceback only under --debug.
"""

from __future__ import annotations

from pathlib import Path


class DeployerError(Exception):
    """Base class: an operation failed (exit 1)."""

    exit_code = 1

    def __init__(self, message: str, *, log: Path | None = None):
        super().__init__(message)
        self.message = message
        self.log = log

    def __str__(self) -> str:
        if self.log:
            return f"{self.message} (full log: {self.log})"
        return self.message


class UsageError(DeployerError):
    """Bad input or usage: one line naming the fix; nothing was changed (exit 2)."""

    exit_code = 2


class PreflightError(UsageError):
    """The environment cannot host what the spec asks for (exit 2, nothing created)."""


class OperationFailed(DeployerError):
    """A stage (Terraform, Ansible, the smoke check, a benchmark) failed (exit 1)."""


class RecordError(DeployerError):
    """A state record that cannot be read (damaged, or from another version): exit 1."""


class LockedError(DeployerError):
    """Another deployer process is changing this cluster."""

    exit_code = 1


class NoLongerExpired(DeployerError):
    """`gc` listed the cluster as expired, but its lifetime was extended (or removed) since:
    it is kept (exit 1 only when nothing else went right)."""
