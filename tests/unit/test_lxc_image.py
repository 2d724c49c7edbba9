"""The local image's trimmed cloud-init still applies every key of the user-data.

The image runs two of cloud-init's four stages and only the modules the user-data needs
(deployer/providers/local/image.py, CLOUD_CFG). Which module reads which key is cloud-init's own
knowledge: its JSON schema names, per module, the keys it takes. The host's cloud-init
is Debian bookworm's, the version the image boots with (`make deps` installs it).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml

from deployer.pipeline import boot
from deployer.providers.local import image
from deployer.spec import ClusterSpec
from deployer.state import ClusterState

CLOUDINIT = Path("/usr/lib/python3/dist-packages/cloudinit")
SCHEMA = CLOUDINIT / "config/schemas/schema-cloud-config-v1.json"
UNITS = Path("/lib/systemd/system")
pytestmark = pytest.mark.skipif(not SCHEMA.exists(), reason="cloud-init not installed (apt-get install cloud-init; `make deps` does)")


@functools.cache
def schema_defs() -> dict:
    return json.loads(SCHEMA.read_text())["$defs"]


def modules_taking(key: str) -> set[str]:
    """The modules whose schema declares `key` (cc_set_hostname -> set_hostname)."""
    defs = schema_defs()
    return {name.removeprefix("cc_") for name, d in defs.items() if name.startswith("cc_") and key in d.get("properties", {})}


def user_data_keys(tmp_path: Path) -> list[str]:
    spec = ClusterSpec(name="img", provider="local", nodes=2)
    state = ClusterState(tmp_path / "state", "img")
    state.create()
    d = boot.write_user_data(spec, state)
    return list(yaml.safe_load((d / "img-worker-1.user-data").read_text()))


def enabled() -> set[str]:
    cfg = yaml.safe_load(image.CLOUD_CFG)
    return {m.replace("-", "_") for stage in ("cloud_init_modules", "cloud_config_modules", "cloud_final_modules")
            for m in cfg[stage]}


def test_every_user_data_key_keeps_every_module_that_reads_it(tmp_path):
    keys = user_data_keys(tmp_path)
    assert {"users", "ssh_keys", "ssh_pwauth", "bootcmd", "hostname"} <= set(keys)
    runs = enabled()
    for key in keys:
        readers = modules_taking(key)
        assert readers, f"no cloud-init module takes {key!r}: the schema file moved, or the key is wrong"
        assert readers <= runs, f"{key!r} is read by {sorted(readers - runs)}, which the local image does not run"


def test_the_check_fails_when_a_module_goes(tmp_path, monkeypatch):
    # Not a rubber stamp: without set_passwords, ssh_pwauth would be silently ignored.
    monkeypatch.setattr(image, "CLOUD_CFG", image.CLOUD_CFG.replace(", set_passwords", ""))
    with pytest.raises(AssertionError, match="'ssh_pwauth' is read by \\['set_passwords'\\]"):
        test_every_user_data_key_keeps_every_module_that_reads_it(tmp_path)


def test_every_listed_module_exists_in_cloud_init():
    # A misspelt module is only a warning in cloud-init's log; here it fails.
    for module in enabled():
        assert (CLOUDINIT / "config" / f"cc_{module}.py").exists(), module


def test_the_masked_stages_are_cloud_inits_units_and_the_final_stage_stays():
    for unit in ("cloud-init-local.service", "cloud-config.service"):
        assert unit in image.MASKED_UNITS
        assert (UNITS / unit).exists(), f"{unit} is not a unit of the installed cloud-init"
    # The final stage writes result.json: without it `cloud-init status` says running forever.
    assert not {"cloud-init.service", "cloud-final.service"} & set(image.MASKED_UNITS)
    assert "final_message" in enabled()  # writes boot-finished


def test_a_change_to_the_boot_config_makes_a_new_image():
    stamp = json.loads(image.IMAGE_STAMP)
    assert stamp["cloud_cfg"] == image.CLOUD_CFG and stamp["masked"] == image.MASKED_UNITS
