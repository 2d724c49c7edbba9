"""deployer.bench.datasets: the catalog, bad input, the space check, digits written from scikit-learn's
copy, manifest verification, and the fetch command run for real (bash, curl, md5sum, tar) on an
archive served from a file:// URL, stopped half-way and resumed."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from deployer.bench import datasets
from deployer.errors import RecordError, UsageError


# --- the catalog and bad input --------------------------------------------------------
def test_catalog_names_and_facts():
    assert sorted(datasets.CATALOG) == ["cifar10", "digits", "imagenet"]
    cifar = datasets.resolve("cifar10")
    assert cifar.archive.url == "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
    assert cifar.archive.md5 == "c32a1d4ab5d03f1284b67883e8d87530"
    assert cifar.archive.bytes == 170_052_171
    assert cifar.bytes == 60_000 * 3073  # six batches of 10,000 records of 1 + 3*32*32 bytes
    assert datasets.resolve("digits").bytes == 1797 * 65
    assert datasets.resolve("imagenet").bytes is None  # the user's folder decides
    assert "scikit-learn" in datasets.resolve("digits").source
    assert "user provides" in datasets.resolve("imagenet").source
    for ds in datasets.CATALOG.values():
        assert ds.format in datasets.FORMATS
        assert 0 < ds.training.target_acc <= 1 and ds.training.stem in ("cifar", "imagenet")


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(UsageError, match=r"unknown dataset 'mnist': use one of cifar10, digits, imagenet") as e:
        datasets.resolve("mnist")
    assert e.value.exit_code == 2 and "\n" not in str(e.value)


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, 90])
def test_target_accuracy_outside_0_1(bad):
    with pytest.raises(UsageError, match=r"not a top-1 fraction in \(0, 1\]: use e\.g\. --target-acc 0\.9"):
        datasets.target_accuracy(bad)


@pytest.mark.parametrize("good", [1e-6, 0.5, 0.9, 1])
def test_target_accuracy_inside(good):
    assert datasets.target_accuracy(good) == good


# --- space ----------------------------------------------------------------------------
def test_space_needed_counts_archive_and_extracted_less_a_partial_download():
    cifar = datasets.resolve("cifar10")
    assert datasets.space_needed(cifar) == 170_052_171 + 184_380_000
    assert datasets.space_needed(cifar, partial=52_171) == 170_000_000 + 184_380_000
    assert datasets.space_needed(datasets.resolve("digits")) == 116_805
    assert datasets.space_needed(datasets.resolve("imagenet"), source_bytes=5) == 5
    with pytest.raises(UsageError, match="deployer data import PATH"):
        datasets.space_needed(datasets.resolve("imagenet"))


def test_not_enough_space_names_both_sizes():
    with pytest.raises(UsageError) as e:
        datasets.check_space(354_432_171, 100 * 2**20, "/shared/datasets/cifar10", "cifar10")
    msg = str(e.value)
    assert "not enough space for cifar10 in /shared/datasets/cifar10" in msg
    assert "338.0 MiB (354432171 bytes)" in msg and "100.0 MiB (104857600 bytes) are free" in msg
    assert e.value.exit_code == 2
    datasets.check_space(10, 10, "/x", "digits")  # exactly enough is enough


def test_free_space_command_runs_here(tmp_path):
    cmd = datasets.free_space_cmd(str(tmp_path / "new dir"))
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert datasets.parse_free_space(out) == pytest.approx(shutil.disk_usage(tmp_path).free, rel=0.01)


# --- digits ---------------------------------------------------------------------------
def test_digits_split_is_stratified_fixed_and_complete():
    _, labels = datasets.read_digits()
    train, test = datasets.stratified_split(labels, 360)
    assert (len(train), len(test)) == (1437, 360)
    assert sorted(train + test) == list(range(1797))
    for c in range(10):  # each class keeps its share of the test split, within one image
        share = labels.count(c) * 360 / 1797
        assert abs(sum(labels[i] == c for i in test) - share) < 1
    assert datasets.stratified_split(labels, 360) == (train, test)  # the same every time


def test_digits_round_trip_matches_sklearn(tmp_path):
    sk = pytest.importorskip("sklearn.datasets").load_digits()
    m = datasets.write_digits(tmp_path)
    assert m["shape"] == [1, 8, 8] and m["format"] == "cifar-binary" and m["augment"]["flip"] is False
    assert m["splits"]["train"]["samples"] == 1437 and m["splits"]["test"]["samples"] == 360
    assert datasets.read_manifest(tmp_path) == m
    train_ix, test_ix = datasets.stratified_split(sk.target.tolist(), 360)
    for split, ix in (("train", train_ix), ("test", test_ix)):
        data = (tmp_path / f"{split}.bin").read_bytes()
        assert len(data) == len(ix) * 65
        for k, i in enumerate(ix):
            rec = data[k * 65:(k + 1) * 65]
            assert rec[0] == sk.target[i]
            assert list(rec[1:]) == [(int(v) * 255 + 8) // 16 for v in sk.images[i].ravel()]
    assert datasets.verify(tmp_path) == []
    # the same bytes on every machine
    again = datasets.write_digits(tmp_path / "again")
    assert again["files"] == m["files"]


def test_verify_catches_a_corrupted_and_a_missing_file(tmp_path):
    datasets.write_digits(tmp_path)
    data = bytearray((tmp_path / "test.bin").read_bytes())
    data[100] ^= 0xFF  # one pixel, same size
    (tmp_path / "test.bin").write_bytes(bytes(data))
    assert datasets.verify(tmp_path) == ["test.bin: sha256 differs from the manifest (damaged or changed)"]
    (tmp_path / "train.bin").write_bytes(b"x" * 65)
    assert "train.bin: 65 bytes, the manifest says 93405" in datasets.verify(tmp_path)
    (tmp_path / "train.bin").unlink()
    assert "train.bin: missing" in datasets.verify(tmp_path)


def test_manifest_missing_or_damaged(tmp_path):
    with pytest.raises(UsageError, match=r"no dataset in .* \(no dataset.json\): fetch one with `deployer data fetch NAME`"):
        datasets.read_manifest(tmp_path)
    (tmp_path / "dataset.json").write_text("{half")
    with pytest.raises(RecordError, match="not a readable dataset manifest"):
        datasets.read_manifest(tmp_path)
    (tmp_path / "dataset.json").write_text(json.dumps({"schema": 99, "format": "cifar-binary"}))
    with pytest.raises(RecordError, match="not a schema-1 dataset manifest"):
        datasets.read_manifest(tmp_path)


def test_imagefolder_manifest_counts_classes_and_images(tmp_path):
    for split, per_class in (("train", 3), ("val", 1)):
        for cls in ("n02", "n01"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(per_class):
                (tmp_path / split / cls / f"{i}.JPEG").write_bytes(b"")
    (tmp_path / "train" / "n01" / "notes.txt").write_text("not an image")
    m = datasets.imagefolder_manifest(tmp_path)
    assert m["format"] == "imagefolder" and m["classes"] == ["n01", "n02"]
    assert m["splits"] == {"train": {"dir": "train", "samples": 6}, "test": {"dir": "val", "samples": 2}}
    datasets.write_manifest(tmp_path, m)
    assert datasets.verify(tmp_path) == []
    (tmp_path / "val" / "n01" / "0.JPEG").unlink()
    assert datasets.verify(tmp_path) == ["test: 1 images in val/, the manifest says 2"]
    with pytest.raises(UsageError, match="has no train/ folder"):
        datasets.imagefolder_manifest(tmp_path / "val")


# --- the fetch command, run for real against a file:// archive ------------------------
def tiny_cifar(tmp_path: Path) -> tuple[datasets.Dataset, Path]:
    """A 3-class, 4x4 RGB cifar-binary dataset packed like CIFAR-10's archive, served from a file:// URL."""
    top = "tiny-batches-bin"
    rec = 1 + 3 * 4 * 4
    members = {f"{top}/data_batch_1.bin": bytes(range(rec)) * 5, f"{top}/data_batch_2.bin": bytes(rec) * 4,
               f"{top}/test_batch.bin": bytes([2] + [7] * (rec - 1)) * 3, f"{top}/batches.meta.txt": b"a\nb\nc\n"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive = tmp_path / "server" / "tiny-binary.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(buf.getvalue())
    base = datasets.resolve("cifar10")
    ds = dataclasses.replace(
        base, name="tiny", shape=(3, 4, 4), classes=("a", "b", "c"), train_samples=9, test_samples=3,
        splits={"train": (f"{top}/data_batch_1.bin", f"{top}/data_batch_2.bin"), "test": (f"{top}/test_batch.bin",)},
        archive=datasets.Archive(url=archive.as_uri(), file=archive.name, bytes=len(buf.getvalue()),
                                 md5=hashlib.md5(buf.getvalue()).hexdigest(),
                                 sha256=hashlib.sha256(buf.getvalue()).hexdigest(), top=top))
    return ds, archive


def bash(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_fetch_resumes_checks_extracts_and_the_manifest_verifies(tmp_path):
    ds, archive = tiny_cifar(tmp_path)
    dest = tmp_path / "shared" / "datasets" / "tiny"
    dest.mkdir(parents=True)
    (dest / archive.name).write_bytes(archive.read_bytes()[:100])  # a download stopped after 100 bytes
    cmd = datasets.fetch_cmd(ds, str(dest))
    assert "curl -fsSL --retry 5 --retry-delay 10 -C - -o tiny-binary.tar.gz" in cmd
    assert f"echo '{ds.archive.md5}  tiny-binary.tar.gz' | md5sum -c --status" in cmd
    p = bash(cmd)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert not (dest / archive.name).exists() and not (dest / ".extract").exists()
    files = datasets.parse_files(p.stdout)
    assert sorted(files) == sorted(f for split in ds.splits.values() for f in split)
    for name, f in files.items():
        assert f == {"bytes": (dest / name).stat().st_size, "sha256": datasets.sha256_file(dest / name)}
    m = datasets.manifest(ds, files)
    p = bash(datasets.write_manifest_cmd(str(dest), m))
    assert p.returncode == 0, p.stderr
    assert datasets.read_manifest(dest) == m and datasets.verify(dest) == []
    # again: nothing is downloaded (the source is gone), the same files are listed
    archive.unlink()
    p = bash(cmd)
    assert p.returncode == 0, p.stderr
    assert datasets.parse_files(p.stdout) == files


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_fetch_removes_an_archive_that_fails_its_checksum(tmp_path):
    ds, archive = tiny_cifar(tmp_path)
    ds = dataclasses.replace(ds, archive=dataclasses.replace(ds.archive, md5="0" * 32))
    dest = tmp_path / "d"
    p = bash(datasets.fetch_cmd(ds, str(dest)))
    assert p.returncode == 1
    assert "tiny-binary.tar.gz: checksum mismatch (removed: run the fetch again)" in p.stderr
    assert not (dest / archive.name).exists() and not (dest / ds.archive.top).exists()


def test_fetch_of_a_dataset_with_nothing_to_download():
    with pytest.raises(UsageError, match="imagenet is not downloaded: user provides"):
        datasets.fetch_cmd(datasets.resolve("imagenet"), "/shared/datasets/imagenet")
