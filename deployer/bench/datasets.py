"""The datasets a training run can use: one catalog, one on-disk layout, one manifest.

Every dataset lives in its own folder, `<shared_dir>/datasets/<name>/`, next to a manifest,
`dataset.json`, that is written last: a folder with a manifest is complete, and the
manifest is all `benchmarks/resnet_train.py` needs to read it (format, image shape,
classes, splits, normalisation, augmentation, training defaults). Two formats:

- `cifar-binary`: fixed-size records, 1 label byte + C*H*W uint8 pixels (channel-major,
  row-major), as in CIFAR-10's official binary archive. cifar10 is that archive as
  extracted; digits (scikit-learn's 8x8 handwritten digits) is written in the same layout
  so a test or a local cluster trains on real data with no download.
- `imagefolder`: torchvision's ImageFolder layout, `train/<class>/*.JPEG` and
  `val/<class>/*.JPEG` (ImageNet as users keep it).

Nothing here touches the network: a later `deployer data fetch` runs the command strings
built here on the master (`free_space_cmd`, `fetch_cmd`, `write_manifest_cmd`), as
`deployer bench` does with its own, and turns their output into the manifest with the
same `manifest()` that `write_digits` uses.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import io
import json
import os
import random
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import RecordError, UsageError
from ..ui import human_bytes

SCHEMA = 1
MANIFEST = "dataset.json"
FORMATS = ("cifar-binary", "imagefolder")
# torchvision's IMG_EXTENSIONS: what ImageFolder counts as a sample
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Archive:
    """A download: where, how big, and its checksums (md5 as the dataset's page publishes it;
    sha256 as independent copies of the archive agree on it)."""

    url: str
    file: str
    bytes: int
    md5: str
    sha256: str
    top: str  # the folder the archive extracts to


@dataclass(frozen=True)
class Training:
    """resnet_train.py's defaults for a dataset (written into the manifest; flags override).
    base_lr is per 256 images of global batch: the run uses base_lr * global_batch / 256."""

    model: str
    stem: str  # "cifar": 3x3 stride-1 conv, no max-pool (small images); "imagenet": 7x7 stride 2 + max-pool
    batch_size: int  # per rank
    base_lr: float
    warmup_epochs: float
    epochs: int
    weight_decay: float
    target_acc: float


@dataclass(frozen=True)
class Dataset:
    name: str
    description: str
    format: str
    shape: tuple[int, int, int]  # C, H, W as the model sees it
    classes: tuple[str, ...]
    train_samples: int
    test_samples: int
    source: str  # a URL, or where the data comes from when nothing is downloaded
    splits: dict[str, tuple[str, ...]]  # cifar-binary: the split's files; imagefolder: its folder
    training: Training
    flip: bool = True  # random horizontal flips in training (not for digits: a mirrored 2 is no 2)
    pad: int = 0  # random-crop padding in pixels (cifar-binary)
    mean: tuple[float, ...] | None = None  # None: measured from the data when it is written
    std: tuple[float, ...] | None = None
    archive: Archive | None = None

    @property
    def record_bytes(self) -> int:
        c, h, w = self.shape
        return 1 + c * h * w

    @property
    def bytes(self) -> int | None:
        """Bytes on disk once in place; None where the user's folder decides (imagefolder)."""
        if self.format != "cifar-binary":
            return None
        return (self.train_samples + self.test_samples) * self.record_bytes


CIFAR10_BIN = "cifar-10-batches-bin"

