"""The test cloud's services: their configuration, databases, start order, and the
catalog, users, networks, flavors and image that make it look like a research cloud.

Settings follow each project's install guide (and DevStack where the guide leaves a
choice); every departure says why. All listen on 127.0.0.1 only.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .testcloud import REGION, SERVICES_PROJECT, VENV, log, port_open, wait_for

if TYPE_CHECKING:
    from .testcloud import Cloud, Launcher

API_PORTS = ["keystone", "placement", "nova-api", "neutron-api", "glance-api", "cinder-api"]
DATABASES = ["keystone", "placement", "nova_api", "nova", "nova_cell0", "neutron", "glance", "cinder"]
DB_USER = "openstack"
# (service name, type, API port name, URL path after the port)
CATALOG = [
    ("keystone", "identity", "keystone", "/v3"),
    ("placement", "placement", "placement", ""),
    ("nova", "compute", "nova-api", "/compute/v2.1"),
    ("neutron", "network", "neutron-api", ""),
    ("glance", "image", "glance-api", ""),
    ("cinderv3", "block-storage", "cinder-api", "/v3/%(project_id)s"),
]
# Nova under a path prefix, as DevStack and several public clouds serve it: a client that
# assumes the API sits at the root of its endpoint fails here as it would there.
NOVA_PREFIX = "/compute"
COMPUTE_HOST = "testcloud-compute"
# Three hypervisors, each its own nova-compute process with the fake driver (a compute
# node of its own, 1000 vCPUs and 800 GB of RAM as the driver reports them), so a server
# group's policy has somewhere to spread to (tests/cloud/test_placement.py). The first
# keeps the name the other tests know.
COMPUTE_HOSTS = (COMPUTE_HOST, f"{COMPUTE_HOST}-2", f"{COMPUTE_HOST}-3")
# Flavors as a GPU research cloud offers them; small enough for 64 fake servers.
FLAVORS = {
    "m1.small": {"vcpus": 1, "ram": 512, "disk": 1},
    "m1.large": {"vcpus": 4, "ram": 8192, "disk": 80},
    "g1.vgpu": {"vcpus": 2, "ram": 2048, "disk": 20, "extra_specs": {"resources:VGPU": "1"}},
}
IMAGE = "Ubuntu 22.04"
# Nova's [filter_scheduler] soft_affinity_weight_multiplier and
# soft_anti_affinity_weight_multiplier here (default 1.0 each): above the sum of the
# weighers that spread by free resources (RAM, vCPUs, disk, I/O ops: 1.0 each), so a
# server group's soft policy wins over how busy the hosts are. The cloud tier runs many
# clusters on these three hosts, so they are never equally busy: with the defaults, a node
# of a soft spread made anew (lifecycle.spread_out) went back to the emptier host it
# shared (a CI run, 2+1 on three hosts).
SOFT_AFFINITY_WEIGHT = 10.0


def ini(sections: dict[str, dict[str, object]]) -> str:
    out = []
    for name, opts in sections.items():
        out.append(f"[{name}]")
        out += [f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in opts.items()]
        out.append("")
    return "\n".join(out)


class Configs:
    """Each service's configuration files, written into the run dir."""

    def __init__(self, cloud: Cloud):
        self.c = cloud
        self.run = Path(cloud.run_dir)
        self.sock = self.run / "mysql" / "mysqld.sock"

    def db(self, name: str) -> str:
        return f"mysql+pymysql://{DB_USER}:{self.c.passwords['service']}@localhost/{name}?unix_socket={self.sock}"

    @property
    def rabbit(self) -> str:
        return f"rabbit://guest:guest@127.0.0.1:{self.c.ports['amqp']}/"

    def service_auth(self, user: str = "service") -> dict[str, object]:
        return {"auth_type": "password", "auth_url": self.c.auth_url, "project_domain_name": "Default",
                "user_domain_name": "Default", "project_name": SERVICES_PROJECT, "username": user,
                "password": self.c.passwords["service"], "region_name": REGION}

    def authtoken(self, **extra: object) -> dict[str, object]:
        # No memcached: keystonemiddleware caches validated tokens in-process.
        return {"www_authenticate_uri": self.c.auth_url, **self.service_auth(), **extra}

    def common(self, name: str) -> dict[str, object]:
        state = self.run / name
        state.mkdir(exist_ok=True)
        # A test cloud stops at once: no minute of graceful shutdown per service.
        return {"transport_url": self.rabbit, "state_path": state, "debug": False, "use_stderr": True,
                "graceful_shutdown_timeout": 3}

    def write(self, name: str, sections: dict[str, dict[str, object]]) -> Path:
        d = self.run / "etc"
        d.mkdir(exist_ok=True)
        path = d / name
        path.write_text(ini(sections))
        return path

    def keystone(self) -> Path:
        keys = self.run / "keystone"
        return self.write("keystone.conf", {
            "DEFAULT": {"debug": False, "use_stderr": True},
            "database": {"connection": self.db("keystone")},
            "token": {"provider": "fernet"},
            "fernet_tokens": {"key_repository": keys / "fernet-keys"},
            "fernet_receipts": {"key_repository": keys / "fernet-keys"},
            "credential": {"key_repository": keys / "credential-keys"},
            # Without a cache every token check costs Keystone hundreds of SQL queries
            # (role assignments, catalog, revocations): an in-process cache, no memcached.
            "cache": {"enabled": True, "backend": "oslo_cache.dict"},
        })

    def placement(self) -> Path:
        d = self.run / "etc" / "placement"
        d.mkdir(parents=True, exist_ok=True)
        path = d / "placement.conf"
        path.write_text(ini({
            "DEFAULT": {"debug": False, "use_stderr": True},
            "placement_database": {"connection": self.db("placement")},
            "api": {"auth_strategy": "keystone"},
            "keystone_authtoken": self.authtoken(service_type="placement"),
        }))
        return path

    def nova(self) -> Path:
        paste = self.run / "etc" / "nova-api-paste.ini"
        shutil.copy(VENV / "etc/nova/api-paste.ini", paste)
        return self.write("nova.conf", {
            "DEFAULT": {**self.common("nova"), "host": COMPUTE_HOST, "my_ip": "127.0.0.1",
                        # plugins/deployer_testcloud/virt.py, through nova.virt.deployer_gpu_fake
                        "compute_driver": "deployer_gpu_fake.GPUFakeDriver",
                        # No agent sends network-vif-plugged: do not wait for it.
                        "vif_plugging_timeout": 0, "vif_plugging_is_fatal": False,
                        "osapi_compute_workers": 1, "metadata_workers": 1, "instance_name_template": "instance-%08x"},
            "wsgi": {"api_paste_config": paste},
            "api": {"auth_strategy": "keystone"},
            "api_database": {"connection": self.db("nova_api")},
            "database": {"connection": self.db("nova")},
            # As DevStack and Kolla configure every service: with service_type set,
            # keystonemiddleware enforces an application credential's access rules (and
            # without it refuses such a token outright, even when Nova lists a server's
            # ports in Neutron on the user's behalf).
            "keystone_authtoken": self.authtoken(service_type="compute"),
            # Nova's calls to Neutron, Cinder and Glance on a user's behalf carry a
            # service token: a restricted credential's rules apply to Nova's API only.
            "service_user": {**self.service_auth(), "send_service_user_token": True},
            "placement": self.service_auth(),
            "neutron": self.service_auth(),
            "cinder": {**self.service_auth(), "os_region_name": REGION},
            "glance": {"region_name": REGION},
            "conductor": {"workers": 1},
            "scheduler": {"workers": 1, "discover_hosts_in_cells_interval": 2},
            # docs/openstack.md, "Placement": Nova's own weighers (free RAM, vCPUs, disk) spread
            # servers by default, and each counts as much as a soft server-group weigher; a
            # cloud that offers packing or spreading weighs its server groups above them, as here.
            "filter_scheduler": {"soft_affinity_weight_multiplier": SOFT_AFFINITY_WEIGHT,
                                 "soft_anti_affinity_weight_multiplier": SOFT_AFFINITY_WEIGHT},
            "oslo_concurrency": {"lock_path": self.run / "nova" / "locks"},
            "vnc": {"enabled": False},
            "oslo_messaging_notifications": {"driver": "noop"},
            # Quotas as the tests set them per project; defaults generous for the scale test.
            # server_group_members: Nova's default is 10 a group, below the scale test's 32 nodes.
            "quota": {"instances": 100, "cores": 400, "ram": 400 * 1024, "server_group_members": 64},
        })

    def compute(self, host: str) -> Path:
        """What one more nova-compute changes of nova.conf: its host name (its compute node's
        too, with the fake driver), and a state dir of its own (the node's identity file)."""
        state = self.run / host
        state.mkdir(exist_ok=True)
        return self.write(f"{host}.conf", {"DEFAULT": {"host": host, "state_path": state}})

    def neutron(self) -> tuple[Path, Path]:
        paste = self.run / "etc" / "neutron-api-paste.ini"
        shutil.copy(VENV / "etc/neutron/api-paste.ini", paste)
        conf = self.write("neutron.conf", {
            "DEFAULT": {**self.common("neutron"), "core_plugin": "ml2", "service_plugins": "router",
                        "auth_strategy": "keystone", "api_paste_config": paste, "api_workers": 1, "rpc_workers": 0,
                        "notify_nova_on_port_status_changes": True, "notify_nova_on_port_data_changes": True},
            "database": {"connection": self.db("neutron")},
            "keystone_authtoken": self.authtoken(service_type="network"),
            "nova": self.service_auth(),
            "oslo_concurrency": {"lock_path": self.run / "neutron" / "locks"},
            # Room for the tests' clusters side by side (each makes 2 groups and a router).
            "quotas": {"quota_security_group": 100, "quota_router": 50, "quota_network": 100, "quota_floatingip": 100},
        })
        ml2 = self.write("ml2_conf.ini", {
            "ml2": {"type_drivers": "flat,vxlan", "tenant_network_types": "vxlan", "mechanism_drivers": "deployer_bind",
                    "extension_drivers": "port_security"},
            "ml2_type_flat": {"flat_networks": "public"},
            "ml2_type_vxlan": {"vni_ranges": "1:1000"},
        })
        return conf, ml2

    def glance(self) -> Path:
        d = self.run / "etc" / "glance"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(VENV / "etc/glance/glance-api-paste.ini", d / "glance-api-paste.ini")
        store = self.run / "glance"
        path = d / "glance-api.conf"
        path.write_text(ini({
            "DEFAULT": {"debug": False, "use_stderr": True, "enabled_backends": "fs:file"},
            "database": {"connection": self.db("glance")},
            "keystone_authtoken": self.authtoken(service_type="image"),
            "paste_deploy": {"flavor": "keystone"},
            "glance_store": {"default_backend": "fs"},
            "fs": {"filesystem_store_datadir": store / "images"},
            "os_glance_staging_store": {"filesystem_store_datadir": store / "staging"},
            "os_glance_tasks_store": {"filesystem_store_datadir": store / "tasks"},
            "oslo_concurrency": {"lock_path": store / "locks"},
        }))
        (d / "glance-image-import.conf").write_text("")
        return path

    def cinder(self) -> Path:
        paste = self.run / "etc" / "cinder-api-paste.ini"
        shutil.copy(VENV / "etc/cinder/api-paste.ini", paste)
        return self.write("cinder.conf", {
            "DEFAULT": {**self.common("cinder"), "auth_strategy": "keystone", "api_paste_config": paste, "my_ip": "127.0.0.1",
                        "host": "testcloud-volume", "enabled_backends": "fake", "default_volume_type": "__DEFAULT__",
                        "osapi_volume_workers": 1,
                        # The capabilities report (what the scheduler places volumes by) right
                        # after start, not after a random delay of up to a minute (catalog.py waits for it).
                        "periodic_fuzzy_delay": 0},
            # plugins/deployer_testcloud/volume.py: the fake driver, each volume a sparse file
            "fake": {"volume_driver": "deployer_testcloud.volume.FileBackedFakeDriver", "volume_backend_name": "fake"},
            "database": {"connection": self.db("cinder")},
            "keystone_authtoken": self.authtoken(service_type="block-storage"),
            "nova": self.service_auth(),
            "oslo_concurrency": {"lock_path": self.run / "cinder" / "locks"},
            "coordination": {"backend_url": f"file://{self.run / 'cinder' / 'coordination'}"},
            # A volume made from an image (a node booted from a volume) is inspected with
            # qemu-img through oslo.privsep, whose default helper is `sudo privsep-helper`:
            # the test cloud runs as root with no sudo, so the venv's helper is named.
            "cinder_sys_admin": {"helper_command": f"{VENV / 'bin/privsep-helper'} --config-file {self.run / 'etc' / 'cinder.conf'}"},
        })


