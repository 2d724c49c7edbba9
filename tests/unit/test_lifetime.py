"""deployer.lifetime, deployer.ledger and deployer.gc on their own: TTLs, expiries,
node-hours across month ends, and which state dirs have expired."""

from __future__ import annotations

import json

import pytest

from deployer import gc, ledger, lifetime
from deployer.errors import UsageError
from deployer.records import Lifetime, Origin
from deployer.spec import ClusterSpec, build_spec
from deployer.state import ClusterState

from ..clusters import typed

T0 = lifetime.parse_iso("2026-11-23T12:00:00Z")


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("8h", 28800), ("2d", 172800), ("1w", 604800), (" 8H ", 28800)])
def test_durations(text, seconds):
    assert lifetime.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "value, fragment",
    [("0", "must be a duration"), ("0h", "is no lifetime"), ("banana", "not 'banana'"), ("8", "not '8'"),
     ("-1h", "must be a duration"), ("15d", "beyond the maximum of 14d"), ("3w", "beyond the maximum")],
)
def test_bad_ttls_are_one_line_naming_the_form(value, fragment):
    with pytest.raises(UsageError, match="--ttl: .*" + fragment.replace("(", r"\(")):
        build_spec(None, None, ttl=value)


def test_none_means_no_expiry_and_the_maximum_is_the_operators(monkeypatch):
    assert build_spec(None, None, ttl="none").ttl is None and build_spec(None, None).ttl is None
    monkeypatch.setenv(lifetime.MAX_ENV, "30d")
    assert build_spec(None, None, ttl="21d").ttl == "21d"
    monkeypatch.setenv(lifetime.MAX_ENV, "forever")
    with pytest.raises(UsageError, match=r"\$DEPLOYER_TTL_MAX: must be a duration"):
        build_spec(None, None, ttl="1h")


def test_expiry_is_set_on_creation_kept_by_a_plain_rerun_and_reset_by_ttl():
    first = lifetime.next_record("8h", None, ttl_given=False, at=T0)
    assert first == Lifetime(ttl="8h", set_at="2026-11-23T12:00:00Z", expires_at="2026-11-23T20:00:00Z")
    later = lifetime.parse_iso("2026-11-23T15:00:00Z")
    assert lifetime.next_record("8h", first, ttl_given=False, at=later) is first  # plain re-run
    assert lifetime.next_record("8h", first, ttl_given=True, at=later).expires_at == "2026-11-23T23:00:00Z"  # --ttl 8h again
    assert lifetime.next_record("1h", first, ttl_given=False, at=later).expires_at == "2026-11-23T16:00:00Z"  # spec changed
    assert lifetime.next_record(None, first, ttl_given=True, at=later) is None  # --ttl none


def test_time_left_reads_well():
    rec = lifetime.next_record("8h", None, ttl_given=True, at=T0)
    assert lifetime.describe_left(rec, lifetime.parse_iso("2026-11-23T12:05:30Z")).startswith("expires in 7h 54m")
    assert lifetime.describe_left(rec, lifetime.parse_iso("2026-11-23T20:03:00Z")).startswith("expired 3m 00s ago")
    assert lifetime.describe_left(None, T0) is None
    assert lifetime.human(2 * 86400 + 5 * 3600) == "2d 5h" and lifetime.human(42) == "42s"


def _cluster(n, gpus=0, flavor="m1.large"):
    return typed({"provider": "openstack", "machine": {"flavor": flavor},
                  "nodes": [{"name": f"c-{i}", "gpus": gpus} for i in range(n)]})


