#!/usr/bin/env python3
"""ResNet training on real data to a target accuracy: time-to-accuracy and img/s per epoch,
the real-data companion of resnet_synthetic.py (same launch, same ResNets, same records).

    mpirun -np 4 --hostfile hostfile --bind-to none python resnet_train.py --data /shared/datasets/cifar10

The dataset is a folder `deployer data fetch` wrote (its dataset.json says the format,
image shape, classes, normalisation, augmentation and the training defaults used here).
torch.distributed DDP (NCCL on GPUs, gloo on CPUs), rank and rendezvous from mpi4py; each
epoch is sharded over the ranks with every image once (data_loading.ExactDistributedSampler),
and evaluated the same way on the test split: each rank counts its share, one all-reduce
sums them, so the top-1 is exact. Learning rate: base_lr * global_batch / 256 (Goyal et al.,
"Accurate, Large Minibatch SGD"), linear warm-up from near 0, then cosine decay to 0 at the
last epoch. The run stops at the first epoch whose top-1 reaches --target-acc, or after
--epochs (then: not reached). With --checkpoint-dir every epoch ends in a checkpoint
(model, optimizer, AMP scaler, epoch, step, history, each rank's RNG), and a run started
again with the same directory goes on from it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from typing import Any

from bench_common import Heartbeat, beating_from_import, rendezvous

beating_from_import(sys.argv[1:])  # MPI and the heartbeat before torch's imports: bench_common says why

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from data_loading import (  # noqa: E402
    MIN_SIZE,
    ExactDistributedSampler,
    MergedBatchSampler,
    WithBytes,
    batch_count,
    load_manifest,
    open_split,
)
from resnet_synthetic import MODELS, build_model, place_rank, versions  # noqa: E402
from torch import nn, optim  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

CHECKPOINT = "checkpoint.pt"


# --- the schedule: pure functions, unit-tested ------------------------------------------
def peak_lr(base_lr: float, global_batch: int) -> float:
    """The linear scaling rule: base_lr is the rate for 256 images per step."""
    return base_lr * global_batch / 256


def lr_at(step: int, *, peak: float, warmup_steps: int, total_steps: int) -> float:
    """Step `step` (from 0): linear warm-up to `peak` over `warmup_steps` (step 0 already
    takes peak/warmup_steps, never 0), then cosine decay to 0 at `total_steps`."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup_steps) / span)))


def steps_per_epoch(samples: int, world: int, batch: int) -> int:
    """Optimizer steps in an epoch on the busiest rank (the schedule's unit on every rank)."""
    return batch_count(math.ceil(samples / world), batch)


def warmup_steps(args: argparse.Namespace, per_epoch: int) -> int:
    steps: int = args.warmup_iters if args.warmup_iters is not None else round(args.warmup_epochs * per_epoch)
    return steps


def cpu_split(cores: int, cuda: bool, workers: int, threads: int) -> tuple[int, int]:
    """(data-loader workers, torch threads) for a rank that has `cores` cores of its own.
    On GPUs the workers feed the device and the compute is elsewhere: all cores but one
    (for the main process), at most 8. On CPUs the model's own compute needs the cores:
    a quarter go to loading (decoding JPEGs, augmenting), none below 4 cores, where the
    main process loads between steps (the memory-mapped records cost little)."""
    if workers < 0:
        workers = min(8, max(1, cores - 1)) if cuda else cores // 4
    return workers, threads or max(1, cores - workers)


def make_model(name: str, stem: str, channels: int, classes: int) -> tuple[nn.Module, str]:
    """resnet_synthetic's ResNet (torchvision's when it imports) with `classes` outputs.
    stem "cifar": a 3x3 stride-1 first conv and no max-pool, as He et al. do for CIFAR: the
    ImageNet stem would shrink 32 px to 8 before the first block (and 8 px digits to 2);
    this one keeps the resolution and downsamples 8x in all."""
    model: Any  # its layers are read by name (torch types them as Tensor | Module)
    model, impl = build_model(name)
    if stem == "cifar":
        model.conv1 = nn.Conv2d(channels, 64, 3, 1, 1, bias=False)
        model.maxpool = nn.Identity()
    elif channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.fc = nn.Linear(model.fc.in_features, classes)
    # Goyal et al.: each residual block's last BN starts at 0, so every block starts as the
    # identity; large-batch training starts stably (torchvision's zero_init_residual).
    for m in model.modules():
        last = {"BasicBlock": "bn2", "Bottleneck": "bn3"}.get(type(m).__name__)
        if last:
            nn.init.zeros_(getattr(m, last).weight)
    return model, impl