CATALOG: dict[str, Dataset] = {d.name: d for d in (
    Dataset(
        name="cifar10", description="CIFAR-10: 60,000 32x32 colour images in 10 classes (official binary version)",
        format="cifar-binary", shape=(3, 32, 32),
        classes=("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
        train_samples=50_000, test_samples=10_000, source="https://www.cs.toronto.edu/~kriz/cifar.html",
        splits={"train": tuple(f"{CIFAR10_BIN}/data_batch_{i}.bin" for i in range(1, 6)),
                "test": (f"{CIFAR10_BIN}/test_batch.bin",)},
        flip=True, pad=4,
        # the training set's per-channel mean and standard deviation of pixel/255
        mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
        training=Training(model="resnet18", stem="cifar", batch_size=128, base_lr=0.1, warmup_epochs=2,
                          epochs=40, weight_decay=5e-4, target_acc=0.9),
        archive=Archive(url="https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz", file="cifar-10-binary.tar.gz",
                        bytes=170_052_171, md5="c32a1d4ab5d03f1284b67883e8d87530",
                        sha256="c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd", top=CIFAR10_BIN),
    ),
    Dataset(
        name="digits", description="scikit-learn's 8x8 handwritten digits: 1,797 images in 10 classes (UCI optdigits test set)",
        format="cifar-binary", shape=(1, 8, 8), classes=tuple(str(i) for i in range(10)),
        train_samples=1437, test_samples=360, source="from the scikit-learn package (sklearn/datasets/data/digits.csv.gz)",
        splits={"train": ("train.bin",), "test": ("test.bin",)},
        flip=False, pad=1,  # CIFAR's 4 px of 32, scaled to 8 px
        # Tuned for time to 0.9 on 2 CPU ranks (3 epochs): 1,437 images give few steps per
        # epoch, so a small batch (more steps), a high base rate (0.05 at 1 rank, 0.1 at 2), a
        # quarter epoch of warm-up and a short schedule (the cosine decay over 20 epochs instead
        # of 8 keeps the rate high for longer: 5 epochs to 0.9; a batch of 32 needs 4 to 5).
        training=Training(model="resnet18", stem="cifar", batch_size=16, base_lr=0.8, warmup_epochs=0.25,
                          epochs=8, weight_decay=5e-4, target_acc=0.9),
    ),
    Dataset(
        name="imagenet", description="ImageNet (ILSVRC-2012): 1.28 M training images in 1,000 classes, 50,000 for validation",
        format="imagefolder", shape=(3, 224, 224), classes=(),  # the class folders are the classes
        train_samples=1_281_167, test_samples=50_000, source="user provides (torchvision ImageFolder layout)",
        splits={"train": ("train",), "test": ("val",)},
        flip=True, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
        # Goyal et al.: 0.1 per 256, 5 warm-up epochs, 90 epochs, weight decay 1e-4
        training=Training(model="resnet50", stem="imagenet", batch_size=64, base_lr=0.1, warmup_epochs=5,
                          epochs=90, weight_decay=1e-4, target_acc=0.75),
    ),
)}


# --- names and flags -----------------------------------------------------------------
def resolve(name: str) -> Dataset:
    try:
        return CATALOG[name]
    except KeyError:
        raise UsageError(f"unknown dataset {name!r}: use one of {', '.join(sorted(CATALOG))}, "
                         "or `deployer data import PATH` for your own") from None


# A dataset's folder name on the shared storage (fetch, import --as, bench --data).
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"


def check_name(name: str) -> str:
    if not re.match(NAME_PATTERN, name):
        raise UsageError(f"dataset name {name!r}: use lower-case letters, digits, '.', '_' or '-'")
    return name


def target_accuracy(value: float) -> float:
    """--target-acc is a top-1 fraction: 0.9, not 90."""
    if not 0 < value <= 1:
        raise UsageError(f"--target-acc {value:g} is not a top-1 fraction in (0, 1]: use e.g. --target-acc 0.9")
    return value


def dataset_dir(shared_dir: str, name: str) -> str:
    return f"{shared_dir.rstrip('/')}/datasets/{name}"


# --- space ------------------------------------------------------------------------------
def space_needed(ds: Dataset, *, partial: int = 0, source_bytes: int | None = None) -> int:
    """Bytes to free before a fetch or import starts: the archive still to download (less
    the `partial` bytes a stopped download left) and what it extracts to, both at once;
    for an import, `source_bytes` (the user's folder, measured)."""
    if source_bytes is not None:
        return source_bytes
    if ds.bytes is None:
        raise UsageError(f"{ds.name}: {ds.source}: import it with `deployer data import PATH`")
    return ds.bytes + (max(0, ds.archive.bytes - partial) if ds.archive else 0)


def check_space(needed: int, free: int, where: str, what: str) -> None:
    """UsageError naming both sizes when `free` bytes at `where` cannot hold `what`."""
    if free < needed:
        raise UsageError(f"not enough space for {what} in {where}: it needs {human_bytes(needed)} ({needed} bytes), "
                         f"{human_bytes(free)} ({free} bytes) are free: free some space or use a larger shared volume")


def free_space_cmd(path: str) -> str:
    """Bytes free where `path` will be (the folder is made first, so df measures its filesystem)."""
    p = shlex.quote(path)
    return f"mkdir -p {p} && df -B1 --output=avail {p} | tail -n 1"


def parse_free_space(stdout: str) -> int:
    return int(stdout.strip().splitlines()[-1])


# --- download on the master ------------------------------------------------------------
def fetch_cmd(ds: Dataset, dest: str) -> str:
    """One bash command that downloads `ds` into `dest` on the master, resumably, and prints
    `sha256 bytes name` of each file the manifest lists (for `parse_files` and `manifest`).

    A stopped download resumes (curl -C -); an archive whose md5 already matches is not
    fetched again (a range request past its end is an error to some servers); a wrong one
    is removed, so the next try starts clean. Extraction goes to a scratch folder that is
    renamed when done, so the folder is there only when whole; the archive goes after that.
    """
    a = ds.archive
    if a is None:
        raise UsageError(f"{ds.name} is not downloaded: {ds.source}")
    d, f = shlex.quote(dest), shlex.quote(a.file)
    md5 = shlex.quote(f"{a.md5}  {a.file}")
    sha = shlex.quote(f"{a.sha256}  {a.file}")
    files = " ".join(shlex.quote(p) for split in ds.splits.values() for p in split)
    bad = shlex.quote(f"{a.file}: checksum mismatch (removed: run the fetch again)")
    return (f"set -euo pipefail; mkdir -p {d} && cd {d}; "
            f"if [ ! -d {shlex.quote(a.top)} ]; then "
            f"if ! echo {md5} | md5sum -c --status 2>/dev/null; then "  # none yet, or part of one
            f"curl -fsSL --retry 5 --retry-delay 10 -C - -o {f} {shlex.quote(a.url)}; fi; "
            f"if ! echo {md5} | md5sum -c --status || ! echo {sha} | sha256sum -c --status; then "
            f"rm -f {f}; echo {bad} >&2; exit 1; fi; "
            f"rm -rf .extract && mkdir .extract && tar -xzf {f} -C .extract && "
            f"mv .extract/{shlex.quote(a.top)} . && rmdir .extract && rm -f {f}; fi; "
            f"for f in {files}; do echo \"$(sha256sum < \"$f\" | cut -d' ' -f1) $(stat -c %s \"$f\") $f\"; done")


def parse_files(stdout: str) -> dict[str, dict[str, Any]]:
    """fetch_cmd's `sha256 bytes name` lines -> the manifest's files: {name: {bytes, sha256}}."""
    files: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and len(parts[0]) == 64 and parts[1].isdigit():
            files[parts[2]] = {"bytes": int(parts[1]), "sha256": parts[0]}
    return files


def write_manifest_cmd(dest: str, manifest: dict[str, Any]) -> str:
    """Write the manifest on the master, atomically (a reader never sees half of it)."""
    path = f"{dest.rstrip('/')}/{MANIFEST}"
    text = json.dumps(manifest, indent=1) + "\n"
    return f"printf %s {shlex.quote(text)} > {shlex.quote(path + '.tmp')} && mv {shlex.quote(path + '.tmp')} {shlex.quote(path)}"


# --- the manifest ----------------------------------------------------------------------
def manifest(ds: Dataset, files: dict[str, dict[str, Any]], **facts: Any) -> dict[str, Any]:
    """The manifest of `ds` as written into its folder: the catalog's facts, the files with
    their sha256, and `facts` measured from the data (mean, std, classes, samples) winning."""
    m: dict[str, Any] = {
        "schema": SCHEMA, "name": ds.name, "description": ds.description, "format": ds.format,
        "shape": list(ds.shape), "classes": list(ds.classes), "source": ds.source,
        "splits": {split: ({"files": list(paths), "samples": ds.train_samples if split == "train" else ds.test_samples}
                           if ds.format == "cifar-binary" else
                           {"dir": paths[0], "samples": ds.train_samples if split == "train" else ds.test_samples})
                   for split, paths in ds.splits.items()},
        "augment": {"flip": ds.flip, "pad": ds.pad},
        "mean": list(ds.mean) if ds.mean else None, "std": list(ds.std) if ds.std else None,
        "training": asdict(ds.training), "files": files,
    }
    for split in ("train", "test"):
        if f"{split}_samples" in facts:
            m["splits"][split]["samples"] = facts.pop(f"{split}_samples")
    m.update(facts)
    return m


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(root: Path, m: dict[str, Any]) -> Path:
    path = root / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(m, indent=1) + "\n")
    tmp.replace(path)  # atomic: the manifest appears whole, last
    return path


