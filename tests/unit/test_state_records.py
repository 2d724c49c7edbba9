"""State records: a damaged or foreign one is one line naming the file, never a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from deployer import records
from deployer.errors import RecordError
from deployer.state import ClusterState

from ..clusters import typed


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"version": 1, "name": "demo", "nod', "is damaged (JSONDecodeError at 31)"),
        ("", "is damaged (JSONDecodeError at 0)"),
        ('{"version": 99}', "record version 99 is not 1"),
        ("[1, 2]", "record version None is not 1"),
    ],
)
def test_damaged_records_name_the_file(tmp_path, content, fragment):
    st = ClusterState(tmp_path, "demo")
    st.dir.mkdir(parents=True)
    st.cluster_file.write_text(content)
    with pytest.raises(RecordError, match=re.escape(fragment)) as e:
        st.cluster()
    assert str(st.cluster_file) in str(e.value) and e.value.exit_code == 1


def test_records_round_trip_atomically(tmp_path):
    st = ClusterState(tmp_path, "demo")
    cluster = typed({"name": "demo", "nodes": [{"name": "demo-master", "gpus": 1}, {"name": "demo-worker-1"}]})
    st.write_cluster(cluster)
    assert st.cluster() == cluster
    assert json.loads(st.cluster_file.read_text())["version"] == 1
    assert not list(st.dir.glob("*.tmp"))


def test_a_cluster_record_the_reader_cannot_type_is_one_error_naming_the_file(tmp_path):
    st = ClusterState(tmp_path, "demo")
    records.write(st.cluster_file, {"name": "demo", "provider": "local", "ssh_user": "u", "shared_dir": "/shared",
                                      "nodes": [{"name": "demo-worker-1", "role": "worker", "private_ip": "10.0.0.1"}]})
    with pytest.raises(RecordError, match="cluster.json: the first node, and only it, must be the master"):
        st.cluster()
    records.write(st.cluster_file, {"name": "demo", "nodes": [{"name": "demo-master", "role": "master", "private_ip": "10.0.0.1"}]})
    with pytest.raises(RecordError, match="cluster.json: the cluster output has no 'provider'"):
        st.cluster()


def test_status_on_a_truncated_cluster_json_is_one_line(tmp_path):
    d = tmp_path / ".deployer" / "demo"
    d.mkdir(parents=True)
    (d / "spec.json").write_text('{"version": 1, "spec": {}}')
    (d / "cluster.json").write_text('{"version": 1, "name": "de')
    p = subprocess.run([sys.executable, "-m", "deployer", "status"], cwd=tmp_path, text=True, capture_output=True, timeout=60)
    assert p.returncode == 1
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cluster.json is damaged" in lines[0] and "Traceback" not in p.stderr


def test_a_second_verb_is_refused_while_one_holds_the_lock_then_may_go(tmp_path):
    from deployer.errors import LockedError

    st = ClusterState(tmp_path, "lab")
    with st.lock("up"):
        with pytest.raises(LockedError, match=r"cluster 'lab' is busy \(up by pid \d+\)"):
            with st.lock("bench"):
                pass
    with st.lock("bench"):  # released: the next verb runs
        assert (st.dir / "lock").read_text().startswith("bench by pid")
