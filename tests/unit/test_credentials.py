"""The logins and the certificate the deployer makes for the cluster's services
(deployer/credentials.py): made once, kept secret, and what the roles install."""

from __future__ import annotations

import ssl
import subprocess

import bcrypt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from deployer import credentials
from deployer.spec import MonitoringSpec

from ..clusters import typed


def test_the_pushgateway_login_is_made_once_and_kept_secret(tmp_path):
    first = credentials.make_pushgateway_login(tmp_path / "secrets")
    again = credentials.make_pushgateway_login(tmp_path / "secrets")
    assert first == again == credentials.pushgateway_login(tmp_path / "secrets")
    stored = (tmp_path / "secrets" / credentials.PUSHGATEWAY_HASH).read_bytes()
    assert bcrypt.checkpw(first.password.encode(), stored), "the hash the web config gets is of this password"
    assert len(first.password) == 32
    for name in (credentials.PUSHGATEWAY_PASSWORD, credentials.PUSHGATEWAY_HASH):
        assert (tmp_path / "secrets" / name).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700


def test_no_login_before_one_is_made(tmp_path):
    assert credentials.pushgateway_login(tmp_path) is None


def test_grafanas_certificate_names_the_public_address_and_is_kept(tmp_path):
    secrets = tmp_path / "secrets"
    fp = credentials.grafana_certificate(secrets, "198.51.100.7")
    assert credentials.grafana_certificate(secrets, "198.51.100.7") == fp == credentials.grafana_fingerprint(secrets)
    cert = x509.load_pem_x509_certificate((secrets / credentials.GRAFANA_CERT).read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["198.51.100.7"]
    key = serialization.load_pem_private_key((secrets / credentials.GRAFANA_KEY).read_bytes(), password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers(), "the key is the certificate's"
    assert (secrets / credentials.GRAFANA_KEY).stat().st_mode & 0o777 == 0o600
    # openssl agrees on the fingerprint a user compares with the browser's.
    out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(secrets / credentials.GRAFANA_CERT)],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip().split("=", 1)[1] == fp
    # A new master address (a replaced master, another floating IP): a new certificate.
    assert credentials.grafana_certificate(secrets, "198.51.100.8") != fp


def test_a_tls_server_serves_the_certificate(tmp_path):
    """Python's TLS stack loads the pair as Grafana's Go server would (a PEM chain and its key)."""
    secrets = tmp_path / "secrets"
    credentials.grafana_certificate(secrets, "127.0.0.1")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(secrets / credentials.GRAFANA_CERT, secrets / credentials.GRAFANA_KEY)


@pytest.mark.parametrize(("monitoring", "installable", "made"), [
    ({"enabled": False}, True, set()),
    ({"enabled": True}, True, {credentials.PUSHGATEWAY_PASSWORD, credentials.PUSHGATEWAY_HASH}),
    ({"enabled": True, "expose": True, "allowed_cidrs": ["198.51.100.0/24"]}, True,
     {credentials.PUSHGATEWAY_PASSWORD, credentials.PUSHGATEWAY_HASH, credentials.GRAFANA_CERT, credentials.GRAFANA_KEY}),
    # local nodes cannot install Grafana: no certificate for a server that is not there
    ({"enabled": True, "expose": True, "allowed_cidrs": ["198.51.100.0/24"]}, False,
     {credentials.PUSHGATEWAY_PASSWORD, credentials.PUSHGATEWAY_HASH}),
], ids=["off", "private", "exposed", "exposed-but-no-grafana"])
def test_prepare_makes_what_the_roles_install(tmp_path, monitoring, installable, made):
    cluster = typed({"grafana_installable": installable, "nodes": [{"name": "demo-master", "public_ip": "198.51.100.7"}]})
    line = credentials.prepare(tmp_path, MonitoringSpec.model_validate(monitoring), cluster)
    assert {p.name for p in tmp_path.iterdir()} == made
    assert (line is not None) is (credentials.GRAFANA_CERT in made)
    if line:
        assert line.startswith("Grafana: https://198.51.100.7:3000") and credentials.grafana_fingerprint(tmp_path) in line


def test_turning_exposure_off_removes_the_certificate(tmp_path):
    cluster = typed({"grafana_installable": True, "nodes": [{"name": "demo-master", "public_ip": "198.51.100.7"}]})
    exposed = MonitoringSpec.model_validate({"expose": True, "allowed_cidrs": ["198.51.100.0/24"]})
    credentials.prepare(tmp_path, exposed, cluster)
    assert credentials.grafana_fingerprint(tmp_path)
    assert credentials.prepare(tmp_path, MonitoringSpec(), cluster) is None
    assert credentials.grafana_fingerprint(tmp_path) is None


def test_the_digest_follows_what_the_roles_install(tmp_path):
    """A certificate or login made anew changes the configure fingerprint, so `up` installs
    it instead of skipping Ansible as unchanged."""
    none = credentials.digest(tmp_path)
    credentials.make_pushgateway_login(tmp_path)
    login = credentials.digest(tmp_path)
    credentials.grafana_certificate(tmp_path, "198.51.100.7")
    cert = credentials.digest(tmp_path)
    assert len({none, login, cert}) == 3
    assert credentials.digest(tmp_path) == cert  # nothing new: the same
    credentials.grafana_certificate(tmp_path, "198.51.100.8")  # the master's address changed
    assert credentials.digest(tmp_path) != cert
