"""The local provider: LXC system containers on this machine (provider.py), made by the
command-line driver lxc.py that Terraform's local-exec and the in-process repair call."""
