"""`deployer check`: an acceptance report of the cluster, a verdict per node (check.py)."""
