"""benchmarks/resnet_train.py: the schedule, sizing and flags in-process (fast), and real
training under mpirun on this machine (slow): a stopped run resumed from its checkpoint
ends exactly where an unbroken run ends, and 2 ranks train digits to 0.9 top-1."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deployer.bench import datasets

torch = pytest.importorskip("torch")
mpi4py = pytest.importorskip("mpi4py")
mpi4py.rc.initialize = False  # import MPI without starting it: the fast tests here call no MPI
BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import resnet_train as rt  # noqa: E402 - from the benchmarks dir, as mpirun runs it

from .test_bench_mpi import last_json, mpi_env  # noqa: E402 - the same mpirun environment


# --- the learning rate ------------------------------------------------------------------
def test_linear_scaling_rule():
    assert rt.peak_lr(0.1, 256) == pytest.approx(0.1)
    assert rt.peak_lr(0.1, 8192) == pytest.approx(3.2)  # Goyal et al.'s 8k batch
    assert rt.peak_lr(0.8, 32) == pytest.approx(0.1)  # digits at 2 ranks of 16


def test_warmup_then_cosine():
    lr = [rt.lr_at(s, peak=1.0, warmup_steps=4, total_steps=12) for s in range(14)]
    assert lr[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # linear from peak/4, never 0
    assert lr[4] == pytest.approx(1.0)  # the decay starts at the peak
    assert lr[8] == pytest.approx(0.5)  # half-way through the decay
    assert lr[4:12] == sorted(lr[4:12], reverse=True)
    assert lr[12] == pytest.approx(0.0, abs=1e-12) and lr[13] == pytest.approx(0.0, abs=1e-12)
    # no warm-up: straight into the decay
    assert rt.lr_at(0, peak=0.4, warmup_steps=0, total_steps=10) == pytest.approx(0.4)


def test_warmup_length_in_epochs_or_iterations():
    per_epoch = rt.steps_per_epoch(1437, 2, 16)
    assert per_epoch == math.ceil(719 / 16) == 45  # the busiest rank's share
    assert rt.steps_per_epoch(101, 2, 25) == 2  # 51 images: 25 and 26, no batch of one
    args = rt.parse_args(["--data", "x", "--warmup-epochs", "2"])
    assert rt.warmup_steps(args, per_epoch) == 90
    args = rt.parse_args(["--data", "x", "--warmup-epochs", "2", "--warmup-iters", "7"])
    assert rt.warmup_steps(args, per_epoch) == 7


@pytest.mark.parametrize("cores,cuda,flags,expect", [
    (1, False, (-1, 0), (0, 1)),  # a rank with one core: no workers
    (2, False, (-1, 0), (0, 2)),
    (8, False, (-1, 0), (2, 6)),  # on CPU a quarter load data, the rest compute
    (16, True, (-1, 0), (8, 8)),  # on GPU workers feed the device: all but one core, at most 8
    (2, True, (-1, 0), (1, 1)),
    (8, False, (3, 0), (3, 5)),  # --workers
    (8, False, (-1, 4), (2, 4)),  # --threads
])
def test_loader_workers_and_threads(cores, cuda, flags, expect):
    assert rt.cpu_split(cores, cuda, *flags) == expect


def test_stems():
    model, _ = rt.make_model("resnet18", "cifar", 1, 10)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)  # 8 px is enough: 8x downsampling
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, torch.nn.Identity)
    model, _ = rt.make_model("resnet18", "imagenet", 3, 1000)
    assert model.conv1.kernel_size == (7, 7) and model(torch.zeros(2, 3, 32, 32)).shape == (2, 1000)
    # every block starts as the identity: its last BN scale is 0 (Goyal et al.)
    assert all(not b.bn2.weight.detach().any() for b in model.layer1)


def test_defaults_come_from_the_manifest(tmp_path):
    m = datasets.write_digits(tmp_path)
    args = rt.with_defaults(rt.parse_args(["--data", str(tmp_path), "--batch-size", "8"]), m)
    t = m["training"]
    assert (args.model, args.stem, args.base_lr, args.epochs, args.target_acc) == (
        t["model"], t["stem"], t["base_lr"], t["epochs"], t["target_acc"])
    assert args.batch_size == 8  # a flag wins


@pytest.mark.parametrize("bad", ["0", "1.5", "-0.1"])
def test_target_acc_outside_0_1_is_refused(bad, capsys):
    with pytest.raises(SystemExit) as e:
        rt.parse_args(["--data", "x", "--target-acc", bad])
    assert e.value.code == 2
    assert "is not a top-1 fraction in (0, 1]: use e.g. 0.9" in capsys.readouterr().err


def test_resume_needs_a_checkpoint_dir(capsys):
    with pytest.raises(SystemExit):
        rt.parse_args(["--data", "x", "--resume"])
    assert "--resume needs --checkpoint-dir" in capsys.readouterr().err


# --- real training under mpirun ---------------------------------------------------------
def needs_mpi(test):
    for mark in (pytest.mark.slow,
                 pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (Open MPI) is not installed"),
                 pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="scikit-learn (digits) is not installed")):
        test = mark(test)
    return test


def small_digits(root: Path, train: int, test: int) -> Path:
    """The first `train`/`test` records of digits, with their own manifest (a second an epoch)."""
    full = root / "full"
    datasets.write_digits(full)
    m = datasets.read_manifest(full)
    out = root / f"digits-{train}-{test}"
    out.mkdir()
    files = {}
    for split, n in (("train", train), ("test", test)):
        data = (full / f"{split}.bin").read_bytes()[:n * 65]
        (out / f"{split}.bin").write_bytes(data)
        files[f"{split}.bin"] = {"bytes": len(data), "sha256": datasets.sha256_file(out / f"{split}.bin")}
    datasets.write_manifest(out, datasets.manifest(datasets.resolve("digits"), files, mean=m["mean"], std=m["std"],
                                                   train_samples=train, test_samples=test))
    return out


def train(np_: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = ["mpirun", "-np", str(np_), "--bind-to", "none", sys.executable, str(BENCH / "resnet_train.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout, env=mpi_env())


def checkpoint(d: Path) -> dict:
    return torch.load(d / "checkpoint.pt", map_location="cpu", weights_only=True)


@needs_mpi
def test_a_stopped_run_resumes_where_it_stopped(tmp_path):
    # 101 training images over 2 ranks in batches of 25: rank 0 has 51 (25 and 26: no batch
    # of one), rank 1 has 50; 40 test images
    data = small_digits(tmp_path, 101, 40)
    common = ["--data", str(data), "--epochs", "3", "--batch-size", "25", "--workers", "0", "--target-acc", "1", "--json"]
    whole = train(2, *common, "--checkpoint-dir", str(tmp_path / "whole"), "--compute-steps", "0")
    assert whole.returncode == 0, whole.stderr[-3000:]
    a = last_json(whole.stdout)
    assert a["compute_img_per_sec"] is None and a["compute_steps"] == 0 and "Without data loading" not in whole.stdout
    assert [e["epoch"] for e in a["history"]] == [1, 2, 3] and a["reached"] is False
    assert all(e["train_images"] == 101 and e["test_images"] == 40 for e in a["history"])  # each image once

    part = train(2, *common, "--checkpoint-dir", str(tmp_path / "cut"), "--stop-after-epochs", "2")
    assert part.returncode == 0, part.stderr[-3000:]
    b = last_json(part.stdout)
    assert b["epochs_run"] == 2 and b["finished"] is False and b["time_to_target_s"] is None
    assert "Stopped after epoch 2 of 3: run again with --checkpoint-dir" in part.stdout
    saved = checkpoint(tmp_path / "cut")
    assert saved["epoch"] == 2 and saved["step"] == 2 * 2 and len(saved["rng"]) == 2

    rest = train(2, *common, "--checkpoint-dir", str(tmp_path / "cut"), "--resume")
    assert rest.returncode == 0, rest.stderr[-3000:]
    c = last_json(rest.stdout)
    assert "2 epoch(s) done" in rest.stdout and "Epoch 1/3" not in rest.stdout and "Epoch 3/3" in rest.stdout
    assert c["resumed_from_epoch"] == 2 and c["epochs_run"] == 3 and c["finished"] is True
    assert c["history"][:2] == b["history"]  # the history goes on
    assert c["history"][2]["elapsed_s"] == pytest.approx(b["history"][1]["elapsed_s"] + c["history"][2]["epoch_s"])
    # the third epoch started from the saved model, optimizer, step and RNG: it ends where
    # the unbroken run's third epoch ended, to the bit
    for k in ("loss", "top1", "lr"):
        assert c["history"][2][k] == a["history"][2][k], k
    w_whole, w_cut = checkpoint(tmp_path / "whole"), checkpoint(tmp_path / "cut")
    assert w_cut["epoch"] == 3
    for k, v in w_whole["model"].items():
        assert torch.equal(v, w_cut["model"][k]), k

    # a finished run started again does nothing more
    again = train(2, *common, "--checkpoint-dir", str(tmp_path / "cut"))
    assert again.returncode == 0 and last_json(again.stdout)["history"] == c["history"]
    # another global batch is another run: its checkpoint is not taken
    with pytest.raises(SystemExit, match="is from another run"):
        rt.load_checkpoint(str(tmp_path / "cut" / "checkpoint.pt"), {**saved["key"], "global_batch": 25})
    assert rt.load_checkpoint(str(tmp_path / "cut" / "checkpoint.pt"), saved["key"])["epoch"] == 3


def test_which_checkpoint_a_run_resumes(tmp_path):
    assert rt.checkpoint_to_resume(None, False) is None
    assert rt.checkpoint_to_resume(str(tmp_path), False) is None  # a first run
    with pytest.raises(SystemExit, match="--resume: no checkpoint at .*checkpoint.pt"):
        rt.checkpoint_to_resume(str(tmp_path), True)
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    assert rt.checkpoint_to_resume(str(tmp_path), False) == str(tmp_path / "checkpoint.pt")  # found: goes on


@needs_mpi
def test_two_ranks_train_digits_to_90_percent(tmp_path):
    datasets.write_digits(tmp_path / "digits")
    p = train(2, "--data", str(tmp_path / "digits"), "--target-acc", "0.9", "--json", "--progress")
    assert p.returncode == 0, p.stderr[-3000:]
    r = last_json(p.stdout)
    assert r["reached"] is True and r["world_size"] == 2 and r["global_batch"] == 2 * r["batch_size"]
    assert r["history"][-1]["top1"] >= 0.9 and r["time_to_target_s"] == r["history"][-1]["elapsed_s"]
    assert r["epochs_to_target"] == len(r["history"]) <= 8
    assert all(e["train_images"] == 1437 and e["test_images"] == 360 and e["img_per_sec"] > 0 for e in r["history"])
    # every training record read once per epoch (1 label byte + 64 pixels), waits within the epoch
    assert all(e["read_bytes"] == 1437 * 65 and 0 <= e["data_wait_s"] < e["train_s"] for e in r["history"])
    assert all(e["started_at"] < e["ended_at"] for e in r["history"])
    assert r["compute_steps"] == 30 and r["compute_img_per_sec"] > 0
    assert f"Without data loading (one batch held in memory, 30 steps): {r['compute_img_per_sec']:.1f} img/sec" in p.stdout
    assert r["versions"]["world_size"] == 2 and r["versions"]["mpi"].startswith("Open MPI")
    assert f"Reached top-1 {r['history'][-1]['top1']:.4f} (target 0.9) at epoch {r['epochs_to_target']}" in p.stdout
    events = [json.loads(ln[len("PROGRESS "):]) for ln in p.stdout.splitlines() if ln.startswith("PROGRESS ")]
    assert [e["epoch"] for e in events if e["phase"] == "epoch_done"] == [e["epoch"] for e in r["history"]]
    print(f"digits to 0.9 on 2 ranks: {r['epochs_to_target']} epochs, {r['time_to_target_s']:.1f} s "
          f"({[round(e['img_per_sec']) for e in r['history']]} img/s)")
