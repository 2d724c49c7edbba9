"""Ansible through ansible-runner: live per-host progress, every event kept as JSON lines."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .. import signals, ui
from ..errors import OperationFailed
from ..paths import ansible_dir


@dataclass
class PlayResult:
    ok: Counter[str] = field(default_factory=Counter)
    changed: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    # What the play handed over with set_stats (per_host: false), e.g. bytes_from_outside.
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def total_changed(self) -> int:
        return sum(self.changed.values())


def strategy_env() -> dict[str, str]:
    """Mitogen's strategy unless DEPLOYER_ANSIBLE_STRATEGY says otherwise (e.g. `linear`).

    With Ansible's own linear strategy every task on every node is a fresh SSH command
    and a fresh Python on the node; on 8 nodes the tasks' fan-out, not their work, was
    most of an `up` (ansible 200 s -> 112 s with Mitogen, measured side by side;
    docs/performance.md). Mitogen keeps one Python per node and
    sends it the modules over the SSH connection it already has.
    """
    chosen = os.environ.get("DEPLOYER_ANSIBLE_STRATEGY", "mitogen_linear")
    if not chosen.startswith("mitogen"):
        return {"ANSIBLE_STRATEGY": chosen}
    import ansible_mitogen

    plugins = Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": chosen}


# What ansible-playbook may see of the controller's environment. ansible-runner copies
# os.environ into the play's environment and writes it to artifacts/<id>/command, in the
# run's logs: an OS_PASSWORD from an openrc file, a token, would land on disk. Nothing in
# the roles reads the controller's environment; ANSIBLE_* are Ansible's own settings and
# DEPLOYER_* the deployer's (the warm-Jinja callback reads one). PYTHONPATH: the filter
# plugins import the deployer that runs them (a checkout run with PYTHONPATH=<checkout>
# beside another one's editable install decides with its own code, not the other's).
KEPT_ENVIRONMENT = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH"}


def _kept(key: str) -> bool:
    return key in KEPT_ENVIRONMENT or key.startswith(("LC_", "ANSIBLE_", "DEPLOYER_"))


@contextlib.contextmanager
def scrubbed_environ() -> Iterator[None]:
    """os.environ holds only what Ansible needs for the block (KEPT_ENVIRONMENT)."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if not _kept(k)]:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class Canceller:
    """ansible-runner's cancel_callback: True once an interrupt set `flag`.

    On cancel the runner SIGKILLs ansible-playbook's process group, and that is not all
    it started: Mitogen's mux process moves to a session of its own and waits for a
    socket that the killed workers' children still hold (seen: alive, parent 1, after
    the deployer had exited). So the first time it answers True it takes note of every
    process under the play, and `stop_leftovers` ends those the runner's kill missed."""

    def __init__(self, flag: signals.Flag):
        self.flag = flag
        self.before = {p.pid for p in psutil.Process().children()}  # not the play's
        self.doomed: list[psutil.Process] = []

    def __call__(self) -> bool:
        if self.flag.raised is None:
            return False
        if not self.doomed:
            for child in psutil.Process().children():
                if child.pid not in self.before:
                    with contextlib.suppress(psutil.Error):
                        self.doomed += [child, *child.children(recursive=True)]
        return True

    def stop_leftovers(self) -> None:
        alive = [p for p in self.doomed if p.is_running()]
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(alive, timeout=3)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()


def close_connections(control_dir: Path) -> None:
    """Close the SSH master connections a stopped play left (ControlPersist keeps them in
    the background, and with them what runs on the nodes): `ssh -O exit` on each socket."""
    for sock in control_dir.glob("*") if control_dir.is_dir() else ():
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "deployer-node"],
                       capture_output=True, timeout=10, check=False)


