"""The torch build chosen for real driver/GPU combinations (deployer/gpu_runtime.py).

Each case states why its answer is right in terms of the published facts the matrix
holds (deployer/gpu_runtime.yaml): CUDA 11.x needs driver >= 450.80.02, 12.x >= 525.60.13,
13.x >= 580; torch 2.13's cu130 build starts at Turing (7.5), its cu126 build has Volta.
"""

from __future__ import annotations

import json

import pytest

from deployer import gpu_runtime
from deployer.gpu_runtime import Gpu, NoFit, choose

CASES = [
    # (GPU, compute capability, driver) -> (torch, variant): why
    ("Tesla V100-SXM2-16GB", "7.0", "470.82.01", "2.7.1", "cu118",
     "470 runs CUDA 11.x only; torch 2.7 is the last release with a CUDA 11.8 build, which has sm_70"),
    ("Tesla V100-SXM2-16GB", "7.0", "535.104.05", "2.13.0", "cu126",
     "cu130 needs 580 and has no sm_70; CUDA 12.6 runs on 535 and carries sm_70"),
    ("NVIDIA A100-SXM4-80GB", "8.0", "535.104.05", "2.13.0", "cu126", "cu130 needs driver 580"),
    ("NVIDIA H100 80GB HBM3", "9.0", "550.54.14", "2.13.0", "cu126", "cu130 needs driver 580"),
    ("NVIDIA L40S", "8.9", "570.86.15", "2.13.0", "cu126", "cu130 needs 580; 8.9 runs the 8.6 code of cu126"),
    ("NVIDIA H100 80GB HBM3", "9.0", "580.65.06", "2.13.0", "cu130", "580 runs CUDA 13; cu130 is the newest and has sm_90"),
]


@pytest.mark.parametrize(("name", "cc", "driver", "torch", "variant", "why"), CASES)
def test_real_combinations(name, cc, driver, torch, variant, why):
    c = choose([Gpu(name=name, driver=driver, compute_cap=cc)])
    assert (c.torch, c.variant) == (torch, variant), why
    assert c.cuda in c.reason and driver in c.reason and name in c.reason
    if variant == "cu130":  # PyPI's default wheel of 2.13.0 is the CUDA 13.0 build
        assert (c.requirement, c.index_url) == ("torch==2.13.0", None)
    else:
        assert c.requirement == f"torch=={torch}+{variant}"
        assert c.index_url == f"https://download.pytorch.org/whl/{variant}"


def test_cpu_cluster_gets_the_cpu_build():
    c = choose([])
    assert (c.torch, c.variant, c.requirement) == ("2.13.0", "cpu", "torch==2.13.0")
    assert c.index_url == "https://download.pytorch.org/whl/cpu" and c.torchvision == "torchvision==0.28.*"


def test_fallback_reason_says_why_the_default_release_does_not_fit():
    c = choose([Gpu(name="Tesla V100-PCIE-32GB", driver="470.82.01", compute_cap="7.0")])
    assert "torch 2.13.0: cu130 needs driver >= 580 and has no Volta (7.0) code" in c.reason
    assert "cu126 needs driver >= 525.60.13" in c.reason


def test_a_470_driver_without_compute_cap_is_read_by_name():
    c = choose(gpu_runtime.parse_smi("w1", "Tesla V100-SXM2-32GB, 470.82.01\n"))
    assert (c.torch, c.variant) == ("2.7.1", "cu118")


def test_the_lowest_driver_and_every_gpu_kind_decide_for_the_cluster():
    gpus = [Gpu("NVIDIA H100 80GB HBM3", "580.65.06", "9.0", "m"), Gpu("Tesla V100-SXM2-16GB", "580.65.06", "7.0", "w1")]
    assert choose(gpus).variant == "cu126"  # cu130 has no Volta code
    gpus = [Gpu("NVIDIA H100 80GB HBM3", "580.65.06", "9.0", "m"), Gpu("NVIDIA H100 80GB HBM3", "550.54.14", "9.0", "w1")]
    c = choose(gpus)
    assert c.variant == "cu126" and "lowest, on w1" in c.reason


def test_no_fit_names_the_driver_branch_to_install():
    with pytest.raises(NoFit, match="install driver branch 470 or newer"):
        choose([Gpu("Tesla V100-SXM2-16GB", "418.67", "7.0")])
    # Blackwell code exists only in CUDA 13 builds here: 580 is the floor.
    with pytest.raises(NoFit, match="install driver branch 580 or newer"):
        choose([Gpu("NVIDIA B200", "570.86.15", "10.0")])


def test_unknown_gpu_without_compute_cap_asks_for_the_spec():
    with pytest.raises(NoFit, match="gpu_runtime"):
        choose([Gpu("NVIDIA Mystery 9000", "470.82.01", None)])


