"""Programs run across the cluster from the master, as `deployer bench` and `deployer check`
both run them: the mpirun line and the stop (mpirun.py), every rank watched (rank_watch.py),
why a run failed from its tagged output (failure.py), iperf3 between nodes (iperf.py)."""