def read_manifest(root: Path) -> dict[str, Any]:
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise UsageError(f"no dataset in {root} (no {MANIFEST}): fetch one with `deployer data fetch NAME`")
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RecordError(f"{path} is not a readable dataset manifest ({e}): fetch the dataset again") from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA or m.get("format") not in FORMATS:
        raise RecordError(f"{path}: not a schema-{SCHEMA} dataset manifest: fetch the dataset again")
    return m


def verify(root: Path) -> list[str]:
    """What is wrong with the dataset in `root` (empty: nothing): every listed file present
    with its size and sha256; cifar-binary files a whole number of records adding up to the
    sample counts; imagefolder splits holding the counted images (not hashed: ImageNet is
    1.3 M files, 150 GB, a quarter of an hour of reading for a check)."""
    root = Path(root)
    m = read_manifest(root)
    problems = []
    for name, want in m["files"].items():
        path = root / name
        if not path.is_file():
            problems.append(f"{name}: missing")
        elif "bytes" in want and path.stat().st_size != want["bytes"]:
            problems.append(f"{name}: {path.stat().st_size} bytes, the manifest says {want['bytes']}")
        elif sha256_file(path) != want["sha256"]:
            problems.append(f"{name}: sha256 differs from the manifest (damaged or changed)")
    for split, s in m["splits"].items():
        if m["format"] == "cifar-binary":
            c, h, w = m["shape"]
            sizes = [(root / f).stat().st_size for f in s["files"] if (root / f).is_file()]
            if len(sizes) == len(s["files"]) and sum(sizes) != s["samples"] * (1 + c * h * w):
                problems.append(f"{split}: {sum(sizes)} bytes are not {s['samples']} records of {1 + c * h * w} bytes")
        else:
            n = count_images(root / s["dir"])
            if n != s["samples"]:
                problems.append(f"{split}: {n} images in {s['dir']}/, the manifest says {s['samples']}")
    return problems


