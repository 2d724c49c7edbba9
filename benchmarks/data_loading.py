"""Real data for resnet_train.py: the folder layout `deployer data fetch` writes, read through
its manifest (dataset.json: format, image shape, classes, splits, normalisation, augmentation).

- cifar-binary (cifar10, digits): fixed-size records, 1 label byte + C*H*W uint8 pixels,
  memory-mapped, so a rank reads only the records it is given and nothing is loaded up front.
- imagefolder (imagenet): torchvision's ImageFolder with the usual ImageNet transforms.

Imported by resnet_train.py from its own directory, like bench_common.py. The sampler that
shards an epoch over the ranks is here too: ExactDistributedSampler (every sample once), and
MergedBatchSampler (no training batch of one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, Dataset, DistributedSampler

MANIFEST = "dataset.json"
SCHEMA = 1
# The smallest input each ResNet stem takes: the ImageNet stem halves the image 5 times
# (conv1, max-pool, layer2..4), the CIFAR stem 3 times (layer2..4); smaller images are
# resized up to this, nothing larger.
MIN_SIZE = {"imagenet": 32, "cifar": 8}

if TYPE_CHECKING:  # names for annotations only
    from typing import Protocol, TypeAlias

    # torchvision's ImageFolder: torchvision ships no type information.
    ImageFolder: TypeAlias = Any
    # One split as open_split opens it.
    Split: TypeAlias = "CifarBinary | ImageFolder"

    class SizedSampler(Protocol):
        """A sampler of dataset indices that knows its length (ExactDistributedSampler)."""

        def __iter__(self) -> Iterator[int]: ...
        def __len__(self) -> int: ...


def load_manifest(root: str) -> dict[str, Any]:
    path = os.path.join(root, MANIFEST)
    if not os.path.isfile(path):
        raise SystemExit(f"no dataset in {root} (no {MANIFEST}): fetch one with `deployer data fetch NAME`")
    with open(path) as fh:
        m: dict[str, Any] = json.load(fh)
    if m.get("schema") != SCHEMA or m.get("format") not in ("cifar-binary", "imagefolder"):
        raise SystemExit(f"{path}: not a schema-{SCHEMA} dataset manifest: fetch the dataset again")
    return m


class CifarBinary(Dataset[tuple[torch.Tensor, int]]):
    """One split of a cifar-binary dataset: (float image C x H' x W', label), normalised; in
    training with a random crop from the padded image and, where the manifest allows, a flip."""

    def __init__(self, root: str, manifest: dict[str, Any], split: str, *, train: bool, min_size: int = 8) -> None:
        self.files = [os.path.join(root, f) for f in manifest["splits"][split]["files"]]
        self.shape = tuple(manifest["shape"])
        self.record = 1 + int(np.prod(self.shape))
        sizes = [os.path.getsize(f) for f in self.files]
        if sum(sizes) != manifest["splits"][split]["samples"] * self.record:
            raise SystemExit(f"{root}: the {split} files hold {sum(sizes)} bytes, not {manifest['splits'][split]['samples']} "
                             f"records of {self.record}: the dataset is damaged, fetch it again")
        self.starts = np.cumsum([0] + [n // self.record for n in sizes])
        self.pad = manifest["augment"]["pad"] if train else 0
        self.flip = train and manifest["augment"]["flip"]
        c = self.shape[0]
        self.mean = torch.tensor(manifest.get("mean") or [0.5] * c).view(c, 1, 1)
        self.std = torch.tensor(manifest.get("std") or [0.5] * c).view(c, 1, 1)
        self.size = max(min_size, self.shape[1])
        self._maps: list[np.ndarray] | None = None  # opened in the process that reads (data-loader workers each open their own)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _records(self) -> list[np.ndarray]:
        if self._maps is None:
            self._maps = [np.memmap(f, dtype=np.uint8, mode="r").reshape(-1, self.record) for f in self.files]
        return self._maps

    def raw(self, i: int) -> tuple[np.ndarray, int]:
        """Record i as stored: uint8 pixels (C, H, W) and its label."""
        f = int(np.searchsorted(self.starts, i, side="right")) - 1
        rec = self._records()[f][i - self.starts[f]]
        return rec[1:].reshape(self.shape), int(rec[0])

    @property
    def labels(self) -> np.ndarray:
        return np.concatenate([m[:, 0] for m in self._records()]).astype(np.int64)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        pixels, label = self.raw(i)
        x = torch.from_numpy(pixels.astype(np.float32) / 255)
        if self.pad:  # random crop of the zero-padded image, CIFAR's standard augmentation
            h, w = self.shape[1:]
            x = F.pad(x, (self.pad,) * 4)
            dy, dx = torch.randint(0, 2 * self.pad + 1, (2,)).tolist()
            x = x[:, dy:dy + h, dx:dx + w]
        if self.flip and torch.rand(()) < 0.5:
            x = x.flip(2)
        x = (x - self.mean) / self.std
        if self.size > self.shape[1]:  # nearest: exact for whole factors (8 -> 32), and cheap
            x = F.interpolate(x[None], size=(self.size, self.size), mode="nearest")[0]
        return x, label


def imagefolder(root: str, manifest: dict[str, Any], split: str, *, train: bool) -> ImageFolder:
    """One split of an ImageFolder tree, with ImageNet's usual transforms."""
    try:
        from torchvision import datasets, transforms
    except Exception as e:  # noqa: BLE001 - any import failure (missing, or built for another torch)
        raise SystemExit(f"the imagefolder format needs torchvision, which does not import here ({e}): "
                         "install the torchvision release that matches this torch") from None
    size = manifest["shape"][1]
    norm = transforms.Normalize(manifest.get("mean") or [0.5] * 3, manifest.get("std") or [0.5] * 3)
    if train:
        steps = [transforms.RandomResizedCrop(size)] + ([transforms.RandomHorizontalFlip()] if manifest["augment"]["flip"] else [])
    else:
        steps = [transforms.Resize(round(size * 256 / 224)), transforms.CenterCrop(size)]
    ds = datasets.ImageFolder(os.path.join(root, manifest["splits"][split]["dir"]),
                              transform=transforms.Compose([*steps, transforms.ToTensor(), norm]))
    if manifest.get("classes") and ds.classes != manifest["classes"]:
        raise SystemExit(f"{root}: the class folders of {split} differ from the manifest's classes: import the dataset again")
    return ds


