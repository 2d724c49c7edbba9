"""deployer.remote.stream: what every command on the master goes through (benchmarks,
smoke check, status probes): lines as they come, both streams, the exit code, a timeout."""

from __future__ import annotations

from deployer.remote import stream


def test_lines_arrive_as_printed_and_both_streams_and_the_exit_code_come_back():
    seen: list[str] = []
    rc, out, err = stream(["bash", "-c", "echo one; echo oops >&2; echo two; exit 3"], timeout=30, on_line=seen.append)
    assert (rc, out, err) == (3, "one\ntwo\n", "oops\n")
    assert seen == ["one", "two"]


def test_past_the_timeout_the_process_is_killed_and_says_so():
    rc, out, err = stream(["bash", "-c", "echo started; sleep 30"], timeout=1)
    assert rc == 124 and out == "started\n" and err == "timed out after 1s"