# ---- the database and the broker ---------------------------------------------------------------------


def start_mysql(launch: Launcher, cfg: Configs) -> None:
    data = Path(launch.cloud.run_dir) / "mysql"
    data.mkdir(exist_ok=True)
    launch.run_tool("mysql-install", ["mariadb-install-db", "--no-defaults", f"--datadir={data / 'data'}", "--user=root",
                                      "--auth-root-authentication-method=normal", "--skip-test-db"])
    # Durability traded for speed: a test database that dies is made anew.
    launch.spawn("mysql", ["mariadbd", "--no-defaults", f"--datadir={data / 'data'}", f"--socket={cfg.sock}",
                           "--skip-networking", "--user=root", f"--pid-file={data / 'mysqld.pid'}",
                           "--innodb-buffer-pool-size=128M", "--innodb-flush-log-at-trx-commit=0", "--skip-log-bin",
                           "--max-connections=1000", "--character-set-server=utf8mb4"])


def create_databases(launch: Launcher, cfg: Configs) -> None:
    wait_for("MariaDB", cfg.sock.exists, timeout=60, procs={"mysql": launch.cloud.pids["mysql"]})
    pw = launch.cloud.passwords["service"]
    sql = "".join(f"CREATE DATABASE IF NOT EXISTS {d};" for d in DATABASES)
    sql += f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{pw}';"
    sql += f"GRANT ALL PRIVILEGES ON *.* TO '{DB_USER}'@'localhost';"
    wait_for("MariaDB accepting SQL", lambda: subprocess.run(["mariadb", f"--socket={cfg.sock}", "-uroot", "-e", sql],
                                                             capture_output=True).returncode == 0, timeout=60)


