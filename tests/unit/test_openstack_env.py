"""The tests' OpenStack client isolation leaves the machine's search path as it found it."""

from __future__ import annotations


def test_a_test_of_its_own_reads_only_its_own_clouds_yaml(tmp_path, monkeypatch):
    from openstack.config import loader

    from tests import openstack_env  # here, not at collection: the next test must see what the others did

    clouds = openstack_env.isolate(monkeypatch, tmp_path)
    clouds.write_text("clouds:\n  mine:\n    auth: {auth_url: 'http://127.0.0.1:9/v3'}\n")
    assert loader.OpenStackConfig().get_cloud_names() == ["mine"]


def test_no_earlier_test_fixed_openstacksdk_search_path_in_its_tmp_path(tmp_path_factory):
    # openstacksdk computes CONFIG_FILES when first imported; once computed under a test's
    # HOME, every later test (the test cloud's own login among them) read that test's file.
    from openstack.config import loader

    base = str(tmp_path_factory.getbasetemp().parent)
    assert not [p for p in loader.CONFIG_FILES + loader.SECURE_FILES if p.startswith(base)]
