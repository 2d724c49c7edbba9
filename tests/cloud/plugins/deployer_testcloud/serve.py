"""Serve one OpenStack API's WSGI application on 127.0.0.1 (cheroot, a thread pool).

Production clouds run these applications under uWSGI or mod_wsgi; cheroot is a pure
Python server of the same kind (HTTP/1.1, keep-alive, chunked bodies) that installs from
PyPI in seconds where uWSGI compiles C. Usage:

    python -m deployer_testcloud.serve SERVICE PORT PREFIX CONFIG_FILE [CONFIG_FILE ...]

PREFIX ("" for none) mounts the application under a path, as DevStack serves Nova at
/compute: clients then see the API at http://host:port/compute/v2.1.
"""

import importlib
import os
import signal
import sys

# The modules whose `application` each service ships for WSGI servers.
APPS = {
    "keystone": "keystone.wsgi.api",
    "placement": "placement.wsgi.api",
    "nova-api": "nova.wsgi.osapi_compute",
    "neutron-api": "neutron.wsgi.api",
    "glance-api": "glance.wsgi.api",
    "cinder-api": "cinder.wsgi.api",
}
# How each finds its configuration: an environment variable naming the files, or argv.
CONFIG_ENV = {
    "keystone": "OS_KEYSTONE_CONFIG_FILES",
    "nova-api": "OS_NOVA_CONFIG_FILES",
    "neutron-api": "OS_NEUTRON_CONFIG_FILES",
}
CONFIG_DIR_ENV = {"placement": "OS_PLACEMENT_CONFIG_DIR", "glance-api": "OS_GLANCE_CONFIG_DIR"}


def main() -> None:
    service, port, prefix, *configs = sys.argv[1:]
    if service in CONFIG_ENV:
        os.environ[CONFIG_ENV[service]] = ";".join(configs)
        if service in ("nova-api", "neutron-api"):
            os.environ[CONFIG_ENV[service].replace("FILES", "DIR")] = "/"
    if service in CONFIG_DIR_ENV:
        os.environ[CONFIG_DIR_ENV[service]] = os.path.dirname(configs[0])
    # Cinder's application parses sys.argv; the others must not see ours.
    sys.argv = [service] + [a for c in configs for a in ("--config-file", c)] if service == "cinder-api" else [service]
    app = importlib.import_module(APPS[service]).application

    from cheroot import wsgi

    if prefix:
        app = wsgi.PathInfoDispatcher({prefix: app})
    server = wsgi.Server(("127.0.0.1", int(port)), app, numthreads=8, server_name=service)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    try:
        server.start()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