def test_spec_overrides():
    a100 = [Gpu("NVIDIA A100-SXM4-80GB", "535.104.05", "8.0")]
    assert choose(a100, cuda="cu118").requirement == "torch==2.7.1+cu118"  # an older release has it
    assert choose(a100, torch="2.7.1").variant == "cu126"
    c = choose(a100, cuda="cpu")
    assert (c.variant, c.source) == ("cpu", "spec")
    with pytest.raises(NoFit, match="580 or newer.*remove gpu_runtime.cuda"):
        choose(a100, torch="2.13.0", cuda="cu130")
    with pytest.raises(NoFit, match="known: 2.14.0, 2.13.0, 2.7.1"):
        choose(a100, torch="2.9.0")
    with pytest.raises(NoFit, match="has a cu999 build"):
        choose(a100, cuda="cu999")


def test_old_python_on_the_nodes():
    a100 = [Gpu("NVIDIA A100-SXM4-80GB", "535.104.05", "8.0")]
    assert choose(a100, python=(3, 9)).torch == "2.7.1"  # 2.13 needs 3.10
    with pytest.raises(NoFit, match="needs Python >= 3.10"):
        choose(a100, torch="2.13.0", python=(3, 8))


def test_binary_compatibility_within_a_major_only():
    assert gpu_runtime.runs_on("8.9", ["8.0", "8.6"])
    assert not gpu_runtime.runs_on("8.0", ["8.6"])
    assert not gpu_runtime.runs_on("10.0", ["9.0"])


def test_every_release_in_the_matrix_is_well_formed():
    m = gpu_runtime.matrix()
    assert m["default_torch"] in [r["torch"] for r in m["releases"]]
    for r in m["releases"]:
        assert sum(bool(b.get("pypi_default")) for b in r["builds"]) <= 1
        for b in r["builds"]:
            assert b["variant"] == "cu" + b["cuda"].replace(".", "")
            gpu_runtime.min_driver(b["cuda"])  # every CUDA major has a minimum driver


def test_cli(capsys):
    assert gpu_runtime.main(["--driver", "470.82.01", "--compute-cap", "7.0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["requirement"] == "torch==2.7.1+cu118"
    assert gpu_runtime.main(["--driver", "418.67", "--compute-cap", "7.0"]) == 2
    assert "install driver branch 470" in capsys.readouterr().err
    assert gpu_runtime.main(["--driver", "five", "--compute-cap", "7.0"]) == 2
    assert "not a version number" in capsys.readouterr().err
    assert gpu_runtime.main([]) == 0
    assert "torch==2.13.0" in capsys.readouterr().out


def test_docs_table_lists_every_build_of_the_matrix():
    """docs/gpu.md repeats the matrix for readers; a build added to the YAML must reach it."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "gpu.md").read_text()
    rows = {tuple(c.replace("*", "").strip().split(" ")[0] for c in line.split("|")[1:3]) for line in doc.splitlines()
            if line.startswith("| ")}
    for r in gpu_runtime.matrix()["releases"]:
        for b in r["builds"]:
            assert (r["torch"], b["variant"]) in rows, f"docs/gpu.md lacks torch {r['torch']} {b['variant']}"


@pytest.mark.parametrize("name, cc", [
    ("NVIDIA A10G", "8.6"),  # not the A100 entry's
    ("NVIDIA A100-SXM4-40GB", "8.0"),
    ("NVIDIA GH200 480GB", "9.0"),
    ("NVIDIA L40S", "8.9"),
    ("NVIDIA L4", "8.9"),
    ("Tesla T4", "7.5"),
])
def test_a_gpu_without_compute_cap_is_known_by_its_models_word(name, cc):
    assert gpu_runtime.compute_cap(Gpu(name=name, driver="470.82.01", compute_cap="[N/A]")) == cc


def test_a_model_inside_a_longer_number_is_not_that_model():
    # "A30" is in "RTX A3000", "T4" would be in "RTX 4000"'s neighbours: a word, or nothing.
    with pytest.raises(NoFit, match="cannot tell the compute capability of 'NVIDIA RTX A3000'"):
        gpu_runtime.compute_cap(Gpu(name="NVIDIA RTX A3000", driver="470.82.01", compute_cap=""))


def test_a_cuda_major_the_table_lacks_is_one_line_not_a_key_error():
    assert gpu_runtime.min_driver("12.8") == "525.60.13"
    with pytest.raises(NoFit, match=r"CUDA 14\.0: its minimum driver is not in deployer/gpu_runtime.yaml .*11, 12, 13"):
        gpu_runtime.min_driver("14.0")