def start_rabbitmq(launch: Launcher) -> None:
    """RabbitMQ as this run's own Erlang node, with its own epmd on its own port, so
    nothing of it outlives the run or meets another user's broker."""
    c = launch.cloud
    base = Path(c.run_dir) / "rabbitmq"
    base.mkdir(exist_ok=True)
    (base / "enabled_plugins").write_text("[].\n")
    env = rabbit_env(c)
    launch.spawn("epmd", ["epmd", "-address", "127.0.0.1", "-port", str(c.ports["epmd"])])
    wait_for("epmd", lambda: port_open(c.ports["epmd"]), timeout=30)
    launch.spawn("rabbitmq", ["/usr/lib/rabbitmq/bin/rabbitmq-server"], **env)


def rabbit_env(c: Cloud) -> dict[str, str]:
    base = Path(c.run_dir) / "rabbitmq"
    return {"HOME": str(base), "RABBITMQ_NODENAME": f"testcloud{c.ports['amqp']}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(c.ports["amqp"]),
            "RABBITMQ_DIST_PORT": str(c.ports["rabbit_dist"]), "ERL_EPMD_PORT": str(c.ports["epmd"]),
            "ERL_EPMD_ADDRESS": "127.0.0.1", "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"), "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(base / "plugins"), "RABBITMQ_PID_FILE": str(base / "rabbit.pid"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"), "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf")}