def sample_bytes(ds: Split, i: int) -> int:
    """The bytes reading sample i takes from the shared storage: a record of a cifar-binary
    file, or the whole image file of an ImageFolder (a stat, not a second read)."""
    if isinstance(ds, CifarBinary):
        return ds.record
    return os.path.getsize(ds.samples[i][0])


class WithBytes(Dataset[tuple[torch.Tensor, int, int]]):
    """(x, label, bytes read) for the training loop's read throughput. Counted in the process
    that reads (a data-loader worker), and carried back with the batch: a counter in the
    dataset object would stay in the worker."""

    def __init__(self, ds: Split) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        x, y = self.ds[i]
        return x, y, sample_bytes(self.ds, i)


def open_split(root: str, manifest: dict[str, Any], split: str, *, train: bool, stem: str) -> Split:
    if manifest["format"] == "cifar-binary":
        return CifarBinary(root, manifest, split, train=train, min_size=MIN_SIZE[stem])
    return imagefolder(root, manifest, split, train=train)


class ExactDistributedSampler(DistributedSampler[int]):
    """DistributedSampler without padding or dropping: every sample exactly once per epoch
    across the ranks, when the world size does not divide the dataset too.

    torch's sampler evens the shards out, by repeating up to world-1 samples (drop_last=False)
    or dropping them (drop_last=True); a repeated test image counts twice in the accuracy,
    a dropped one never. Here rank r takes every world-th index of the epoch's permutation
    (the same permutation on every rank: seed + epoch), so shards differ by at most one
    sample. In training every rank must run as many steps as the others (each step is an
    all-reduce): MergedBatchSampler makes that so, as a one-image remainder joins the last
    batch. Evaluation sums (correct, seen) over the ranks, which needs no equal shards."""

    dataset: Split

    def __init__(self, dataset: Split, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        n = len(dataset)
        self.num_samples = len(range(rank, n, num_replicas))
        self.total_size = n

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        order: list[int]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        return iter(order[self.rank::self.num_replicas])


def batch_count(samples: int, batch_size: int) -> int:
    """How many batches MergedBatchSampler makes of `samples`."""
    full, rest = divmod(samples, batch_size)
    return full + (1 if rest > 1 or (rest == 1 and full == 0) else 0)


class MergedBatchSampler(BatchSampler):
    """Batches of batch_size, the last one as it falls, except that a last batch of one
    image joins the batch before it: BatchNorm in training needs two values per channel,
    and with 8 px images (digits) the last stage is 1x1. Every image is still used once.
    It also gives every rank the same number of steps: shards of n and n+1 images make
    as many batches (n+1 only has one more when n is a multiple of the batch, and then
    that one image is merged), as long as no shard is empty."""

    sampler: SizedSampler

    def __init__(self, sampler: SizedSampler, batch_size: int) -> None:
        super().__init__(sampler, batch_size, drop_last=False)

    def __iter__(self) -> Iterator[list[int]]:
        if self.batch_size == 1:
            yield from super().__iter__()
            return
        held: list[int] | None = None
        for batch in super().__iter__():  # only the last batch can be short
            if held is not None and len(batch) == 1:
                batch, held = held + batch, None
            if held is not None:
                yield held
            held = batch
        if held is not None:
            yield held

    def __len__(self) -> int:
        return batch_count(len(self.sampler), self.batch_size)