def count_images(folder: Path) -> int:
    return sum(1 for _, _, names in os.walk(folder) for n in names if n.lower().endswith(IMAGE_EXTENSIONS))


def imagefolder_manifest(root: Path, ds: Dataset | None = None) -> dict[str, Any]:
    """The manifest of an ImageFolder tree in `root` (train/<class>/..., val/<class>/...):
    classes are train's folders in sorted order, as ImageFolder numbers them."""
    ds = ds or CATALOG["imagenet"]
    root = Path(root)
    tdir, vdir = ds.splits["train"][0], ds.splits["test"][0]
    for d in (tdir, vdir):
        if not (root / d).is_dir():
            raise UsageError(f"{root} has no {d}/ folder: lay it out as {tdir}/<class>/*.JPEG and {vdir}/<class>/*.JPEG")
    classes = sorted(e.name for e in os.scandir(root / tdir) if e.is_dir())
    return manifest(ds, {}, classes=classes, train_samples=count_images(root / tdir), test_samples=count_images(root / vdir))


# --- digits, from the scikit-learn package --------------------------------------------
DIGITS_SEED = 0


def digits_source() -> Path:
    """scikit-learn's digits.csv.gz, found without importing scikit-learn (a second of scipy)."""
    spec = importlib.util.find_spec("sklearn")
    path = (
        Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
        if spec and spec.submodule_search_locations
        else None
    )
    if path is None or not path.is_file():
        raise UsageError("the digits dataset comes with scikit-learn, which is not installed here: "
                         "reinstall the deployer (pip install -e .) to get it")
    return path


def read_digits() -> tuple[list[bytes], list[int]]:
    """The 1,797 digits in sklearn's order: 64 pixels each, scaled from 0..16 to 0..255, and labels."""
    with gzip.open(digits_source(), "rt") as fh:
        rows = [[int(float(v)) for v in row] for row in csv.reader(io.StringIO(fh.read())) if row]
    # why round-to-nearest: 16 maps to 255 exactly, and the 17 levels stay 17 distinct bytes
    pixels = [bytes((v * 255 + 8) // 16 for v in row[:64]) for row in rows]
    return pixels, [row[64] for row in rows]


def stratified_split(labels: list[int], test: int, seed: int = DIGITS_SEED) -> tuple[list[int], list[int]]:
    """Indices (train, test), each in ascending order, `test` of them drawn per class in
    proportion to the class (largest remainders, ties to the lower class), with a fixed seed."""
    by_class: dict[int, list[int]] = {}
    for i, y in enumerate(labels):
        by_class.setdefault(y, []).append(i)
    quota = {c: len(ix) * test / len(labels) for c, ix in sorted(by_class.items())}
    take = {c: int(q) for c, q in quota.items()}
    for c in sorted(quota, key=lambda c: (-(quota[c] - take[c]), c))[:test - sum(take.values())]:
        take[c] += 1
    rng = random.Random(seed)
    test_ix: list[int] = []
    for c, ix in sorted(by_class.items()):
        test_ix += rng.sample(ix, take[c])
    chosen = set(test_ix)
    return [i for i in range(len(labels)) if i not in chosen], sorted(test_ix)


def write_digits(dest: Path) -> dict[str, Any]:
    """Write digits into `dest` in the cifar-binary layout (train.bin, test.bin, dataset.json);
    the same bytes on every machine. Returns the manifest."""
    ds = CATALOG["digits"]
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    pixels, labels = read_digits()
    train_ix, test_ix = stratified_split(labels, ds.test_samples)
    files = {}
    for split, ix in (("train", train_ix), ("test", test_ix)):
        name = ds.splits[split][0]
        data = b"".join(bytes([labels[i]]) + pixels[i] for i in ix)
        (dest / name).write_bytes(data)
        files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    # normalisation measured on the training split, as CIFAR's published figures are
    values = [p / 255 for i in train_ix for p in pixels[i]]
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    m = manifest(ds, files, mean=[round(mean, 4)], std=[round(std, 4)],
                 train_samples=len(train_ix), test_samples=len(test_ix))
    write_manifest(dest, m)
    return m
