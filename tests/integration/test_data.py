"""`deployer data` on the shared local cluster: digits fetched once onto the shared storage
through the master (and a second fetch copying nothing), a user's ImageFolder tree imported,
the listing, and the bad inputs a tired user types (exit 2, one line, nothing copied).
A folder larger than the shared storage's free space (a sparse file) is refused before
anything is copied. Not here: cifar10's download (no internet on this machine;
tests/unit/test_datasets.py runs its command against a file:// archive)."""

from __future__ import annotations

import json
import re

import pytest

from deployer.bench import datasets

pytestmark = pytest.mark.integration


def test_digits_are_fetched_once_onto_the_shared_storage(local_cluster):
    p = local_cluster.deployer("data", "fetch", "digits", "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout)
    assert got["path"] == "/shared/datasets/digits" and (got["train"], got["test"], got["classes"]) == (1437, 360, 10)
    on_host = local_cluster.state / "shared" / "datasets" / "digits"  # the master's /shared, bind-mounted
    assert datasets.verify(on_host) == [], "every file as the manifest says, sha256 and all"
    assert not (on_host.parent / "digits.partial").exists()
    again = local_cluster.deployer("data", "fetch", "digits", "--json", timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout)["fetched"] is False
    assert "already on the cluster" in again.stderr and "copied" not in again.stderr
    # every node reads it: the worker's view of /shared is the same files
    worker = local_cluster.cluster_output().workers[0].name
    p = local_cluster.deployer("ssh", worker, "--", "sha256sum /shared/datasets/digits/train.bin")
    assert p.returncode == 0 and p.stdout.split()[0] == json.loads((on_host / "dataset.json").read_text())["files"]["train.bin"]["sha256"]


def test_an_imagefolder_tree_is_imported_and_listed(local_cluster, tmp_path):
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            (tmp_path / split / cls / "a.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    p = local_cluster.deployer("data", "import", str(tmp_path), "--as", "pets", "--json", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["classes"] == 2
    m = datasets.read_manifest(local_cluster.state / "shared" / "datasets" / "pets")
    assert m["classes"] == ["cat", "dog"] and m["splits"]["train"]["samples"] == 2
    listed = json.loads(local_cluster.deployer("data", "list", "--json").stdout)
    assert {"digits", "pets"} <= {d["name"] for d in listed}


@pytest.mark.parametrize(("args", "says"), [
    (["fetch", "mnist"], "unknown dataset 'mnist': use one of cifar10, digits, imagenet"),
    (["fetch", "imagenet"], "deployer data import PATH --as imagenet"),
    (["import", "/no/such/folder"], "no such folder"),
    (["import", "/etc"], "name the dataset with --as"),
])
def test_bad_data_input_exits_2_and_copies_nothing(local_cluster, args, says):
    root = local_cluster.state / "shared" / "datasets"
    before = sorted(p.name for p in root.iterdir()) if root.exists() else []
    p = local_cluster.deployer("data", *args, timeout=120)
    assert p.returncode == 2, p.stderr
    assert [ln for ln in p.stderr.splitlines() if ln.strip()] == [ln for ln in p.stderr.splitlines() if says in ln], p.stderr
    assert (sorted(p.name for p in root.iterdir()) if root.exists() else []) == before


def test_a_dataset_larger_than_the_free_space_is_refused_before_copying(local_cluster, tmp_path):
    # a sparse file: 8 TiB by its size (ext4 allows 16), nothing on disk; the check reads sizes, not bytes
    for split in ("train", "val"):
        (tmp_path / split / "c").mkdir(parents=True)
    with open(tmp_path / "train" / "c" / "huge.jpg", "wb") as f:
        f.truncate(8 << 40)
    (tmp_path / "val" / "c" / "a.jpg").write_bytes(b"x")
    p = local_cluster.deployer("data", "import", str(tmp_path), "--as", "huge", timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not enough space for huge in /shared on the master: it needs 8192.0 GiB" in lines[0], p.stderr
    assert re.search(r"GiB \(\d+ bytes\) are free", lines[0]), lines[0]
    assert not (local_cluster.state / "shared" / "datasets" / "huge.partial").exists()
    assert not (local_cluster.state / "shared" / "datasets" / "huge").exists()


def test_bench_data_reaches_the_target_at_every_node_count(local_cluster):
    # after test_digits_are_fetched_once_onto_the_shared_storage (same module, file order)
    p = local_cluster.deployer("bench", "--data", "digits", "--target-acc", "0.9", "--nodes", "1,2", "--json", timeout=1800)
    assert p.returncode == 0, p.stderr[-4000:]
    report = json.loads(p.stdout)
    runs = {r["nodes"]: r for r in report["training"]["runs"]}
    assert set(runs) == {1, 2}, report["training"]
    for n, r in runs.items():
        assert r["reached"] and r["time_to_target_s"] > 0 and r["final_top1"] >= 0.9, (n, r)
    plots = {p.rsplit("/", 1)[-1] for p in report["files"]["plots"]}
    assert {"accuracy.png", "time_to_accuracy.png", "data_loading.png"} <= plots, plots
    for n, r in runs.items():
        # data loading: the same step on a batch in memory beside the epochs, and the reads
        assert r["compute_img_per_sec"] > 0 and r["loading_cost"] is not None and 0 <= r["data_wait_frac"] < 1, (n, r)
        assert r["read_mb_per_s"] > 0, (n, r)
        # the master's Prometheus answered: the host's disk (a bind mount: no NFS counters)
        st = r["storage"]
        assert st and st["master_disk_mb_per_s"] is not None and st["nfs_clients_mb_per_s"] is None, (n, st)
        assert "not NFS" in st["note"] and st["window_s"] >= st["run_s"]
    assert all((local_cluster.state / "bench" / report["run_id"] / f).is_file() for f in ("accuracy.png", "results.json"))
    print("time to 0.9 top-1 on digits: " + ", ".join(f"{n} node(s) {r['time_to_target_s']:.1f} s" for n, r in sorted(runs.items())))
    print("data loading cost: " + ", ".join(f"{n} node(s) {r['img_per_sec']:.1f} vs {r['compute_img_per_sec']:.1f} img/s in "
                                            f"memory ({r['loading_cost']:+.0%})" for n, r in sorted(runs.items())))


def test_a_dataset_imported_under_its_own_name_is_benched(local_cluster, tmp_path):
    datasets.write_digits(tmp_path / "mine")  # a folder with a dataset.json: imported as it is, renamed
    p = local_cluster.deployer("data", "import", str(tmp_path / "mine"), "--as", "mydigits", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    p = local_cluster.deployer("bench", "--data", "mydigits", "--nodes", "1", "--epochs", "1", "--target-acc", "0.5",
                               "--json", timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    report = json.loads(p.stdout)
    assert report["training"]["dataset"] == "mydigits" and report["versions"]["dataset"]["name"] == "mydigits"
    (run,) = report["training"]["runs"]
    assert run["epochs_run"] == 1 and run["history"][0]["top1"] > 0.1, run  # it learned: above chance


@pytest.mark.parametrize(("args", "says"), [
    (["--data", "mnist"], "unknown dataset 'mnist'"),
    (["--data", "digits", "--target-acc", "0"], "--target-acc 0 is not a top-1 fraction in (0, 1]"),
    (["--data", "digits", "--target-acc", "1.5"], "--target-acc 1.5 is not a top-1 fraction in (0, 1]"),
    (["--data", "cifar10"], "dataset cifar10 is not on the cluster: run `deployer data fetch cifar10` first"),
    (["--data", "digits", "--model", "resnet50"], "--model is for the synthetic benchmark"),
    (["--target-acc", "0.9"], "add --data NAME"),
])
def test_bad_bench_data_input_exits_2_and_runs_nothing(local_cluster, args, says):
    runs = sorted((local_cluster.state / "bench").iterdir()) if (local_cluster.state / "bench").exists() else []
    p = local_cluster.deployer("bench", *args, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and says in lines[0], p.stderr
    after = sorted((local_cluster.state / "bench").iterdir()) if (local_cluster.state / "bench").exists() else []
    assert after == runs, "no run was started"
