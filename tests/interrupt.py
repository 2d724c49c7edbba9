"""Children a test will Ctrl-C, started as a shell starts its foreground job.

A test run started in the background without job control (`bash .ci/run &`, nohup) has
SIGINT ignored, and every child inherits that; the deployer leaves an ignored SIGINT
ignored, as nohup expects (deployer/signals.py), so the test's Ctrl-C would reach nothing.
"""

from __future__ import annotations

import signal


def sigint_as_from_a_shell() -> None:
    """`preexec_fn` for such a child: SIGINT at its default, whatever the test run inherited."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
