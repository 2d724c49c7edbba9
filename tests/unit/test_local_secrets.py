"""The host's pip and apt credentials on a local node (issue 44, item 3): what the driver
writes into a node's root filesystem and into the image, read as an unprivileged user of
the node would read it. A user:token is planted in the host's pip environment and in its
apt files; no file that any user but root can read may hold it, and root (and, through its
copy, the cluster user) still gets the whole configuration.

No container: the driver's own functions write into a folder standing for the rootfs."""

from __future__ import annotations

import configparser
import os
import stat
import uuid
from pathlib import Path

import pytest

from deployer.providers.local import image, node, runtime_env

TOKEN = f"marker-token-{uuid.uuid4().hex[:12]}"
PROXY_PASS = f"marker-proxy-{uuid.uuid4().hex[:12]}"
APT_PASS = f"marker-apt-{uuid.uuid4().hex[:12]}"
MARKERS = (TOKEN, PROXY_PASS, APT_PASS)


def _leaks(rootfs: Path) -> list[str]:
    """Each file under `rootfs` that a user other than its owner can read, and that holds a
    marker, with its mode (an unprivileged user of the node reads exactly those)."""
    found = []
    for f in rootfs.rglob("*"):
        if f.is_symlink() or not f.is_file():
            continue
        mode = f.stat().st_mode
        if mode & (stat.S_IRGRP | stat.S_IROTH) and any(m in f.read_text(errors="replace") for m in MARKERS):
            found.append(f"{f.relative_to(rootfs)} ({stat.filemode(mode)})")
    return found


def _private(f: Path) -> None:
    st = f.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600, f"{f}: {oct(st.st_mode)}"
    if os.geteuid() == 0:
        assert st.st_uid == 0


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    """A node's root filesystem, as much of it as the driver writes into."""
    r = tmp_path / "rootfs"
    for d in ("etc/ssl/certs", "etc/apt/apt.conf.d", "etc/apt/sources.list.d", "etc/apt/auth.conf.d"):
        (r / d).mkdir(parents=True)
    (r / "root").mkdir(mode=0o700)
    return r


@pytest.fixture
def host_pip(monkeypatch, tmp_path):
    """The host's pip configuration from its environment alone (no file of this machine's),
    a private index's user:token and an authenticated proxy among it."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"https://deployer:{TOKEN}@pypi.example.test/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", f"https://pypi.org/simple https://{TOKEN}@extra.example.test/simple")
    monkeypatch.setenv("PIP_PROXY", f"proxyuser:{PROXY_PASS}@proxy.example.test:3128")
    monkeypatch.setenv("PIP_TRUSTED_HOST", "pypi.example.test")
    monkeypatch.setattr(runtime_env, "WHEELHOUSE", tmp_path / "no-wheelhouse")


def _pip_view(rootfs: Path, *files: str) -> dict[str, str]:
    """pip's [global] options as a user reads them: the files in pip's order, a later one's
    options over an earlier one's, a file the user cannot read skipped (pip does so)."""
    merged: dict[str, str] = {}
    for rel in files:
        p = configparser.RawConfigParser()
        p.read(rootfs / rel)
        if p.has_section("global"):
            merged.update(p.items("global"))
    return merged


def test_no_pip_credential_in_a_file_an_unprivileged_user_of_the_node_reads(rootfs, host_pip):
    node._customise(rootfs, image.host_carry())
    assert _leaks(rootfs) == []
    public = rootfs / "etc/pip.conf"
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    # Everyone: the same sources, without the credentials (a 401 from the index, not another index).
    everyone = _pip_view(rootfs, "etc/pip.conf")
    assert everyone["index-url"] == "https://pypi.example.test/simple"
    assert everyone["extra-index-url"] == "https://pypi.org/simple https://extra.example.test/simple"
    assert everyone["proxy"] == "proxy.example.test:3128"
    assert everyone["trusted-host"] == "pypi.example.test"
    # Root (and the cluster user's copy of root's file): the whole configuration.
    _private(rootfs / node.ROOT_PIP_CONF)
    root = _pip_view(rootfs, "etc/pip.conf", node.ROOT_PIP_CONF)
    assert root["index-url"] == f"https://deployer:{TOKEN}@pypi.example.test/simple"
    assert root["extra-index-url"] == f"https://pypi.org/simple https://{TOKEN}@extra.example.test/simple"
    assert root["proxy"] == f"proxyuser:{PROXY_PASS}@proxy.example.test:3128"
    assert "trusted-host" not in _pip_view(rootfs, node.ROOT_PIP_CONF)  # only what carries a credential


