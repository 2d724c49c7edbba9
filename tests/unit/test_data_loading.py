"""benchmarks/data_loading.py on real digits: the cifar-binary reader against scikit-learn's
pixels, augmentation and resizing, and the sampler that shards an epoch with every sample once."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from deployer.bench import datasets

torch = pytest.importorskip("torch")
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import data_loading as dl  # noqa: E402 - from the benchmarks dir, as resnet_train.py imports it


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("digits")
    datasets.write_digits(root)
    return root


def test_reader_returns_sklearns_digits(digits):
    sk = pytest.importorskip("sklearn.datasets").load_digits()
    m = dl.load_manifest(str(digits))
    train_ix, test_ix = datasets.stratified_split(sk.target.tolist(), 360)
    for split, ix in (("train", train_ix), ("test", test_ix)):
        ds = dl.CifarBinary(str(digits), m, split, train=False)
        assert len(ds) == len(ix)
        assert ds.labels.tolist() == sk.target[ix].tolist()
        for k in (0, 1, len(ix) - 1):
            pixels, label = ds.raw(k)
            assert label == sk.target[ix[k]] and pixels.shape == (1, 8, 8)
            assert ((pixels.astype(int) * 16 + 127) // 255 == sk.images[ix[k]]).all()  # 0..255 back to 0..16


def test_test_images_normalised_and_unaugmented(digits):
    m = dl.load_manifest(str(digits))
    ds = dl.CifarBinary(str(digits), m, "test", train=False)
    x, y = ds[5]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32
    expect = (torch.from_numpy(ds.raw(5)[0].astype("float32")) / 255 - m["mean"][0]) / m["std"][0]
    assert torch.allclose(x, expect) and torch.equal(ds[5][0], x)  # the same every time
    # over the whole training split the normalised pixels have mean 0 and std 1
    train = torch.stack([dl.CifarBinary(str(digits), m, "train", train=False)[i][0] for i in range(1437)])
    assert abs(train.mean().item()) < 0.01 and abs(train.std().item() - 1) < 0.01


def test_training_crops_shift_but_never_flip_digits(digits):
    m = dl.load_manifest(str(digits))
    ds = dl.CifarBinary(str(digits), m, "train", train=True)
    assert ds.pad == 1 and ds.flip is False
    plain = dl.CifarBinary(str(digits), m, "train", train=False)[3][0]
    torch.manual_seed(0)
    seen = {tuple(ds[3][0].flatten().tolist()) for _ in range(60)}
    assert tuple(plain.flatten().tolist()) in seen and 1 < len(seen) <= 9  # at most 3x3 crop offsets
    mirrored = tuple(plain.flip(2).flatten().tolist())
    assert mirrored not in seen


def test_small_images_are_resized_to_the_stems_minimum(digits):
    m = dl.load_manifest(str(digits))
    cifar = dl.open_split(str(digits), m, "test", train=False, stem="cifar")
    imagenet = dl.open_split(str(digits), m, "test", train=False, stem="imagenet")
    small, big = cifar[7][0], imagenet[7][0]
    assert small.shape == (1, 8, 8) and big.shape == (1, 32, 32)
    assert torch.equal(big[:, ::4, ::4], small)  # nearest: each pixel becomes a 4x4 block


@pytest.mark.parametrize("n,world", [(1437, 2), (1437, 3), (360, 7), (10, 4), (3, 5)])
def test_every_sample_exactly_once_per_epoch(n, world):
    data = list(range(n))
    for epoch in (0, 1):
        shards = []
        for rank in range(world):
            s = dl.ExactDistributedSampler(data, world, rank, shuffle=True, seed=3)
            s.set_epoch(epoch)
            shards.append(list(s))
            assert len(s) == len(shards[-1])
        assert sorted(i for shard in shards for i in shard) == data  # nothing repeated, nothing dropped
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    first = [list(dl.ExactDistributedSampler(data, world, 0, seed=3)) for _ in range(2)]
    assert first[0] == first[1]  # the same permutation on every rank and every run
    later = dl.ExactDistributedSampler(data, world, 0, seed=3)
    later.set_epoch(1)
    assert n < 5 or list(later) != first[0]  # reshuffled each epoch


def test_torchs_sampler_repeats_what_ours_does_not():
    # why our own: torch's DistributedSampler evens shards out by repeating samples, and a
    # repeated test image would count twice in the top-1
    data = list(range(10))
    theirs = [i for r in range(4) for i in torch.utils.data.DistributedSampler(data, 4, r, shuffle=False)]
    assert len(theirs) == 12 and Counter(theirs).most_common(1)[0][1] == 2
    ours = [i for r in range(4) for i in dl.ExactDistributedSampler(data, 4, r, shuffle=False)]
    assert sorted(ours) == data


def test_imagefolder_without_torchvision_says_so(tmp_path, monkeypatch):
    # A node whose torch came from an index without a torchvision build: its import fails
    # (None in sys.modules makes `import torchvision` raise ImportError, as a missing one does).
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")] + ["torchvision"]:
        monkeypatch.setitem(sys.modules, name, None)
    m = datasets.imagefolder_manifest  # a manifest of an empty tree is enough to get that far
    (tmp_path / "train" / "a").mkdir(parents=True)
    (tmp_path / "val" / "a").mkdir(parents=True)
    with pytest.raises(SystemExit, match="the imagefolder format needs torchvision, which does not import here"):
        dl.open_split(str(tmp_path), m(tmp_path), "train", train=True, stem="imagenet")


def test_no_manifest_is_a_clear_exit(tmp_path):
    with pytest.raises(SystemExit, match=r"no dataset in .* \(no dataset.json\): fetch one with `deployer data fetch NAME`"):
        dl.load_manifest(str(tmp_path))


@pytest.mark.parametrize("n,world,batch", [(1437, 2, 16), (101, 2, 25), (33, 2, 16), (17, 1, 16), (1437, 7, 32), (9, 4, 2)])
def test_batches_use_every_sample_once_never_one_alone_and_agree_across_ranks(n, world, batch):
    data = list(range(n))
    counts, seen = set(), []
    for rank in range(world):
        bs = dl.MergedBatchSampler(dl.ExactDistributedSampler(data, world, rank, seed=1), batch)
        batches = list(bs)
        assert len(batches) == len(bs) == dl.batch_count(len(bs.sampler), batch)
        assert all(len(b) > 1 for b in batches)  # BatchNorm needs two values per channel
        assert all(len(b) == batch for b in batches[:-1])
        counts.add(len(batches))
        seen += [i for b in batches for i in b]
    assert sorted(seen) == data
    assert len(counts) == 1  # every rank runs as many steps: none waits in an all-reduce


def test_a_truncated_file_is_refused(tmp_path):
    datasets.write_digits(tmp_path)
    (tmp_path / "test.bin").write_bytes((tmp_path / "test.bin").read_bytes()[:-65])
    with pytest.raises(SystemExit, match="the test files hold 23335 bytes, not 360 records of 65: the dataset is damaged"):
        dl.CifarBinary(str(tmp_path), dl.load_manifest(str(tmp_path)), "test", train=False)
