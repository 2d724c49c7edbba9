"""A real OpenStack control plane on 127.0.0.1 for the tests: Keystone, Placement, Nova
(API, conductor, scheduler, a compute with the fake virt driver), Neutron (ML2 with an
agentless binding driver), Glance (file store) and Cinder (its fake volume driver), from
PyPI at pinned versions in one venv; MariaDB and RabbitMQ from Debian.

Nothing of it is a recording: every request the deployer sends is answered by the
services' own code, policies and database. What it has no hardware for is replaced where
the services themselves allow it (plugins/: the virt driver reports a GPU-like child
provider, the ML2 driver binds ports without an agent; Cinder's fake driver keeps
volumes in its database, each a sparse file so one can be made from an image).

    python -m tests.cloud.testcloud start   # prints the clouds.yaml path; `make cloud`
    python -m tests.cloud.testcloud stop

The venv is built once per machine, under DEPLOYER_TESTCLOUD_HOME
(/var/cache/deployer-testcloud), and rebuilt when a pin or a plugin changes; a running
cloud lives in a run directory (cloud.json: its processes, URLs, passwords).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOME = Path(os.environ.get("DEPLOYER_TESTCLOUD_HOME", "/var/cache/deployer-testcloud"))
VENV = HOME / "venv"
SHARED_RUN = HOME / "run"  # `make cloud`'s cloud, which the tests reuse when it runs
REGION = "RegionOne"
SERVICES_PROJECT = "service"
# The project and user the tests act as: a member, not an admin, as researchers are.
PROJECT, USER = "horovod", "researcher"
OTHER_PROJECT, OTHER_USER = "lab", "colleague"
START_TIMEOUT_S = 600


def log(msg: str) -> None:
    print(f"[testcloud {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the venv ------------------------------------------------------------------------------------


NOVA_SHIM = "from deployer_testcloud.virt import GPUFakeDriver  # noqa: F401\n"


def _stamp() -> str:
    h = hashlib.sha256(NOVA_SHIM.encode())
    for p in [HERE / "requirements.txt", HERE / "constraints.txt", *sorted((HERE / "plugins").rglob("*.py")),
              HERE / "plugins" / "pyproject.toml"]:
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def ensure_venv() -> Path:
    """The services' venv, built when missing or when a pin or plugin changed (~2 min)."""
    stamp = _stamp()
    marker = VENV / ".deployer-stamp"
    if marker.exists() and marker.read_text() == stamp:
        return VENV
    log(f"installing the OpenStack services into {VENV} (once per machine, about 2 minutes)")
    shutil.rmtree(VENV, ignore_errors=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["python3", "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin/python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    quiet = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    for args in (["-c", str(HERE / "constraints.txt"), "-r", str(HERE / "requirements.txt")],
                 ["--no-deps", str(HERE / "plugins")]):
        r = subprocess.run(pip + args, **quiet)
        if r.returncode:
            errors = "\n".join(line for line in r.stdout.splitlines() if not line.startswith("WARNING: Location"))
            raise RuntimeError(f"pip install {' '.join(args)} failed:\n{errors[-3000:]}")
    # Nova loads its virt driver only from its own package (nova.virt.<compute_driver>):
    # a one-line module there hands it the plugin's driver.
    site = next((VENV / "lib").glob("python3*/site-packages"))
    (site / "nova" / "virt" / "deployer_gpu_fake.py").write_text(NOVA_SHIM)
    # pip leaves the plugin's build dir in the source tree
    shutil.rmtree(HERE / "plugins" / "build", ignore_errors=True)
    for egg in (HERE / "plugins").glob("*.egg-info"):
        shutil.rmtree(egg, ignore_errors=True)
    marker.write_text(stamp)
    return VENV


# ---- the running cloud -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cloud:
    """What the tests need to talk to a running test cloud (cloud.json)."""

    run_dir: str
    ports: dict[str, int] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    ready: bool = False

    @property
    def auth_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['keystone']}/v3"

    @property
    def clouds_yaml(self) -> Path:
        return Path(self.run_dir) / "clouds.yaml"

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def save(self) -> None:
        p = Path(self.run_dir) / "cloud.json"
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(p)

    @classmethod
    def load(cls, run_dir: Path) -> Cloud | None:
        try:
            return cls(**json.loads((Path(run_dir) / "cloud.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def alive(self) -> bool:
        return self.ready and all(_running(pid) for pid in self.pids.values())

    def clouds(self) -> dict:
        """clouds.yaml entries: the admin, the project member the tests act as, and a
        member of another project."""
        def entry(user: str, project: str, password: str) -> dict:
            return {"auth": {"auth_url": self.auth_url, "username": user, "password": password, "project_name": project,
                             "user_domain_name": "Default", "project_domain_name": "Default"},
                    "region_name": REGION, "identity_api_version": 3}
        return {"clouds": {"testcloud-admin": entry("admin", "admin", self.passwords["admin"]),
                           "testcloud": entry(USER, PROJECT, self.passwords[USER]),
                           "testcloud-other": entry(OTHER_USER, OTHER_PROJECT, self.passwords[OTHER_USER])}}


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return True


class Launcher:
    """Starts the cloud's processes, each in its own process group, logs in the run dir."""

    def __init__(self, cloud: Cloud):
        self.cloud = cloud
        self.run = Path(cloud.run_dir)
        self.logs = self.run / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OS_", "VIRTUAL_ENV", "PYTHON"))}
        env["PATH"] = f"{VENV / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        return env | extra

    def spawn(self, name: str, argv: list[str], **env: str) -> subprocess.Popen:
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env(**env), start_new_session=True, cwd=self.run)
        out.close()
        self.cloud.pids[name] = p.pid
        self.cloud.save()
        return p

    def run_tool(self, name: str, argv: list[str], timeout: int = 600, **env: str) -> None:
        with open(self.logs / f"{name}.log", "ab") as out:
            r = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(**env),
                               cwd=self.run, timeout=timeout)
        if r.returncode:
            tail = (self.logs / f"{name}.log").read_text(errors="replace")[-2500:]
            raise RuntimeError(f"{' '.join(argv[:3])} failed (rc {r.returncode}); {self.logs / name}.log:\n{tail}")

    def serve(self, service: str, *configs: Path, prefix: str = "") -> None:
        self.spawn(service, [str(VENV / "bin/python"), "-m", "deployer_testcloud.serve", service, str(self.cloud.ports[service]),
                             prefix, *map(str, configs)])


def wait_for(what: str, check, timeout: float = 180, every: float = 0.5, procs: dict[str, int] | None = None):
    """Poll `check` until it returns a true value; fail early when a process died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except Exception as e:  # noqa: BLE001 (the service is still starting)
            last = e
        for name, pid in (procs or {}).items():
            if not _running(pid):
                raise RuntimeError(f"{name} exited while waiting for {what}")
        time.sleep(every)
    raise TimeoutError(f"{what} not ready within {timeout:.0f}s" + (f" (last: {last})" if last else ""))


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---- start and stop ----------------------------------------------------------------------------------


def start(run_dir: Path | None = None) -> Cloud:
    """Start a test cloud; on any failure what was started is stopped again."""
    from . import services

    ensure_venv()
    run = Path(run_dir or tempfile.mkdtemp(prefix="deployer-testcloud-"))
    run.mkdir(parents=True, exist_ok=True)
    os.chmod(run, 0o700)
    names = ["mysql", "epmd", "amqp", "rabbit_dist", *services.API_PORTS]
    cloud = Cloud(str(run), ports={n: free_port() for n in names},
                  passwords={n: secrets.token_hex(12) for n in ["admin", "service", USER, OTHER_USER]})
    cloud.save()
    began = time.monotonic()
    try:
        services.start_all(Launcher(cloud))
    except BaseException:
        log(f"start failed; the logs are in {run}/logs")
        stop(cloud, keep=True)
        raise
    cloud.ready = True
    cloud.save()
    import yaml

    cloud.clouds_yaml.write_text(yaml.safe_dump(cloud.clouds()))
    cloud.clouds_yaml.chmod(0o600)
    log(f"ready in {time.monotonic() - began:.0f}s: {cloud.clouds_yaml}")
    return cloud


def stop(cloud: Cloud, *, keep: bool = False) -> None:
    """Stop every process of the cloud (TERM, then KILL after 15 s), then remove its run
    dir (with `keep`, all but its logs: a failed start keeps them to read, not its
    database or keys)."""
    groups = list(cloud.pids.items())[::-1]  # the services first, the database and broker last
    for _, pid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for _, pid in groups:
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
    run = Path(cloud.run_dir)
    for entry in run.iterdir() if run.exists() else ():
        if keep and entry.name == "logs":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    if not keep:
        shutil.rmtree(run, ignore_errors=True)


def watch(run_dir: Path, pid: int) -> None:
    """Stop the cloud in `run_dir` once process `pid` (the test run that started it) is
    gone without stopping it (killed, timed out): no database, broker or service is left
    running for the next run to meet."""
    while _running(pid) and (Path(run_dir) / "cloud.json").exists():
        time.sleep(2)
    cloud = Cloud.load(run_dir)
    if cloud is not None:
        stop(cloud)


def start_watchdog(cloud: Cloud) -> None:
    subprocess.Popen([sys.executable, "-m", "tests.cloud.testcloud", "watch", cloud.run_dir, str(os.getpid())],
                     cwd=HERE.parents[1], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str]) -> int:
    verb = argv[0] if argv else "status"
    running = Cloud.load(SHARED_RUN)
    if verb == "start":
        if running and running.alive():
            print(running.clouds_yaml)
            return 0
        if running:
            stop(running)
        print(start(SHARED_RUN).clouds_yaml)
        return 0
    if verb == "stop":
        if running:
            stop(running)
            log("stopped")
        return 0
    if verb == "status":
        print("running: " + str(running.clouds_yaml) if running and running.alive() else "not running")
        return 0
    if verb == "watch":
        watch(Path(argv[1]), int(argv[2]))
        return 0
    if verb == "install":
        print(ensure_venv())
        return 0
    print("usage: python -m tests.cloud.testcloud start|stop|status|install", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
