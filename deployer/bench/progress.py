"""Progress of a benchmark run, read from the `PROGRESS {json}` lines rank 0 prints
(benchmarks/resnet_synthetic.py --progress): where the run is, img/s so far, an ETA.
benchmarks/resnet_train.py --progress (bench --data) prints `train` (epoch, batch) and
`epoch_done` (top-1, img/s, seconds of the epoch): the line then says the epoch, img/s,
top-1 so far against the target, and an ETA to the last epoch (a bound: the run stops at
the first epoch that reaches the target).
Under Slurm (bench --via slurm) benchmarks/slurm_job.py adds two: `queued` while the job
waits ("waiting for 2 node(s) (Resources)", said at once, not after the next interval)
and `running` when it starts.

On a terminal one spinner line is updated in place; otherwise (CI, a log file) a
timestamped line is printed at most every `every_s` seconds, so a long run is never
silent for long and a log stays short.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from .. import ui


def progress_event(line: str) -> dict[str, Any] | None:
    if not line.startswith("PROGRESS "):
        return None
    try:
        ev = json.loads(line[len("PROGRESS "):])
    except json.JSONDecodeError:
        return None
    return ev if isinstance(ev, dict) else None


def queued_text(ev: dict[str, Any]) -> str:
    return f"waiting for {ev.get('nodes', '?')} node(s) ({ev.get('reason', '?')}), {ev.get('waited_s', 0)}s in the queue"


class RunProgress:
    def __init__(self, label: str, *, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 emit: Callable[[str], None] | None = None, target: float | None = None):
        self.label = label
        self.target = target  # resnet_train: the top-1 it trains to
        self.epochs: list[dict[str, Any]] = []  # resnet_train: its epoch_done events
        self.train: dict[str, Any] = {}  # resnet_train: the latest train event
        self.epoch_started: float | None = None
        self.every_s = every_s
        self.clock = clock
        self.emit = emit
        self.started = clock()
        self.first_batch_at: float | None = None
        self.plan: dict[str, int] = {}
        self.done = 0  # batches finished, warm-up included
        self.phase = "starting ranks"
        self.rates: list[float] = []
        self.last_emit = -1e9
        self.spinner: Any = None

    # -- reading ---------------------------------------------------------------------
    def __call__(self, line: str) -> None:
        ev = progress_event(line)
        if ev is not None:
            self.update(ev)

    def update(self, ev: dict[str, Any]) -> None:
        now = self.clock()
        kind = ev.get("phase")
        if kind == "queued":  # said at once: a run that waits must not look hung
            self.phase = queued_text(ev)
            self.last_emit = -1e9
        elif kind == "running":
            self.phase = f"starting ranks on {ev.get('nodes') or '?'}"
        elif kind == "start":
            self.plan = {"warmup": int(ev["warmup"]), "iters": int(ev["iters"]), "batches": int(ev["batches"])}
            self.first_batch_at = now
            self.phase = f"warm-up 0/{self.plan['warmup']}"
        elif kind == "warmup":
            self.done += 1
            self.phase = f"warm-up {ev['batch']}/{ev['batches']}"
        elif kind == "iter":
            self.done += 1
            iters = self.plan.get("iters", "?")
            self.phase = f"iteration {ev['iter']}/{iters}, batch {ev['batch']}/{ev['batches']}"
        elif kind == "iter_done":
            self.rates.append(float(ev["img_per_sec"]))
        elif kind == "train":
            if self.epoch_started is None or ev.get("epoch") != self.train.get("epoch"):
                self.epoch_started = now
            self.train = ev
            self.phase = f"epoch {ev['epoch']}/{ev['epochs']}, batch {ev['batch']}/{ev['batches']}"
        elif kind == "epoch_done":
            self.epochs.append(ev)
            self.train = {}
            self.epoch_started = None
            self.phase = f"epoch {ev['epoch']}/{ev['epochs']} done"
            if self.target is not None and float(ev["top1"]) >= self.target:
                self.phase += ", target reached"
            self.last_emit = -1e9  # each epoch's accuracy is said
        self.show(now)

    def train_eta_s(self, now: float) -> float | None:
        """resnet_train: seconds to its last epoch at the pace so far (an upper bound); None
        once an epoch reached the target (the run is ending)."""
        if self.epochs and self.target is not None and float(self.epochs[-1]["top1"]) >= self.target:
            return None
        done = self.epochs[-1]["epoch"] if self.epochs else 0
        total = int((self.train or (self.epochs[-1] if self.epochs else {})).get("epochs") or 0)
        per_epoch = sum(float(e["epoch_s"]) for e in self.epochs) / len(self.epochs) if self.epochs else None
        left = 0.0
        if self.train and self.epoch_started is not None:
            b, nb = int(self.train["batch"]), int(self.train["batches"])
            spent = now - self.epoch_started
            # the clock starts at batch 1's event: b-1 batches timed so far (none yet at batch 1)
            this = per_epoch if per_epoch is not None else (spent * (nb - 1) / (b - 1) if b > 1 else None)
            if this is None:
                return None
            left, done = max(0.0, this - spent), done + 1
            per_epoch = per_epoch if per_epoch is not None else this
        if per_epoch is None or not total:
            return None
        return left + per_epoch * max(0, total - done)

    # -- saying ----------------------------------------------------------------------
    def eta_s(self, now: float) -> float | None:
        total = self.plan.get("warmup", 0) + self.plan.get("iters", 0) * self.plan.get("batches", 0)
        if not total or not self.done or self.first_batch_at is None:
            return None
        per_batch = (now - self.first_batch_at) / self.done
        return per_batch * (total - self.done)

    def text(self, now: float) -> str:
        if self.epochs or self.train:
            return self.train_text(now)
        parts = [self.label, self.phase]
        if self.rates:
            parts.append(f"{sum(self.rates) / len(self.rates):.1f} img/s per rank so far")
        eta = self.eta_s(now)
        if eta is not None:
            parts.append(f"ETA {eta:.0f}s")
        return " · ".join(parts)

    def train_text(self, now: float) -> str:
        parts = [self.label, self.phase]
        if self.epochs:
            last = self.epochs[-1]
            parts.append(f"{float(last['img_per_sec']):.1f} img/s")
            parts.append(f"top-1 {float(last['top1']):.4f}" + (f" (target {self.target:g})" if self.target else ""))
        eta = self.train_eta_s(now)
        if eta is not None:
            parts.append(f"ETA ≤ {eta:.0f}s")
        return " · ".join(parts)

    def show(self, now: float) -> None:
        if self.emit is not None:
            if now - self.last_emit >= self.every_s:
                self.last_emit = now
                self.emit(self.text(now))
            return
        if self.spinner is not None:
            self.spinner.update(self.text(now))
        elif now - self.last_emit >= self.every_s:
            self.last_emit = now
            ui.info(f"  {time.strftime('%H:%M:%S')} {self.text(now)}")

    def __enter__(self) -> RunProgress:
        if self.emit is None and ui.err.is_terminal:
            self.spinner = ui.err.status(self.text(self.clock()))
            self.spinner.start()
        else:
            self.show(self.clock())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.spinner is not None:
            self.spinner.stop()


class SweepProgress:
    """The all-reduce sweep's rows (nccl-tests format: size, count, type, redop, root,
    time, algbw, busbw, #wrong) as they come: "all-reduce · 4194304 B · busbw 0.47 GB/s"."""

    def __init__(self, every_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 emit: Callable[[str], None] | None = None):
        self.every_s = every_s
        self.clock = clock
        self.emit = emit or (lambda text: ui.info(f"  {time.strftime('%H:%M:%S')} {text}"))
        self.last_emit = -1e9

    def __call__(self, line: str) -> None:
        ev = progress_event(line)
        if ev is not None and ev.get("phase") == "queued":
            self.emit(f"all-reduce · {queued_text(ev)}")
            return
        parts = line.split()
        if len(parts) < 9 or not parts[0].isdigit():
            return
        now = self.clock()
        if now - self.last_emit >= self.every_s:
            self.last_emit = now
            self.emit(f"all-reduce · {int(parts[0])} B · busbw {parts[7]} GB/s")
