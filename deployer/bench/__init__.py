"""`deployer bench`: the sweep over node counts (sweep.py: profiles, the commands it
sends, the session; how a program is launched across the cluster is deployer/launch/, shared
with `deployer check`), the training run to a target accuracy (training.py), and what
their results become: the report (report.py, validated by schema.py), the progress
lines (progress.py), the Pushgateway series (metrics.py) and the shared storage's reads (storage_reads.py)."""
