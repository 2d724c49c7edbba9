"""OpenStack sessions: credentials found, connected, and every cloud error as one line.

Credentials come from clouds.yaml / OS_CLOUD (or an openrc's OS_* variables), never from
the spec. A problem the user can fix becomes one PreflightError line naming the fix
(exit 2); a cloud that fails mid-way becomes OperationFailed (exit 1). Exception text
from keystoneauth/openstacksdk is never shown raw: it passes through `scrub`, which
removes every secret of the cloud's config.

openstacksdk is imported inside the functions: importing it costs about a second and
`deployer --help` must stay fast.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ...errors import OperationFailed, PreflightError

CLOUDS_YAML_FIX = (
    "put your cloud's entry in clouds.yaml (./clouds.yaml or ~/.config/openstack/clouds.yaml; "
    "the dashboard's API Access page downloads one) and set OS_CLOUD=<entry> or openstack.cloud in cluster.yaml"
)
API_TIMEOUT_S = 60
SECRET_KEYS = ("password", "application_credential_secret", "token", "secret", "passcode", "totp")


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with every secret and any URL user-info removed, on one line."""
    for s in sorted({s for s in secrets if s and len(s) >= 3}, key=len, reverse=True):
        text = text.replace(s, "***")
    text = re.sub(r"(\w+://)[^/@\s]+@", r"\1***@", text)
    return " ".join(text.split())


def client_config_env(cloud: str | None, cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that makes Terraform's OpenStack provider read the credentials the
    preflight read.

    openstacksdk finds ./clouds.yaml (and ./secure.yaml) in the working directory;
    Terraform runs in the state dir, where the provider would find none. So a file found
    here, or named by OS_CLIENT_CONFIG_FILE / OS_CLIENT_SECURE_FILE, is handed over by
    absolute path. Only paths and the entry's name travel, never a secret. A file that
    exists but cannot be read is refused here, before anything is created.
    """
    environ = os.environ if environ is None else environ
    cwd = cwd or Path.cwd()
    env: dict[str, str] = {}
    for var, names in (("OS_CLIENT_CONFIG_FILE", ("clouds.yaml", "clouds.yml")), ("OS_CLIENT_SECURE_FILE", ("secure.yaml", "secure.yml"))):
        given = environ.get(var)
        path = Path(given).expanduser() if given else next((cwd / n for n in names if (cwd / n).exists()), None)
        if path is None or not path.exists():  # openstacksdk skips a named file that is not there too
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            how = f"${var}" if given else "found in the working directory"
            raise PreflightError(f"{path} ({how}) cannot be read ({e.strerror}): fix its permissions or path") from None
        env[var] = str(path.resolve())
    if cloud or environ.get("OS_CLOUD"):
        env["OS_CLOUD"] = cloud or environ["OS_CLOUD"]
    return env


def _secrets(conn: Any = None) -> list[str]:
    found = [v for k, v in os.environ.items() if k.startswith("OS_") and any(s in k.lower() for s in SECRET_KEYS)]
    if conn is not None:
        with contextlib.suppress(Exception):  # redaction must never fail the run
            auth = conn.config.config.get("auth", {}) or {}
            found += [str(v) for k, v in auth.items() if any(s in k.lower() for s in SECRET_KEYS) and v]
    return found


@contextlib.contextmanager
def quiet_sdk_logs() -> Iterator[None]:
    """keystoneauth and openstacksdk log and warn on their own (discovery fall-backs,
    deprecated response fields); the deployer's one line says it better."""
    names = ("keystoneauth", "openstack", "stevedore", "os_service_types")
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        logging.getLogger(n).setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)


def connect(cloud: str | None) -> tuple[Any, str]:
    """An authenticated connection and its project id; credential problems → PreflightError."""
    import openstack
    from keystoneauth1 import exceptions as ka

    name = cloud or os.environ.get("OS_CLOUD")
    label = f"cloud {name!r}" if name else "the OS_* environment"
    conn = None
    try:
        conn = openstack.connect(cloud=cloud, api_timeout=API_TIMEOUT_S)
        conn.session.get_token()
        project_id = conn.current_project_id
    except openstack.exceptions.ConfigException:
        if name:
            raise PreflightError(
                f"OpenStack {label} is not in any clouds.yaml (./clouds.yaml, ~/.config/openstack/, /etc/openstack/ "
                f"or $OS_CLIENT_CONFIG_FILE): add it, or fix openstack.cloud / OS_CLOUD"
            ) from None
        raise PreflightError(f"no usable OpenStack configuration: {CLOUDS_YAML_FIX}") from None
    except (ka.MissingRequiredOptions, ka.MissingAuthPlugin, ka.NoMatchingPlugin):
        if name:  # no clouds.yaml at all: openstacksdk falls back to OS_* variables, which are not there either
            raise PreflightError(
                f"OpenStack {label} is not in any clouds.yaml (none found in ./, ~/.config/openstack/, /etc/openstack/ "
                f"or $OS_CLIENT_CONFIG_FILE): add it, or fix openstack.cloud / OS_CLOUD"
            ) from None
        raise PreflightError(f"no OpenStack credentials found: {CLOUDS_YAML_FIX}") from None
    except ka.Unauthorized:
        raise PreflightError(
            f"OpenStack refused the credentials of {label} (HTTP 401): check username, password, project and "
            f"domain in clouds.yaml, or use an application credential"
        ) from None
    except ka.Forbidden:
        raise PreflightError(
            f"OpenStack {label}: the user may not use that project (HTTP 403); check project_name / project_id in clouds.yaml"
        ) from None
    except (ka.DiscoveryFailure, ka.ConnectionError) as e:
        url = _auth_url(conn, cloud)
        why = "timed out" if isinstance(e, ka.ConnectTimeout) else "no Keystone answered"
        raise PreflightError(
            f"cannot reach the OpenStack identity service at {scrub(url, _secrets(conn))} ({why}): "
            f"check auth_url in clouds.yaml and your network, VPN or proxy"
        ) from None
    except ka.ClientException as e:
        raise PreflightError(
            f"OpenStack authentication failed for {label} ({type(e).__name__}: {scrub(str(e), _secrets(conn))}); check clouds.yaml"
        ) from None
    if not project_id:
        raise PreflightError(f"OpenStack {label}: the token is not scoped to a project; set project_name in clouds.yaml")
    return conn, project_id


def _auth_url(conn: Any, cloud: str | None) -> str:
    try:
        if conn is not None:
            return str(conn.config.config["auth"]["auth_url"])
        import openstack.config

        region = openstack.config.OpenStackConfig().get_one(cloud=cloud)
        return str(region.config["auth"].get("auth_url", "auth_url"))
    except Exception:  # noqa: BLE001
        return "the configured auth_url"


@contextlib.contextmanager
def cloud_errors(conn: Any, what: str) -> Iterator[None]:
    """Map what is left (the cloud failing mid-way) to OperationFailed, scrubbed."""
    import openstack
    from keystoneauth1 import exceptions as ka

    try:
        yield
    except (PreflightError, OperationFailed):
        raise
    except openstack.exceptions.DuplicateResource as e:
        raise PreflightError(f"{what}: {scrub(str(e), _secrets(conn))}; use the ID instead of the name") from None
    except (openstack.exceptions.SDKException, ka.ClientException) as e:
        code = getattr(e, "status_code", None)
        status = f" (HTTP {code})" if code else ""
        raise OperationFailed(
            f"OpenStack failed while {what}{status}: {scrub(str(e), _secrets(conn))}; try again, or check the cloud's status page"
        ) from None
