"""Console output: rich on stderr, data (--json) alone on stdout.

Progress spinners only on a TTY, so CI logs and pipes stay plain text.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def info(msg: str) -> None:
    err.print(msg)


def step(msg: str) -> None:
    err.print(f"[bold cyan]==>[/] {msg}")


def ok(msg: str) -> None:
    err.print(f"[green]✓[/] {msg}")


def warn(msg: str) -> None:
    err.print(f"[yellow]warning:[/] {msg}")


def error(msg: str) -> None:
    err.print(f"[red]error:[/] {msg}", markup=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


@contextmanager
def status(msg: str) -> Iterator[None]:
    """A spinner on a TTY; a plain line otherwise."""
    if err.is_terminal:
        with err.status(msg):
            yield
    else:
        step(msg)
        yield


def human_bytes(n: float, si: bool = False) -> str:
    """1.5 GiB (files, disks), or with si 1.6 GB (bytes on the wire, as network tools count)."""
    base, units = (1000, ("B", "kB", "MB", "GB")) if si else (1024, ("B", "KiB", "MiB", "GiB"))
    for unit in units:
        if n < base or unit == units[-1]:
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= base
    raise AssertionError  # unreachable
