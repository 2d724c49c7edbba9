"""The local clusters' training environment (deployer/providers/local/runtime_env.py): what
it holds comes from the same facts the training_runtime role reads, and a cluster's copy is
hard links, never a copy of GBs, and never overwrites what a cluster has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deployer import gpu_runtime, paths
from deployer.providers.local import runtime_env


def test_it_holds_what_the_role_installs_on_a_gpu_less_cluster():
    rt = runtime_env.runtime_for("/shared")
    choice = gpu_runtime.cpu_choice()
    extras = yaml.safe_load((paths.ansible_dir() / "roles/training_runtime/defaults/main.yml").read_text())[
        "training_runtime_extra_packages"]
    assert rt.requirements == (choice.requirement, choice.torchvision, *extras)
    assert rt.requirements[0] == f"torch=={gpu_runtime.matrix()['default_torch']}"
    assert rt.venv == "/shared/venv"


def test_a_named_release_or_another_shared_dir_is_another_environment():
    default = runtime_env.runtime_for("/shared")
    assert runtime_env.runtime_for("/shared/").key == default.key
    assert runtime_env.runtime_for("/data").key != default.key  # scripts carry the venv's path
    older = runtime_env.runtime_for("/shared", "2.7.1")
    assert older.requirements[:2] == ("torch==2.7.1", "torchvision==0.22.*") and older.key != default.key


def test_the_wheels_are_for_the_nodes_python_and_every_manylinux_tag_their_glibc_takes():
    args = runtime_env._platform_args()
    tags = args[1::2]
    assert set(args[::2]) == {"--platform"}
    assert f"manylinux_2_{runtime_env.NODE_GLIBC_MINOR}_" in tags[0]
    # torch 2.13's wheel is tagged manylinux_2_28, mpi4py's manylinux1: both must be taken.
    assert any(t.startswith("manylinux_2_28_") for t in tags) and any(t.startswith("manylinux1_") for t in tags)


def test_a_cluster_gets_hard_links_and_keeps_its_own_environment(tmp_path: Path):
    env = tmp_path / "cache" / "venv"
    (env / "lib").mkdir(parents=True)
    (env / "lib" / "big.so").write_bytes(b"x" * 4096)
    target = tmp_path / "shared" / "venv"
    target.parent.mkdir()
    assert runtime_env.link_into(env, target) is True
    assert (target / "lib" / "big.so").stat().st_ino == (env / "lib" / "big.so").stat().st_ino
    assert not list(target.parent.glob(".*linking"))
    # A re-run keeps what the cluster installed since.
    (target / "lib" / "mine.py").write_text("x = 1\n")
    assert runtime_env.link_into(env, target) is False
    assert (target / "lib" / "mine.py").exists()


def test_a_failed_link_says_what_to_do_and_leaves_nothing(tmp_path: Path):
    target = tmp_path / "shared" / "venv"
    target.parent.mkdir()
    with pytest.raises(runtime_env.DriverError, match="DEPLOYER_CACHE_DIR"):
        runtime_env.link_into(tmp_path / "no-such-env", target)
    assert not target.exists() and not list(target.parent.iterdir())


def test_make_deps_reads_the_same_list():
    out = subprocess.run([sys.executable, "-m", "deployer.providers.local.runtime_env", "requirements"],
                         text=True, capture_output=True, check=True).stdout.split()
    assert tuple(out) == runtime_env.runtime_for("/shared").requirements
