"""The OpenStack provider (provider.py) and what it asks the cloud, one job a module:
session, preflight and quota, observe, delete, appcred (the teardown credential) and
teardown (the script the master runs at expiry, with the stdlib and openstacksdk only)."""