def run_playbook(
    inventory: Path, run_dir: Path, playbook: str = "site.yml", extravars: dict[str, Any] | None = None, limit: list[str] | None = None,
    skip_tags: list[str] | None = None,
) -> PlayResult:
    """Run the playbook on every host, or on `limit` only (roles that need the master
    delegate to it, so a worker configured alone still gets the cluster's key pair);
    plays and tasks tagged with one of `skip_tags` are left out."""
    import ansible_runner

    # ansible-playbook lives beside this interpreter (a venv that may not be activated).
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    adir = ansible_dir()
    (run_dir / "ansible").mkdir(parents=True, exist_ok=True)
    result = PlayResult()
    events_log = open(run_dir / "ansible-events.jsonl", "a")
    task_seen: set[str] = set()
    spinner = ui.err.status("ansible: starting") if ui.err.is_terminal else None
    if spinner:
        spinner.start()

    def on_event(ev: dict[str, Any]) -> bool:
        events_log.write(json.dumps(ev, default=str) + "\n")
        kind = ev.get("event", "")
        data = ev.get("event_data", {})
        host = data.get("host", "")
        task = data.get("task", "")
        if kind == "playbook_on_task_start" and task and task not in task_seen:
            task_seen.add(task)
            line = f"ansible: {data.get('play', '')} / {task}"
            if spinner:
                spinner.update(line)
            else:
                ui.info(f"  {line}")
        elif kind == "runner_on_ok":
            result.ok[host] += 1
            if data.get("res", {}).get("changed"):
                result.changed[host] += 1
        elif kind == "playbook_on_stats":
            result.stats = data.get("artifact_data") or {}
            # Ansible's own count: a no_log task's result is censored in its event (no
            # `changed` there), the play's recap still counts it.
            if isinstance(data.get("changed"), dict):
                result.changed = Counter({h: int(n) for h, n in data["changed"].items() if n})
        elif kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res", {})
            msg = res.get("msg") or res.get("stderr") or res.get("stdout") or "failed"
            result.failures.append(f"{host}: {task}: {' '.join(str(msg).split())[:300]}")
        return True  # keep ansible-runner's own artifacts too

    env = {
        "ANSIBLE_CONFIG": str(adir / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(adir / "roles"),
        "ANSIBLE_FILTER_PLUGINS": str(adir / "filter_plugins"),
        # Loads Jinja's filter and test plugins in the controller before workers fork
        # (callback_plugins/deployer_warm_jinja.py says why); ansible-runner appends its own.
        "ANSIBLE_CALLBACK_PLUGINS": str(adir / "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "deployer_warm_jinja",
        # ansible-runner sets ANSIBLE_HOST_KEY_CHECKING=False unless told otherwise, which
        # beats ansible.cfg and makes Mitogen's ssh ignore the pinned known_hosts.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        # ControlPath in the state dir: short enough for the socket name limit, private to us.
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(run_dir.parent.parent / "cp"),
        **strategy_env(),
    }
    # ansible-runner polls cancel_callback between reads of the play's output (every
    # pexpect_timeout seconds; it reads env/settings, and a missing file resets what is
    # passed in code): a Ctrl-C sets the flag, and the runner kills ansible-playbook's whole
    # process group. Raising KeyboardInterrupt inside the runner would leave it running.
    (run_dir / "ansible" / "env").mkdir(exist_ok=True)
    (run_dir / "ansible" / "env" / "settings").write_text("pexpect_timeout: 1\n")
    try:
        with signals.Flag() as interrupted, scrubbed_environ():
            cancel = Canceller(interrupted)
            r = ansible_runner.run(
                private_data_dir=str(run_dir / "ansible"),
                project_dir=str(adir),
                playbook=str(adir / playbook),
                inventory=str(inventory),
                envvars=env,
                extravars=extravars or {},
                limit=",".join(limit) if limit else None,
                skip_tags=",".join(skip_tags) if skip_tags else None,
                event_handler=on_event,
                cancel_callback=cancel,
                quiet=True,
                suppress_env_files=True,
            )
    finally:
        events_log.close()
        if spinner:
            spinner.stop()
    if r.status == "canceled":
        cancel.stop_leftovers()
        close_connections(Path(env["ANSIBLE_SSH_CONTROL_PATH_DIR"]))
        raise KeyboardInterrupt(interrupted.raised)  # exit 130; the next `up` resumes
    if interrupted.raised:  # after the runner's last look: the play ended anyway; stop here all the same
        raise KeyboardInterrupt(interrupted.raised)
    if r.status != "successful" or r.rc != 0:
        tail = (r.stdout.read().strip().splitlines() or [""])[-1] if r.stdout else ""
        first = result.failures[0] if result.failures else f"ansible-runner {r.status} (rc {r.rc}): {tail}"
        more = f" (+{len(result.failures) - 1} more)" if len(result.failures) > 1 else ""
        raise OperationFailed(f"configuration failed: {first}{more}", log=run_dir / "ansible-events.jsonl")
    return result