def test_pip_reads_root_s_own_file_after_etc_pip_conf(monkeypatch):
    # The split works only if pip reads the files where the driver puts them, the user's
    # own over the global one: pip's own list, as root on a node sees it.
    from pip._internal.configuration import OVERRIDE_ORDER, get_configuration_files

    monkeypatch.setenv("HOME", "/root")
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_DIRS", raising=False)
    files = get_configuration_files()
    assert "/etc/pip.conf" in files["global"] and "/" + node.ROOT_PIP_CONF in files["user"]
    assert OVERRIDE_ORDER.index("user") > OVERRIDE_ORDER.index("global")


def test_a_host_without_pip_credentials_gets_one_file_as_before(rootfs, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "https://pypi.example.test/simple")
    for key in ("PIP_EXTRA_INDEX_URL", "PIP_PROXY", "PIP_TRUSTED_HOST", "PIP_FIND_LINKS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(runtime_env, "WHEELHOUSE", tmp_path / "no-wheelhouse")
    carry = image.host_carry()
    assert carry.private == ""
    node._customise(rootfs, carry)
    assert not (rootfs / node.ROOT_PIP_CONF).exists()
    assert _pip_view(rootfs, "etc/pip.conf")["index-url"] == "https://pypi.example.test/simple"
    assert "Credentials" not in (rootfs / "etc/pip.conf").read_text()


@pytest.fixture
def host_apt(tmp_path, monkeypatch):
    """The host's /etc/apt: a Debian source behind a login, an authenticated proxy, and a
    plain source."""
    apt = tmp_path / "host-apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "apt.conf.d").mkdir()
    (apt / "sources.list").write_text(f"deb https://aptuser:{APT_PASS}@deb.example.test/debian bookworm main\n")
    (apt / "sources.list.d/updates.list").write_text("deb http://deb.debian.org/debian bookworm-updates main\n")
    (apt / "apt.conf.d/01proxy").write_text(f'Acquire::http::Proxy "http://proxyuser:{PROXY_PASS}@proxy.example.test:3128/";\n')
    monkeypatch.setattr(image, "HOST_APT", apt)
    return apt


def test_no_apt_credential_in_a_file_an_unprivileged_user_of_the_node_reads(rootfs, host_apt):
    image._carry_apt(rootfs)
    assert _leaks(rootfs) == []
    etc_apt = rootfs / "etc/apt"
    assert (etc_apt / "sources.list").read_text() == "deb https://deb.example.test/debian bookworm main\n"
    assert (etc_apt / "sources.list.d/updates.list").read_text() == "deb http://deb.debian.org/debian bookworm-updates main\n"
    assert (etc_apt / "apt.conf.d/01proxy").read_text() == 'Acquire::http::Proxy "http://proxy.example.test:3128/";\n'
    auth = etc_apt / image.APT_AUTH_FILE
    _private(auth)
    # apt_auth.conf(5): a machine without a protocol matches https only, so each names its own.
    lines = [line for line in auth.read_text().splitlines() if not line.startswith("#")]
    assert lines == [
        f"machine https://deb.example.test/debian login aptuser password {APT_PASS}",
        f"machine http://proxy.example.test:3128 login proxyuser password {PROXY_PASS}",
    ]


def test_the_image_is_made_again_only_when_credentials_come_out_of_it(host_apt):
    def old_digest() -> str:  # the digest before credentials were taken out: the host's files as they are
        import hashlib

        sources, proxies = image._host_apt_files()
        text = "\n".join(f"{p.name}\n{p.read_text()}" for p in sources + proxies)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    assert image._host_apt_digest() != old_digest()  # an image holding the credentials is made again
    (host_apt / "sources.list").write_text("deb https://deb.example.test/debian bookworm main\n")
    (host_apt / "apt.conf.d/01proxy").write_text('Acquire::http::Proxy "http://proxy.example.test:3128/";\n')
    assert image._host_apt_digest() == old_digest()  # none to take out: the image stays


def test_a_private_file_is_never_readable_by_others_even_when_it_was(tmp_path):
    f = tmp_path / "d" / "secret.conf"
    f.parent.mkdir()
    f.write_text("old\n")
    f.chmod(0o644)
    image.write_private(f, "new\n")
    assert f.read_text() == "new\n" and stat.S_IMODE(f.stat().st_mode) == 0o600
    image.write_private(tmp_path / "e" / "f" / "secret.conf", "x\n")
    assert stat.S_IMODE((tmp_path / "e" / "f").stat().st_mode) == 0o700
