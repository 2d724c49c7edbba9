"""The local driver when something fails or races (issue 44: items 4, 6 and 8).

LXC here is a fake on PATH backed by a folder of the test's own (a container is a
directory with a `state` file): no container, bridge or nftables table of the host is
touched, and nothing is created on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from deployer.providers.local import host, network, node
from deployer.providers.local import provider as local
from deployer.records import Origin
from deployer.state import ClusterState

ID = "aaaaaaaaaaaa"


def _script(bindir: Path, name: str, body: str) -> None:
    (bindir / name).write_text("#!/bin/sh\n" + body)
    (bindir / name).chmod(0o755)


@pytest.fixture
def fake_lxc(tmp_path, monkeypatch):
    """lxc-ls / lxc-info / lxc-start / lxc-stop / lxc-destroy over tmp/lxc; every call is
    logged in tmp/calls. `broken` (a file) makes lxc-info fail as a broken LXC does."""
    lxc, bindir = tmp_path / "lxc", tmp_path / "bin"
    lxc.mkdir()
    bindir.mkdir()
    calls = tmp_path / "calls"
    broken = tmp_path / "broken"
    log = f'echo "$(basename "$0") $*" >> {calls}\n'
    _script(bindir, "lxc-ls", log + f'[ "$2" = --running ] && exit 0\nls {lxc}\n')
    _script(bindir, "lxc-info", log + (
        f'if [ -e {broken} ]; then echo "Failed to load config for $2: Permission denied" >&2; exit 1; fi\n'
        f'if [ -d {lxc}/"$2" ]; then cat {lxc}/"$2"/state 2>/dev/null || echo STOPPED; exit 0; fi\n'
        'echo "$2 doesn\'t exist" >&2; exit 1\n'))
    _script(bindir, "lxc-start", log + f'echo RUNNING > {lxc}/"$2"/state\n')
    _script(bindir, "lxc-stop", log)
    _script(bindir, "lxc-destroy", log + f'rm -rf {lxc}/"$2"\n')
    _script(bindir, "nft", log + 'echo "Error: No such file or directory" >&2; exit 1\n')
    _script(bindir, "ip", log)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setattr(node, "LXC_PATH", lxc)
    # Never the host's own switch and mark.
    monkeypatch.setattr(network, "IP_FORWARD", tmp_path / "ip_forward")
    monkeypatch.setattr(network, "FORWARD_MARK", tmp_path / "forward-mark")
    monkeypatch.setattr(network, "NETWORK_LOCK", tmp_path / "network.lock", raising=False)
    monkeypatch.setattr(local, "CLAIMS_DIR", tmp_path / "claims")
    return lxc, calls, broken


def _container(lxc: Path, name: str, cluster_id: str | None = ID, iid: str | None = None, state: str = "STOPPED") -> Path:
    d = lxc / name
    (d / "upper/home/deployer").mkdir(parents=True)
    (d / "upper/home/deployer/work.txt").write_text("a week of results\n")
    (d / "state").write_text(state + "\n")
    if cluster_id:
        (d / node.CLUSTER_ID_FILE).write_text(cluster_id + "\n")
    if iid:
        seed = d / "upper/var/lib/cloud/seed/nocloud"
        seed.mkdir(parents=True)
        (seed / "meta-data").write_text(f"instance-id: {iid}\nlocal-hostname: {name}\n")
    return d


def _node_up(tmp_path: Path, name: str, iid: str | None) -> node.NodeUp:
    user_data = tmp_path / f"{name}.user-data"
    user_data.write_text("#cloud-config\n")
    return node.NodeUp(name=name, ip="10.99.0.10/24", gateway="10.99.0.1", bridge="dpl-lab",
                       shared=f"{tmp_path / 'shared'}:/shared", memory_mb=512, user_data=str(user_data),
                       cluster_id=ID, instance_id=iid)


# -- item 4: a probe that cannot answer is not "absent" ------------------------------------
def test_lxc_info_saying_doesnt_exist_is_absent(fake_lxc):
    assert node.node_state("lab-master") == "ABSENT"


def test_a_failing_lxc_info_is_no_answer_and_the_node_is_not_rebuilt(fake_lxc, tmp_path, monkeypatch):
    lxc, calls, broken = fake_lxc
    d = _container(lxc, "lab-master", iid="old")
    broken.touch()
    rebuilt = []
    monkeypatch.setattr(node, "node_create", lambda *a, **k: rebuilt.append(a[0]))
    with pytest.raises(host.DriverError, match="cannot tell whether container lab-master exists.*Permission denied"):
        node.node_up(_node_up(tmp_path, "lab-master", "old"))
    assert rebuilt == []
    assert (d / "upper/home/deployer/work.txt").read_text() == "a week of results\n"


def test_a_failing_lxc_info_does_not_let_down_delete_the_directory(fake_lxc):
    lxc, calls, broken = fake_lxc
    d = _container(lxc, "lab-master", iid="old")
    broken.touch()
    with pytest.raises(host.DriverError, match="cannot tell whether container lab-master exists"):
        node.node_down("lab-master", ID)
    assert (d / "upper/home/deployer/work.txt").exists()


# -- item 8: a node whose creation failed is still ours ------------------------------------
def test_down_removes_the_containers_a_failed_creation_left(fake_lxc, tmp_path):
    """After `up` made the containers and lxc-start aborted, Terraform's state holds the
    nodes as tainted, and Terraform runs no destroy provisioner for a tainted resource:
    `down` destroyed the state and then refused ("down left node ... behind")."""
    from deployer import lifecycle

    lxc, calls, broken = fake_lxc
    for n in ("lab-master", "lab-worker-1"):
        _container(lxc, n, iid=f"iid-{n}")
    theirs = _container(lxc, "lab-worker-2", cluster_id="bbbbbbbbbbbb")  # a same-named cluster's: not ours
    st = ClusterState(tmp_path / "state", "lab")
    st.write_origin(Origin(**{"provider": "local", "terraform_env": {}, "cluster_id": ID}))
    assert lifecycle.down(st) is True
    assert sorted(p.name for p in lxc.iterdir()) == ["lab-worker-2"]  # only the other cluster's is left
    assert theirs.is_dir() and (theirs / "upper/home/deployer/work.txt").exists()
    assert not st.origin_file.exists()


def test_the_next_up_remakes_a_node_its_failed_creation_left(fake_lxc, tmp_path, monkeypatch):
    """Terraform replaces the tainted node with a new id (a new instance-id); the container
    left behind by the failed creation carries the old one: made anew, not started as it is."""
    lxc, calls, broken = fake_lxc
    _container(lxc, "lab-master", iid="5f0c9a1e-failed-creation")
    made = []

    def create(name, *a, **k):
        made.append((name, a[-2]))  # (name, instance id)
        (lxc / name).mkdir()

    monkeypatch.setattr(node, "node_create", create)
    node.node_up(_node_up(tmp_path, "lab-master", "7d2e4b6a-terraform-now"))
    assert made == [("lab-master", "7d2e4b6a-terraform-now")]
    assert "lxc-start -n lab-master" in calls.read_text()


def test_a_stopped_node_of_the_same_id_is_only_started(fake_lxc, tmp_path, monkeypatch):
    # repair after a host reboot: the recorded id, the node's own data kept.
    lxc, calls, broken = fake_lxc
    d = _container(lxc, "lab-master", iid="0b1c2d3e")
    monkeypatch.setattr(node, "node_create", lambda *a, **k: pytest.fail("rebuilt a node that only had to start"))
    node.node_up(_node_up(tmp_path, "lab-master", "0b1c2d3e"))
    # One made before Terraform's ids were seeded (the driver's own id): kept, started.
    shutil.rmtree(d)
    d = _container(lxc, "lab-master", iid="iid-lab-master-0123456789ab")
    node.node_up(_node_up(tmp_path, "lab-master", "0b1c2d3e"))
    assert (d / "upper/home/deployer/work.txt").exists()
    assert "lxc-start -n lab-master" in calls.read_text()


# -- item 6: races between two local clusters --------------------------------------------
def test_the_ruleset_is_replaced_in_one_transaction(monkeypatch, tmp_path):
    """No `nft delete table` before the load: one `nft -f` text that declares, deletes and
    defines the table, so there is no moment without the drop and reject rules."""
    monkeypatch.setattr(network, "IP_FORWARD", tmp_path / "ip_forward")
    monkeypatch.setattr(network, "FORWARD_MARK", tmp_path / "mark")
    monkeypatch.setattr(network, "NETWORK_LOCK", tmp_path / "network.lock", raising=False)
    (tmp_path / "ip_forward").write_text("1\n")
    nft: list[tuple[list[str], str | None]] = []

    def run(argv, input=None, **kw):
        if argv[0] == "nft":
            nft.append((list(argv), input))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    network.network_up(network.NetworkUp("lab", "dpl-lab", "10.77.0.0/24", "10.77.0.1/24", "10.77.0.10"))
    assert [a for a, _ in nft] == [["nft", "-f", "-"]], nft
    text = nft[0][1]
    assert text == network.transaction("lab", "dpl-lab", "10.77.0.0/24", "10.77.0.10")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert lines[:2] == ["table ip deployer_lab", "delete table ip deployer_lab"]
    assert 'oifname "dpl-lab" drop' in text and "ct state new reject" in text


@pytest.mark.skipif(shutil.which("nft") is None or os.geteuid() != 0, reason="needs nft and root (nft -c parses against the kernel)")
@pytest.mark.parametrize("only_master", [None, "10.77.0.10"])
def test_nft_accepts_the_transaction(only_master):
    # -c: checked against the kernel, nothing committed; the table need not exist.
    text = network.transaction("zzcheck", "dpl-zzcheck", "10.77.0.0/24", only_master)
    p = subprocess.run(["nft", "-c", "-f", "-"], input=text, text=True, capture_output=True)
    assert p.returncode == 0, p.stderr


def test_another_clusters_down_cannot_switch_forwarding_off_under_an_up(monkeypatch, tmp_path):
    """Cluster b's `down` lands while cluster a's `up` has checked ip_forward but has not
    loaded its table yet: b saw no other deployer table and switched forwarding off."""
    switch = tmp_path / "ip_forward"
    monkeypatch.setattr(network, "IP_FORWARD", switch)
    monkeypatch.setattr(network, "FORWARD_MARK", tmp_path / "mark")
    monkeypatch.setattr(network, "NETWORK_LOCK", tmp_path / "network.lock", raising=False)
    switch.write_text("0\n")
    tables = {"deployer_b"}
    gate = threading.Lock()
    down: list[threading.Thread] = []

    def run(argv, input=None, **kw):
        with gate:
            if argv[:3] == ["nft", "list", "tables"]:
                return subprocess.CompletedProcess(argv, 0, "".join(f"table ip {t}\n" for t in sorted(tables)), "")
            if argv[:3] == ["nft", "delete", "table"]:
                tables.discard(argv[4])
            if argv[:2] == ["nft", "-f"] and "deployer_a" in (input or "") and not down:
                # b's down arrives now, while a is between its check and its table.
                t = threading.Thread(target=network.network_down, args=("b", "dpl-b"))
                down.append(t)
                t.start()
        if argv[:2] == ["nft", "-f"]:
            t.join(timeout=1.0)
            with gate:
                tables.add("deployer_a")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    network.network_up(network.NetworkUp("a", "dpl-a", "10.77.0.0/24", "10.77.0.1/24"))
    down[0].join(timeout=5)
    assert not down[0].is_alive()
    assert tables == {"deployer_a"}
    assert switch.read_text() == "1\n"  # a's nodes still reach the host's networks


def _claim_in_child(name: str, state_dir: Path, claims: Path, out: Path) -> None:
    local.CLAIMS_DIR = claims
    try:
        local.claim_name(name, state_dir)
        out.write_text("claimed")
    except local.PreflightError as e:
        out.write_text(f"refused: {e}")


def test_two_first_ups_of_one_name_over_a_stale_claim_cannot_both_take_it(tmp_path, monkeypatch):
    """A stale claim (its state dir records nothing any more) is given up: two `up`s of the
    name from two new state dirs both overwrote it and both went on. While the one that took
    it is still running (its record not written yet), the name is its."""
    claims = tmp_path / "claims"
    monkeypatch.setattr(local, "CLAIMS_DIR", claims)
    claims.mkdir()
    (claims / "lab").write_text(f"{tmp_path / 'gone' / 'lab'}\n")  # a holder that records nothing
    first, second = tmp_path / "a" / "lab", tmp_path / "b" / "lab"
    local.claim_name("lab", first)  # this process: alive, between preflight and its first record
    with pytest.raises(local.PreflightError, match="in use on this machine by the state dir"):
        local.claim_name("lab", second)
    assert local.claim_holder("lab") == first.resolve()
    # Once the process that claimed it is gone and nothing was recorded, it is free again.
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    out = tmp_path / "out"
    p = ctx.Process(target=_claim_in_child, args=("lab2", first, claims, out))
    p.start()
    p.join(10)
    assert out.read_text() == "claimed"
    local.claim_name("lab2", second)
    assert local.claim_holder("lab2") == second.resolve()