# ---- databases of the services ---------------------------------------------------------------------


def sync_databases(launch: Launcher, files: dict[str, Path]) -> None:
    """Each service's schema, two at a time (two cores)."""
    bin_ = VENV / "bin"
    chains = {
        "keystone-db": [[bin_ / "keystone-manage", "--config-file", files["keystone"], "db_sync"]],
        "placement-db": [[bin_ / "placement-manage", "--config-file", files["placement"], "db", "sync"]],
        "nova-db": [[bin_ / "nova-manage", "--config-file", files["nova"], *a] for a in (
            ["api_db", "sync"], ["cell_v2", "map_cell0"], ["cell_v2", "create_cell", "--name", "cell1"], ["db", "sync"])],
        "neutron-db": [[bin_ / "neutron-db-manage", "--config-file", files["neutron"], "--config-file", files["ml2"],
                        "upgrade", "heads"]],
        "glance-db": [[bin_ / "glance-manage", "--config-file", files["glance"], "db_sync"]],
        "cinder-db": [[bin_ / "cinder-manage", "--config-file", files["cinder"], "db", "sync"]],
    }
    pending = list(chains.items())
    running: list[tuple[str, subprocess.Popen, list]] = []
    while pending or running:
        while pending and len(running) < 2:
            name, steps = pending.pop(0)
            running.append((name, _step(launch, name, steps[0]), steps[1:]))
        time.sleep(0.3)
        for item in list(running):
            name, proc, rest = item
            if proc.poll() is None:
                continue
            running.remove(item)
            if proc.returncode:
                tail = (launch.logs / f"{name}.log").read_text(errors="replace")[-2500:]
                raise RuntimeError(f"{name} failed (rc {proc.returncode}):\n{tail}")
            if rest:
                running.append((name, _step(launch, name, rest[0]), rest[1:]))


