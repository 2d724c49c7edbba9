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


class _InputLeftOpen:
    """wsgi.input whose close() leaves the connection alone.

    cheroot's request readers close the connection's own reader on close() (server.py,
    KnownLengthRFile and ChunkedRFile), so an application that closes wsgi.input after an
    upload (Glance's image data path does) leaves the keep-alive connection unreadable:
    cheroot answers the client's *next* request on it with a 500. Nova's snapshot is an
    upload then a GET on one connection, and got that 500. uWSGI and mod_wsgi, where these
    applications run in production, do not close the connection for the application.
    """

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __iter__(self):
        return iter(self._stream)

    def close(self):
        pass


def input_left_open(app):
    def wrapped(environ, start_response):
        environ["wsgi.input"] = _InputLeftOpen(environ["wsgi.input"])
        return app(environ, start_response)

    return wrapped


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

    app = input_left_open(app)
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