def test_the_ledger_integrates_nodes_over_time_and_splits_months(tmp_path):
    st = ClusterState(tmp_path, "gpu8")
    at = lambda s: lifetime.parse_iso(s)  # noqa: E731
    assert ledger.note(st, _cluster(8, gpus=1, flavor="g1.v100"), at("2026-10-31T22:00:00Z"))["event"] == "create"
    assert ledger.note(st, _cluster(8, gpus=1, flavor="g1.v100"), at("2026-10-31T23:00:00Z")) is None  # same size: no entry
    assert ledger.note(st, _cluster(4, gpus=1, flavor="g1.v100"), at("2026-11-01T02:00:00Z"))["event"] == "scale"
    assert ledger.note_down(st, "openstack", at("2026-11-01T04:00:00Z"))["nodes"] == 0
    assert ledger.note_down(st, "openstack", at("2026-11-01T05:00:00Z")) is None  # already down
    ledger.note(ClusterState(tmp_path, "cpu"), _cluster(2), at("2026-11-01T00:00:00Z"))  # still up
    use = ledger.usage(ledger.entries(tmp_path), at("2026-11-01T10:00:00Z"))
    by = {c["cluster"]: c for c in use["clusters"]}
    # 8 nodes x 4h (22:00-02:00), then 4 nodes x 2h = 40 node-hours; one GPU each.
    assert by["gpu8"]["node_hours"] == 40 and by["gpu8"]["gpu_hours"] == 40 and by["gpu8"]["live"] is False
    assert by["gpu8"]["flavor"] == "g1.v100" and by["gpu8"]["destroyed"] == "2026-11-01T04:00:00Z"
    assert by["cpu"]["node_hours"] == 20 and by["cpu"]["gpu_hours"] == 0 and by["cpu"]["live"] is True
    # October: 8 x 2h; November: 8 x 2h + 4 x 2h + the CPU cluster's 20.
    assert use["months"] == [{"month": "2026-10", "node_hours": 16.0, "gpu_hours": 16.0},
                             {"month": "2026-11", "node_hours": 44.0, "gpu_hours": 24.0}]


def test_a_torn_ledger_line_is_skipped(tmp_path):
    ledger.note(ClusterState(tmp_path, "a"), _cluster(1), T0)
    with ledger.path(tmp_path).open("a") as f:
        f.write('{"time": "2026-11-23T13:00:00Z", "clus')
    assert [e["cluster"] for e in ledger.entries(tmp_path)] == ["a"]


def test_gc_lists_state_dirs_whose_expiry_is_past(tmp_path):
    for name, expires in (("old", "2026-11-23T11:00:00Z"), ("fresh", "2026-11-23T13:00:00Z")):
        st = ClusterState(tmp_path, name)
        st.write_lifetime(Lifetime(**{"ttl": "1h", "set_at": "x", "expires_at": expires}))
        st.write_origin(Origin(**{"provider": "local", "terraform_env": {}, "cluster_id": "aaaaaaaaaaaa"}))
    ClusterState(tmp_path, "forever").write_spec(ClusterSpec(name="forever"))
    (tmp_path / "ledger.jsonl").write_text("")  # a file in the state root is no cluster
    found = gc.from_state(tmp_path, T0)
    assert [(e.name, e.provider, e.in_state) for e in found] == [("old", "local", True)]
    assert json.loads(json.dumps(found[0].to_json()))["expires_at"] == "2026-11-23T11:00:00Z"


def test_gc_reads_the_expiry_again_under_the_lock_before_destroying(tmp_path, monkeypatch):
    # gc lists, then destroys; an `up --ttl 8h` in between extended the cluster: kept.
    st = ClusterState(tmp_path, "lab")
    st.write_origin(Origin(**{"provider": "local", "terraform_env": {}, "cluster_id": "aaaaaaaaaaaa"}))
    st.write_lifetime(Lifetime(**{"ttl": "1h", "set_at": "x", "expires_at": "2026-11-23T11:00:00Z"}))
    listed = gc.find(tmp_path, None, T0)  # the read gc acts on
    assert [e.name for e in listed] == ["lab"]
    extended = lifetime.next_record("8h", None, ttl_given=True, at=lifetime.now())
    st.write_lifetime(extended)
    monkeypatch.setattr(gc, "find", lambda root, cloud, at: listed)
    results = gc.collect_and_act(tmp_path, cloud=None, destroy=True, dry_run=False)
    assert [r["action"] for r in results] == ["kept: extended"]
    assert st.origin_file.exists() and st.lifetime_file.exists()  # nothing destroyed


def test_down_for_gc_refuses_a_cluster_with_no_expiry_any_more(tmp_path):
    from deployer import lifecycle

    st = ClusterState(tmp_path, "lab")
    st.write_origin(Origin(**{"provider": "local", "terraform_env": {}, "cluster_id": "aaaaaaaaaaaa"}))
    with pytest.raises(lifecycle.NoLongerExpired, match="no expiry any more"):
        lifecycle.down(st, only_if_expired=True)
    assert st.origin_file.exists()
