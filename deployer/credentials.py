"""The logins and certificates the deployer makes for the cluster's services, kept in the
state dir's secrets (0700 dir, 0600 files) and made once: a re-run keeps them, so the
roles that install them change nothing.

- The Pushgateway's basic-auth login: Ansible installs the bcrypt hash in the
  Pushgateway's web config and the password where Prometheus reads it to scrape;
  `deployer bench` pushes with it. Without it, any host on the cluster network could
  push or delete series.
- Grafana's TLS certificate, made only when monitoring.expose opens Grafana beyond the
  cluster: self-signed for the master's public address; its SHA-256 fingerprint is
  what a user compares with the browser's before typing the admin password.

The Grafana admin and JupyterLab passwords are made by their roles (Ansible's password
lookup) into the same directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import ports

if TYPE_CHECKING:
    from cryptography.x509 import Certificate

    from .cluster import Cluster
    from .spec import MonitoringSpec

PUSHGATEWAY_USER = "deployer"
PUSHGATEWAY_PASSWORD = "pushgateway_password"  # noqa: S105 (a file name)
PUSHGATEWAY_HASH = "pushgateway_password.bcrypt"
GRAFANA_CERT = "grafana_tls.crt"
GRAFANA_KEY = "grafana_tls.key"
CERT_DAYS = 825  # the longest validity clients accept for a server certificate


@dataclass(frozen=True)
class Login:
    user: str
    password: str


def write_secret(path: Path, data: bytes) -> None:
    """A secret file, 0600 in a 0700 dir, written whole or not at all."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)  # atomic: a crash never leaves half a secret


def make_pushgateway_login(secrets_dir: Path) -> Login:
    """The Pushgateway's login, made on first use with its bcrypt hash beside it (the
    hash is salted: made once, so the web config stays the same from run to run)."""
    password_file, hash_file = secrets_dir / PUSHGATEWAY_PASSWORD, secrets_dir / PUSHGATEWAY_HASH
    if not (password_file.exists() and hash_file.exists()):
        import bcrypt

        password = secrets.token_hex(16)
        write_secret(hash_file, bcrypt.hashpw(password.encode(), bcrypt.gensalt()))
        write_secret(password_file, password.encode())
    return Login(PUSHGATEWAY_USER, password_file.read_text().strip())


def pushgateway_login(secrets_dir: Path) -> Login | None:
    """The login `up` made (None: none was made, monitoring off)."""
    password_file = secrets_dir / PUSHGATEWAY_PASSWORD
    return Login(PUSHGATEWAY_USER, password_file.read_text().strip()) if password_file.exists() else None


def grafana_certificate(secrets_dir: Path, host: str) -> str:
    """A self-signed certificate for Grafana at `host` (the master's public address),
    made when there is none for that host; returns its SHA-256 fingerprint (AA:BB:...)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_file, key_file = secrets_dir / GRAFANA_CERT, secrets_dir / GRAFANA_KEY
    if cert_file.exists() and key_file.exists():
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        if host in _names(cert) and cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=30):
            return fingerprint(cert)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "deployer")])
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt = x509.DNSName(host)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_secret(key_file, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    write_secret(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    return fingerprint(cert)


def prepare(secrets_dir: Path, monitoring: MonitoringSpec, cluster: Cluster) -> str | None:
    """What the monitoring roles install, made before Ansible runs: the Pushgateway's
    login; Grafana's certificate when it is exposed (removed when it no longer is).
    Returns a line for the user when Grafana is exposed."""
    if not monitoring.enabled:
        return None
    make_pushgateway_login(secrets_dir)
    master_public_ip = cluster.master.public_ip
    if monitoring.expose and monitoring.grafana and cluster.grafana_installable and master_public_ip:
        fp = grafana_certificate(secrets_dir, master_public_ip)
        return (f"Grafana: https://{master_public_ip}:{ports.grafana()} (self-signed certificate; check that your browser shows "
                f"SHA-256 {fp} before you log in)")
    for name in (GRAFANA_CERT, GRAFANA_KEY):
        (secrets_dir / name).unlink(missing_ok=True)
    return None


def digest(secrets_dir: Path) -> str:
    """A digest of what the roles install from here (the Pushgateway's hash, Grafana's
    certificate), for the configure fingerprint: made anew, they are installed again."""
    import hashlib

    h = hashlib.sha256()
    for name in (PUSHGATEWAY_HASH, GRAFANA_CERT):
        path = secrets_dir / name
        h.update(name.encode() + (path.read_bytes() if path.exists() else b"-"))
    return h.hexdigest()


def grafana_fingerprint(secrets_dir: Path) -> str | None:
    """The fingerprint of the certificate Grafana serves, or None when it serves none."""
    from cryptography import x509

    cert_file = secrets_dir / GRAFANA_CERT
    return fingerprint(x509.load_pem_x509_certificate(cert_file.read_bytes())) if cert_file.exists() else None


def fingerprint(cert: Certificate) -> str:
    from cryptography.hazmat.primitives import hashes

    return ":".join(f"{b:02X}" for b in cert.fingerprint(hashes.SHA256()))


def _names(cert: Certificate) -> list[str]:
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(n) for n in san.get_values_for_type(x509.IPAddress)] + san.get_values_for_type(x509.DNSName)
