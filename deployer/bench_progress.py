"""Progress of a benchmark run, read from the `PROGRESS {json}` lines rank 0 prints
(benchmarks/resnet_synthetic.py --progress): where the run is, img/s so far, an ETA.
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

from . import ui


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
                 emit: Callable[[str], None] | None = None):
        self.label = label
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
        self.show(now)

    # -- saying ----------------------------------------------------------------------
    def eta_s(self, now: float) -> float | None:
        total = self.plan.get("warmup", 0) + self.plan.get("iters", 0) * self.plan.get("batches", 0)
        if not total or not self.done or self.first_batch_at is None:
            return None
        per_batch = (now - self.first_batch_at) / self.done
        return per_batch * (total - self.done)

    def text(self, now: float) -> str:
        parts = [self.label, self.phase]
        if self.rates:
            parts.append(f"{sum(self.rates) / len(self.rates):.1f} img/s per rank so far")
        eta = self.eta_s(now)
        if eta is not None:
            parts.append(f"ETA {eta:.0f}s")
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
