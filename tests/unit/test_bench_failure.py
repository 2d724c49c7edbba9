"""Failure diagnosis on what mpirun --tag-output really printed (recorded on a local
3-node cluster: a rank SIGKILLed mid-run; a rank raising an exception)."""

from pathlib import Path

from deployer.launch.failure import diagnose, untag

from ..clusters import typed

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
CLUSTER = typed({"nodes": [
    {"name": "b11-master", "private_ip": "10.77.0.10", "gpus": 0},
    {"name": "b11-worker-1", "private_ip": "10.77.0.11", "gpus": 0},
    {"name": "b11-worker-2", "private_ip": "10.77.0.12", "gpus": 0},
]})


def recorded(name: str) -> tuple[str, str]:
    out, _, err = (FIXTURES / name).read_text().partition("----\n")
    return out, err


def test_untag():
    assert untag("[1,3]<stderr>:ValueError: x") == (3, "stderr", "ValueError: x")
    assert untag('[1,0]<stdout>:{"a": 1}') == (0, "stdout", '{"a": 1}')
    assert untag("mpirun noticed ...") == (None, None, "mpirun noticed ...")
    # A long line forwarded in two chunks, each tagged (recorded from allreduce.py's JSON).
    split = '[1,0]<stdout>:{"rows": [{"algbw_gb_s": 0.68, "b[1,0]<stdout>:usbw_gb_s": 0.91}]}'
    assert untag(split) == (0, "stdout", '{"rows": [{"algbw_gb_s": 0.68, "busbw_gb_s": 0.91}]}')


def test_a_rank_killed_by_a_signal_is_named_with_its_node():
    out, err = recorded("mpirun_rank_killed.txt")
    why = diagnose(137, out, err, CLUSTER.rank_nodes(2), 1800)
    assert why.startswith("rank 1 on b11-worker-1 was killed by signal 9 (Killed)"), why
    assert "timed out" not in why  # 137 here is the rank's SIGKILL, not timeout's


def test_a_rank_exception_is_named_with_its_last_words():
    out, err = recorded("mpirun_rank_exception.txt")
    why = diagnose(1, out, err, CLUSTER.rank_nodes(2), 1800)
    assert why == "rank 1 on b11-worker-1 failed with exit code 1: ValueError: boom: rank 1 gave up"


def test_timeout():
    assert diagnose(124, "", "", CLUSTER.rank_nodes(3), 600).startswith("timed out after 600s")


def test_ranks_follow_the_slots():
    gpu = typed({"nodes": [{"name": "m", "gpus": 2}, {"name": "w", "gpus": 2}]})
    assert [n.name for n in gpu.rank_nodes(2)] == ["m", "m", "w", "w"]
    assert "rank 3 on w failed" in diagnose(1, "", "[1,3]<stderr>:Traceback (most recent call last):\n[1,3]<stderr>:OSError: disk\n",
                                           gpu.rank_nodes(2), 60)