# --- flags --------------------------------------------------------------------------
def fraction(text: str) -> float:
    v = float(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a top-1 fraction in (0, 1]: use e.g. 0.9")
    return v


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ResNet training on real data, to a target top-1",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data", required=True, help="dataset folder (with dataset.json), e.g. /shared/datasets/cifar10")
    d = "the dataset's default (dataset.json, training)"
    p.add_argument("--model", choices=MODELS, help=f"ResNet depth; default: {d}")
    p.add_argument("--stem", choices=sorted(MIN_SIZE), help=f"cifar: 3x3 stride 1, no max-pool; imagenet: 7x7/2 + max-pool; default: {d}")
    p.add_argument("--batch-size", type=int, help=f"images per rank per step; default: {d}")
    p.add_argument("--base-lr", type=float, help=f"learning rate per 256 images of global batch; default: {d}")
    p.add_argument("--warmup-epochs", type=float, help=f"linear warm-up length in epochs; default: {d}")
    p.add_argument("--warmup-iters", type=int, help="linear warm-up length in optimizer steps (wins over --warmup-epochs)")
    p.add_argument("--epochs", type=int, help=f"most epochs to run; default: {d}")
    p.add_argument("--weight-decay", type=float, help=f"default: {d}")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--target-acc", type=fraction, help=f"stop at this test top-1 (0..1]; default: {d}")
    p.add_argument("--amp", action="store_true", help="autocast (fp16 + loss scaling on GPU, bf16 on CPU)")
    p.add_argument("--no-cuda", action="store_true", help="train on CPUs even where GPUs are")
    p.add_argument("--workers", type=int, default=-1, help="data-loader workers per rank (-1: sized to the rank's cores)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank (0: the rank's cores less the workers)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", help="shared folder for checkpoint.pt, written after every epoch; "
                                            "a run started with a checkpoint there goes on from it")
    p.add_argument("--resume", action="store_true", help="require a checkpoint in --checkpoint-dir (else an error)")
    p.add_argument("--stop-after-epochs", type=int,
                   help="end this run after so many epochs (checkpointed: run again to go on), e.g. inside a job's time limit")
    p.add_argument("--compute-steps", type=int, default=30,
                   help="after training, time so many steps on one batch held in memory: img/s without data "
                        "loading, to read the epochs' img/s against (0: skip)")
    p.add_argument("--json", action="store_true", help="rank 0 ends with one JSON line with all figures")
    p.add_argument("--progress", action="store_true", help="rank 0 prints 'PROGRESS {json}' lines (deployer bench shows them)")
    p.add_argument("--heartbeat", type=float, default=0,
                   help="every rank prints HEARTBEAT lines every this many seconds (bench_common.Heartbeat; 0: none)")
    args = p.parse_args(argv)
    if args.resume and not args.checkpoint_dir:
        p.error("--resume needs --checkpoint-dir")
    if args.compute_steps < 0:
        p.error("--compute-steps must be 0 or more")
    for flag in ("batch_size", "epochs", "stop_after_epochs"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    return args


def with_defaults(args: argparse.Namespace, manifest: dict[str, Any]) -> argparse.Namespace:
    """Fill the flags not given from the dataset's training defaults."""
    for k, v in manifest.get("training", {}).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    fallback = {"model": "resnet18", "stem": "imagenet" if manifest["shape"][1] >= 64 else "cifar", "batch_size": 32,
                "base_lr": 0.1, "warmup_epochs": 1.0, "epochs": 30, "weight_decay": 5e-4, "target_acc": 0.9}
    for k, v in fallback.items():  # an imported dataset's manifest may carry no training defaults
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


# --- checkpoints ----------------------------------------------------------------------
def run_key(args: argparse.Namespace, manifest: dict[str, Any], world: int) -> dict[str, Any]:
    """What a checkpoint must agree on to be continued: the same data, model and step."""
    return {"dataset": manifest["name"], "model": args.model, "stem": args.stem,
            "global_batch": args.batch_size * world, "base_lr": args.base_lr}


def checkpoint_to_resume(checkpoint_dir: str | None, resume: bool) -> str | None:
    """The checkpoint this run goes on from: the one in --checkpoint-dir if there is one."""
    path = os.path.join(checkpoint_dir, CHECKPOINT) if checkpoint_dir else None
    if path and os.path.exists(path):
        return path
    if resume:
        raise SystemExit(f"--resume: no checkpoint at {path}")
    return None


def save_checkpoint(path: str, state: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # a run killed while saving leaves the previous checkpoint whole


def load_checkpoint(path: str, key: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain data only: no code runs
    if state.get("key") != key:
        raise SystemExit(f"{path} is from another run ({state.get('key')}, this one is {key}): "
                         "use another --checkpoint-dir or remove the checkpoint")
    return state


# --- the run --------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    manifest = load_manifest(args.data)
    with_defaults(args, manifest)
    comm, rank, size, _, hosts, args.cuda, device, gpus, cores = place_rank(args.no_cuda)
    workers, threads = cpu_split(cores, args.cuda, args.workers, args.threads)
    torch.set_num_threads(threads)
    beat = Heartbeat.started(rank, args.heartbeat)  # until the process ends: see resnet_synthetic
    beat.step = "setup"
    if size > 1:
        addr, port = rendezvous(comm, hosts)
        dist.init_process_group("nccl" if args.cuda else "gloo", init_method=f"tcp://{addr}:{port}",
                                rank=rank, world_size=size, timeout=datetime.timedelta(minutes=10))

    def log(s: str) -> None:
        if rank == 0:
            print(s, flush=True)

    last_progress = [0.0]

    def progress(force: bool = False, **fields: Any) -> None:
        # at most two a second: a CIFAR epoch has hundreds of steps per rank
        if args.progress and rank == 0 and (force or time.monotonic() - last_progress[0] >= 0.5):
            last_progress[0] = time.monotonic()
            print("PROGRESS " + json.dumps(fields), flush=True)

    t_setup = time.monotonic()
    train_ds = open_split(args.data, manifest, "train", train=True, stem=args.stem)
    test_ds = open_split(args.data, manifest, "test", train=False, stem=args.stem)
    if len(train_ds) < size:  # a rank with no image would run no step, and the others would wait for it
        raise SystemExit(f"{len(train_ds)} training images cannot be shared by {size} ranks: run fewer ranks")
    train_sampler = ExactDistributedSampler(train_ds, size, rank, shuffle=True, seed=args.seed)
    test_sampler = ExactDistributedSampler(test_ds, size, rank, shuffle=False)
    loader_opts = {"num_workers": workers, "pin_memory": args.cuda, "persistent_workers": workers > 0}
    train_loader = DataLoader(WithBytes(train_ds), batch_sampler=MergedBatchSampler(train_sampler, args.batch_size), **loader_opts)
    test_loader = DataLoader(test_ds, batch_size=args.batch_size * 2, sampler=test_sampler, **loader_opts)

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model, impl = make_model(args.model, args.stem, manifest["shape"][0], len(manifest["classes"]))
    model = model.to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.0, momentum=args.momentum, weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp and args.cuda)
    amp_dtype = torch.float16 if args.cuda else torch.bfloat16
    torch.manual_seed(args.seed + 1 + rank)  # augmentation: a different stream on every rank

    global_batch = args.batch_size * size
    peak = peak_lr(args.base_lr, global_batch)
    per_epoch = steps_per_epoch(len(train_ds), size, args.batch_size)
    warm, total = warmup_steps(args, per_epoch), args.epochs * per_epoch
    key = run_key(args, manifest, size)
    ckpt = os.path.join(args.checkpoint_dir, CHECKPOINT) if args.checkpoint_dir else None
    # Every rank must make the same choice (one resuming alone would wait forever in the
    # first all-reduce): a checkpoint some ranks see and others do not is an error.
    seen = comm.allgather(ckpt is not None and os.path.exists(ckpt))
    if any(seen) and not all(seen):
        raise SystemExit(f"{ckpt} is seen by ranks {[r for r, s in enumerate(seen) if s]} only: "
                         "put --checkpoint-dir on the shared dir")
    history, start_epoch, resumed_from = [], 0, None
    if resume_path := checkpoint_to_resume(args.checkpoint_dir, args.resume):  # ckpt, where it exists
        state = load_checkpoint(resume_path, key)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        history, start_epoch = state["history"], state["epoch"]
        resumed_from = start_epoch
        if len(state.get("rng", [])) == size:  # same world: each rank's augmentation stream goes on
            torch.set_rng_state(state["rng"][rank])
    if args.checkpoint_dir and rank == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
    ddp = size > 1
    net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if args.cuda else None) if ddp else model

    def all_sum(values: list[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        if ddp:
            dist.all_reduce(t, op=op)
        return t.tolist()

    def train_step(x: torch.Tensor, y: torch.Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
            loss = F.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.item()  # waits for the step: the next batch's wait is the loader's alone

    def train_epoch(epoch: int) -> dict[str, Any]:
        """Over all ranks: seconds (the slowest rank's; the clock includes waiting for data),
        images, mean loss, the seconds a rank waited for the loader (mean over ranks) and the
        dataset bytes read."""
        net.train()
        train_sampler.set_epoch(epoch)
        seen, loss_sum, nb, wait, nbytes = 0, 0.0, len(train_loader), 0.0, 0
        t0 = tw = time.perf_counter()
        # every rank runs as many steps (MergedBatchSampler), so no DDP join() is needed
        for b, (x, y, sizes) in enumerate(train_loader):
            wait += time.perf_counter() - tw
            nbytes += int(sizes.sum())
            for g in optimizer.param_groups:
                g["lr"] = lr_at(epoch * per_epoch + b, peak=peak, warmup_steps=warm, total_steps=total)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = train_step(x, y)
            seen += len(y)
            loss_sum += loss * len(y)
            progress(phase="train", epoch=epoch + 1, epochs=args.epochs, batch=b + 1, batches=nb)
            tw = time.perf_counter()
        if args.cuda:
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        n, loss_total, wait_total, bytes_total = all_sum([seen, loss_sum, wait, nbytes])
        return {"secs": all_sum([secs], dist.ReduceOp.MAX)[0], "images": n, "loss": loss_total / max(1, n),
                "wait_s": wait_total / size, "read_bytes": int(bytes_total)}

    def compute_only(steps: int) -> float | None:
        """img/s of the same training step (model, batch, AMP, DDP all-reduce) on one batch
        held in memory: the figure without data loading at this N, to read the epochs'
        img/s against. At learning rate 0, and the model's state put back afterwards
        (BatchNorm's running statistics move in training mode), so the trained model is
        the one checkpointed and evaluated; outside every timed epoch."""
        if steps < 1:
            return None
        x, y, _ = next(iter(train_loader))
        x, y = x.to(device), y.to(device)
        saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
        for g in optimizer.param_groups:
            g["lr"] = 0.0
        net.train()
        for _ in range(2):  # warm-up: allocator, cuDNN autotuning, DDP buckets
            train_step(x, y)
        all_sum([0.0])  # start together
        t0 = time.perf_counter()
        for _ in range(steps):
            train_step(x, y)
        if args.cuda:
            torch.cuda.synchronize()
        secs = all_sum([time.perf_counter() - t0], dist.ReduceOp.MAX)[0]
        images = all_sum([len(y) * steps])[0]
        model.load_state_dict(saved)
        return images / secs

    @torch.no_grad()
    def evaluate() -> tuple[float, float, int]:
        """(seconds, top-1, images) on the whole test split: each rank its shard, then one sum.
        The bare model, not DDP: DDP's forward may broadcast buffers, a collective that
        ranks with a different number of test batches would not all join."""
        model.eval()
        correct: float
        seen: float
        correct, seen = 0, 0
        t0 = time.perf_counter()
        for x, y in test_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                correct += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
        secs = time.perf_counter() - t0
        correct, seen = all_sum([correct, seen])
        return all_sum([secs], dist.ReduceOp.MAX)[0], correct / max(1, seen), int(seen)

    dev = "GPU" if args.cuda else "CPU"
    c, h, w = manifest["shape"]
    log(f"Dataset: {manifest['name']} ({len(train_ds)} train / {len(test_ds)} test images, {c}x{h}x{w}, "
        f"{len(manifest['classes'])} classes)")
    log(f"Model: {args.model} ({args.stem} stem, {impl})")
    log(f"Number of {dev}s: {size}, batch {args.batch_size} per rank (global {global_batch}), "
        f"{workers} loader worker(s) and {threads} thread(s) per rank")
    log(f"Learning rate: {peak:g} (base {args.base_lr:g} x {global_batch}/256), warm-up {warm} of {total} steps, "
        f"cosine decay; target top-1 {args.target_acc:g} within {args.epochs} epochs")
    if resumed_from is not None:
        log(f"Resumed from {ckpt}: {resumed_from} epoch(s) done")
    setup_s = time.monotonic() - t_setup

    reached = next((e for e in history if e["top1"] >= args.target_acc), None)
    ran_now = 0
    for epoch in range(start_epoch, args.epochs):
        if reached or (args.stop_after_epochs and ran_now >= args.stop_after_epochs):
            break
        started_at = time.time()
        beat.step = f"epoch {epoch + 1}"
        tr = train_epoch(epoch)
        train_s, n, loss = tr["secs"], tr["images"], tr["loss"]
        beat.step = f"evaluation after epoch {epoch + 1}"
        eval_s, top1, n_test = evaluate()
        elapsed = (history[-1]["elapsed_s"] if history else 0.0) + train_s + eval_s
        rec = {"epoch": epoch + 1, "img_per_sec": n / train_s, "train_s": train_s, "eval_s": eval_s,
               "epoch_s": train_s + eval_s, "elapsed_s": elapsed, "loss": loss, "top1": top1,
               "train_images": int(n), "test_images": n_test, "lr": optimizer.param_groups[0]["lr"],
               "world_size": size, "data_wait_s": tr["wait_s"], "data_wait_frac": tr["wait_s"] / train_s,
               "read_bytes": tr["read_bytes"], "read_mb_per_s": tr["read_bytes"] / train_s / 1e6,
               "started_at": started_at, "ended_at": time.time()}
        history.append(rec)
        ran_now += 1
        log(f"Epoch {epoch + 1}/{args.epochs}: {rec['img_per_sec']:.1f} img/sec, {rec['epoch_s']:.1f} s "
            f"(train {train_s:.1f} s, eval {eval_s:.1f} s), loss {loss:.3f}, top-1 {top1:.4f}; "
            f"waited for data {100 * rec['data_wait_frac']:.0f} % of training, read {rec['read_mb_per_s']:.2f} MB/s")
        progress(force=True, phase="epoch_done", epoch=epoch + 1, epochs=args.epochs, top1=top1,
                 img_per_sec=rec["img_per_sec"], epoch_s=rec["epoch_s"])
        if top1 >= args.target_acc:
            reached = rec
        beat.step = f"checkpoint after epoch {epoch + 1}"
        if ckpt:  # outside the timed epoch: time to accuracy counts training and evaluation only
            rngs = comm.gather(torch.get_rng_state())
            if rank == 0:
                save_checkpoint(ckpt, {"key": key, "epoch": epoch + 1, "step": (epoch + 1) * per_epoch,
                                       "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                       "scaler": scaler.state_dict(), "history": history, "rng": rngs})
            comm.Barrier()  # every rank goes on only once the checkpoint is whole

    best = max(history, key=lambda e: e["top1"], default=None)
    beat.step = "compute-only steps"
    compute_ips = compute_only(args.compute_steps) if ran_now else None
    if compute_ips:
        log(f"Without data loading (one batch held in memory, {args.compute_steps} steps): {compute_ips:.1f} img/sec")
    if reached:
        log(f"Reached top-1 {reached['top1']:.4f} (target {args.target_acc:g}) at epoch {reached['epoch']}: "
            f"{reached['elapsed_s']:.1f} s of training and evaluation")
    elif len(history) >= args.epochs:
        log(f"Target top-1 {args.target_acc:g} not reached in {args.epochs} epochs"
            + (f" (best {best['top1']:.4f} at epoch {best['epoch']})" if best else ""))
    else:
        log(f"Stopped after epoch {len(history)} of {args.epochs}: run again with --checkpoint-dir {args.checkpoint_dir} to go on")
    beat.done_together(comm)
    if args.json and rank == 0:
        flags = {k: v for k, v in vars(args).items()}
        log(json.dumps({
            "benchmark": "resnet_train", "dataset": manifest["name"], "model": args.model, "stem": args.stem,
            "device": dev, "world_size": size, "batch_size": args.batch_size, "global_batch": global_batch,
            "base_lr": args.base_lr, "peak_lr": peak, "warmup_steps": warm, "total_steps": total,
            "epochs": args.epochs, "epochs_run": len(history), "target_acc": args.target_acc,
            "reached": reached is not None, "time_to_target_s": reached["elapsed_s"] if reached else None,
            "epochs_to_target": reached["epoch"] if reached else None,
            "best_top1": best["top1"] if best else None, "finished": reached is not None or len(history) >= args.epochs,
            "resumed_from_epoch": resumed_from, "setup_s": setup_s, "workers": workers, "threads": threads,
            "compute_img_per_sec": compute_ips, "compute_steps": args.compute_steps if compute_ips else 0,
            "amp": args.amp, "history": history, "flags": flags, "versions": versions(args.cuda, hosts, impl, gpus)}))
    if ddp:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
