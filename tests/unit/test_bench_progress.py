"""Progress lines from the benchmark's PROGRESS records: phase, rate, ETA, throttling."""

import json

from deployer.bench.progress import RunProgress, SweepProgress


def feed(p, **ev):
    p("PROGRESS " + json.dumps(ev))


def test_phases_rate_and_eta():
    now = [0.0]
    said = []
    p = RunProgress("2 node(s) dp", every_s=0, clock=lambda: now[0], emit=said.append)
    p("Model: resnet18")  # Horovod's own lines pass by
    p("PROGRESS {not json")  # a torn line is ignored
    feed(p, phase="start", warmup=2, iters=2, batches=3)
    assert said[-1] == "2 node(s) dp · warm-up 0/2"
    now[0] = 1.0
    feed(p, phase="warmup", iter=0, batch=1, batches=2)
    # 1 of 8 batches in 1 s: 7 s to go
    assert said[-1] == "2 node(s) dp · warm-up 1/2 · ETA 7s"
    now[0] = 2.0
    feed(p, phase="warmup", iter=0, batch=2, batches=2)
    now[0] = 3.0
    feed(p, phase="iter", iter=1, batch=1, batches=3)
    assert said[-1] == "2 node(s) dp · iteration 1/2, batch 1/3 · ETA 5s"
    feed(p, phase="iter_done", iter=1, iters=2, img_per_sec=40.0)
    assert "40.0 img/s per rank so far" in said[-1]


def test_plain_output_is_throttled():
    now = [0.0]
    said = []
    p = RunProgress("1 node(s) dp", every_s=5, clock=lambda: now[0], emit=said.append)
    feed(p, phase="start", warmup=100, iters=1, batches=1)
    for i in range(1, 100):
        now[0] = i * 0.5
        feed(p, phase="warmup", iter=0, batch=i, batches=100)
    # 50 s of batches every 0.5 s: a line every 5 s, not 100 lines
    assert 9 <= len(said) <= 11


def test_allreduce_rows_as_they_come():
    now = [0.0]
    said = []
    p = SweepProgress(every_s=5, clock=lambda: now[0], emit=said.append)
    p("#       size         count      type   redop    root     time   algbw   busbw #wrong")
    p("        1024           256     float     sum      -1   5914.8    0.00    0.00      0")
    now[0] = 1.0
    p("        2048           512     float     sum      -1   5399.2    0.00    0.00      0")  # within 5 s: quiet
    now[0] = 6.0
    p("     4194304       1048576     float     sum      -1  11828.0    0.35    0.47      0")
    assert said == ["all-reduce · 1024 B · busbw 0.00 GB/s", "all-reduce · 4194304 B · busbw 0.47 GB/s"]