def _step(launch: Launcher, name: str, argv: list) -> subprocess.Popen:
    out = open(launch.logs / f"{name}.log", "ab")  # noqa: SIM115
    p = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, env=launch.env(), cwd=launch.run)
    out.close()
    return p


def compute_process(i: int) -> str:
    """The i-th nova-compute's name among the cloud's processes (the first is plain nova-compute)."""
    return "nova-compute" if i == 0 else f"nova-compute-{i + 1}"


# ---- the whole start -----------------------------------------------------------------------------


def start_all(launch: Launcher) -> None:
    c = launch.cloud
    cfg = Configs(c)
    log("starting MariaDB and RabbitMQ")
    start_mysql(launch, cfg)
    start_rabbitmq(launch)
    files = {"keystone": cfg.keystone(), "placement": cfg.placement(), "nova": cfg.nova(), "glance": cfg.glance(),
             "cinder": cfg.cinder()}
    files["neutron"], files["ml2"] = cfg.neutron()
    create_databases(launch, cfg)
    log("creating the services' schemas")
    sync_databases(launch, files)
    keys = Path(c.run_dir) / "keystone"
    for what in ("fernet_setup", "credential_setup"):
        launch.run_tool("keystone-setup", [str(VENV / "bin/keystone-manage"), "--config-file", str(files["keystone"]), what,
                                           "--keystone-user", "root", "--keystone-group", "root"])
    launch.run_tool("keystone-bootstrap", [
        str(VENV / "bin/keystone-manage"), "--config-file", str(files["keystone"]), "bootstrap",
        "--bootstrap-admin-url", c.auth_url, "--bootstrap-public-url", c.auth_url, "--bootstrap-internal-url", c.auth_url,
        "--bootstrap-region-id", REGION],
        # By environment, not argv: off the process list, and a password starting with '-' read as an option (CI run 37).
        OS_BOOTSTRAP_PASSWORD=c.passwords["admin"])
    del keys
    log("starting Keystone")
    launch.serve("keystone", files["keystone"])
    wait_for("Keystone", lambda: port_open(c.ports["keystone"]), procs={"keystone": c.pids["keystone"]})
    from . import catalog

    catalog.register_services(c)
    wait_for("RabbitMQ", lambda: port_open(c.ports["amqp"]), timeout=120, procs={"rabbitmq": c.pids["rabbitmq"]})
    log("starting Placement, Nova, Neutron, Glance, Cinder")
    launch.serve("placement", files["placement"])
    # Nova's WSGI application reads its paste pipeline from the first file it is given.
    launch.serve("nova-api", Path(c.run_dir) / "etc" / "nova-api-paste.ini", files["nova"], prefix=NOVA_PREFIX)
    launch.serve("neutron-api", files["neutron"], files["ml2"])
    launch.serve("glance-api", files["glance"])
    launch.serve("cinder-api", files["cinder"])
    bin_ = VENV / "bin"
    for name in ("nova-conductor", "nova-scheduler"):
        launch.spawn(name, [str(bin_ / name), "--config-file", str(files["nova"])])
    for i, host in enumerate(COMPUTE_HOSTS):
        launch.spawn(compute_process(i), [str(bin_ / "nova-compute"), "--config-file", str(files["nova"]),
                                          "--config-file", str(cfg.compute(host))])
    for name in ("cinder-scheduler", "cinder-volume"):
        launch.spawn(name, [str(bin_ / name), "--config-file", str(files["cinder"])])
    for api in API_PORTS:
        wait_for(api, lambda api=api: port_open(c.ports[api]), timeout=240, procs={api: c.pids[api]})
    catalog.populate(c, launch)
