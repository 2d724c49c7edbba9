"""`deployer check`: an acceptance report of the cluster, a verdict per node (run.py runs the
checks of cluster_checks.py, analyse.py judges, show.py prints)."""
