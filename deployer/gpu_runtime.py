"""Which torch build a cluster's GPUs can run, from the driver and the compute capability.

A torch wheel runs on a node only if the driver is new enough for the wheel's CUDA
(minor-version compatibility) and the wheel carries machine code for the GPU's
architecture. PyPI's default torch 2.13.0 is a CUDA 13.0 build: driver >= 580 and no
Volta code, so a V100 or any pre-580 driver cannot run it. This module picks, for the
whole cluster (the lowest driver and every GPU kind among its nodes), the torch release
and CUDA variant that fit, preferring the spec's torch release and the newest CUDA the
driver runs; the facts live in gpu_runtime.yaml.

Decided on the master by the training_runtime role (filter deployer_torch_choice) from
each GPU node's `nvidia-smi --query-gpu=name,driver_version,compute_cap`. By hand:

    python -m deployer.gpu_runtime --driver 470.82.01 --compute-cap 7.0 [--json]

prints the choice, or exits 2 with the reason when no published build fits.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

MATRIX_FILE = Path(__file__).with_name("gpu_runtime.yaml")
WHEEL_INDEX = "https://download.pytorch.org/whl/{variant}"
ARCH_NAMES = {"3": "Kepler", "5": "Maxwell", "6": "Pascal", "7.0": "Volta", "7.2": "Volta", "7.5": "Turing",
              "8.0": "Ampere", "8.6": "Ampere", "8.7": "Ampere", "8.9": "Ada", "9": "Hopper", "10": "Blackwell",
              "11": "Blackwell", "12": "Blackwell"}


class NoFit(ValueError):
    """No published torch build runs on these GPUs with this driver; the message says what to install."""


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi reports it; `host` names the node in messages."""

    name: str
    driver: str
    compute_cap: str | None = None
    host: str = ""


@dataclass(frozen=True)
class Choice:
    torch: str
    variant: str  # cu126, cu130, ..., or cpu
    cuda: str | None
    requirement: str  # what pip installs: torch==2.13.0 or torch==2.13.0+cu126
    torchvision: str  # the torchvision release line built against it: torchvision==0.28.*
    index_url: str | None  # extra index to add; None: PyPI has it
    archs: tuple[str, ...]
    reason: str
    source: str = "matrix"  # matrix, or spec when the spec named the variant

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "archs": list(self.archs)}


@cache
def matrix() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(MATRIX_FILE.read_text())
    return data


def version(text: str) -> tuple[int, ...]:
    """'535.104.05' -> (535, 104, 5); '8.9' -> (8, 9)."""
    try:
        return tuple(int(p) for p in str(text).strip().split("."))
    except ValueError:
        raise ValueError(f"not a version number: {text!r}") from None


def arch_name(cc: str) -> str:
    major = cc.split(".")[0]
    return ARCH_NAMES.get(cc) or ARCH_NAMES.get(major) or f"sm_{cc.replace('.', '')}"


def runs_on(cc: str, archs: list[str] | tuple[str, ...]) -> bool:
    """Does a build with machine code for `archs` run on a GPU of capability `cc`?
    Code for X.y runs on X.z when z >= y (CUDA binary compatibility); never across majors."""
    major, minor = version(cc)[:2]
    return any(version(a)[0] == major and version(a)[1] <= minor for a in archs)


def compute_cap(gpu: Gpu) -> str:
    """The GPU's compute capability: nvidia-smi's, else from the product name (drivers
    before 510 have no compute_cap field)."""
    if gpu.compute_cap and gpu.compute_cap.strip() not in ("", "[N/A]", "N/A"):
        return gpu.compute_cap.strip()
    for entry in matrix()["compute_capability_by_name"]:
        # The model as a word of the name: "A10" in "NVIDIA A10G" but not in "A100", "H200"
        # not in "GH200", "A30" not in "RTX A3000" (letters may follow: A10G, L40S).
        if re.search(rf"(?<![a-z0-9]){re.escape(entry['name'].lower())}(?![0-9])", gpu.name.lower()):
            cc: str = entry["cc"]
            return cc
    raise NoFit(
        f"cannot tell the compute capability of {gpu.name!r}{' on ' + gpu.host if gpu.host else ''} "
        "(its driver's nvidia-smi has no compute_cap field and the name is not in deployer/gpu_runtime.yaml): "
        "name the build in the spec (gpu_runtime: {torch: ..., cuda: cu126})"
    )


def min_driver(cuda: str) -> str:
    known: dict[str, str] = matrix()["cuda_min_driver"]
    major = cuda.split(".")[0]
    if major not in known:
        raise NoFit(f"CUDA {cuda}: its minimum driver is not in deployer/gpu_runtime.yaml (cuda_min_driver knows CUDA "
                    f"{', '.join(sorted(known, key=int))}); add it there from NVIDIA's CUDA release notes")
    return known[major]


def driver_ok(driver: str, cuda: str) -> bool:
    return version(driver) >= version(min_driver(cuda))


def release(torch: str) -> dict[str, Any]:
    releases: list[dict[str, Any]] = matrix()["releases"]
    for r in releases:
        if r["torch"] == torch:
            return r
    known = ", ".join(r["torch"] for r in matrix()["releases"])
    raise NoFit(f"torch {torch} is not in deployer/gpu_runtime.yaml (known: {known}); add it there with its builds")


def torchvision_for(torch: str) -> str:
    """torchvision's release line for a torch release: 0.(minor + 15), e.g. 2.13 -> 0.28."""
    minor = version(torch)[1]
    return f"torchvision==0.{minor + 15}.*"


def _choice(torch: str, build: dict[str, Any], reason: str, source: str = "matrix") -> Choice:
    variant = build["variant"]
    pypi = bool(build.get("pypi_default"))
    return Choice(
        torch=torch, variant=variant, cuda=build.get("cuda"),
        requirement=f"torch=={torch}" if pypi else f"torch=={torch}+{variant}",
        torchvision=torchvision_for(torch),
        index_url=None if pypi else WHEEL_INDEX.format(variant=variant),
        archs=tuple(build.get("archs", ())), reason=reason, source=source,
    )


def cpu_choice(torch: str | None = None) -> Choice:
    torch = torch or matrix()["default_torch"]
    return Choice(torch=torch, variant="cpu", cuda=None, requirement=f"torch=={torch}",
                  torchvision=torchvision_for(torch), index_url=WHEEL_INDEX.format(variant="cpu"), archs=(),
                  reason="no GPU on any node: the CPU build")


def why_not(build: dict[str, Any], driver: str, caps: list[str]) -> str:
    missing = [c for c in caps if not runs_on(c, build["archs"])]
    parts = []
    if not driver_ok(driver, build["cuda"]):
        parts.append(f"needs driver >= {min_driver(build['cuda'])}")
    if missing:
        parts.append("has no " + ", ".join(f"{arch_name(c)} ({c})" for c in missing) + " code")
    return f"{build['variant']} {' and '.join(parts)}"


def fits(build: dict[str, Any], driver: str, caps: list[str]) -> bool:
    return driver_ok(driver, build["cuda"]) and all(runs_on(c, build["archs"]) for c in caps)


def by_cuda(builds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Newest CUDA first: it is what the driver runs best (the toolkit's own optimisations)."""
    return sorted(builds, key=lambda b: version(b["cuda"]), reverse=True)


def suggest_branch(caps: list[str], cuda: str | None = None) -> str:
    """The lowest datacenter branch that some build (of variant `cuda`, when named) with
    code for every GPU here runs on."""
    needed = [version(min_driver(b["cuda"])) for r in matrix()["releases"] for b in r["builds"]
              if all(runs_on(c, b["archs"]) for c in caps) and cuda in (None, b["variant"])]
    if not needed:
        return "no published torch build has code for " + ", ".join(f"{arch_name(c)} ({c})" for c in caps)
    floor = min(needed)
    branch = next((b for b in matrix()["driver_branches"] if (b,) >= floor[:1]), None)
    return (f"install driver branch {branch} or newer (openstack.nvidia_driver_branch: {branch})" if branch
            else f"install a driver >= {'.'.join(map(str, floor))}")


def python_ok(rel: dict[str, Any], python: tuple[int, ...] | None) -> bool:
    return python is None or tuple(python[:2]) >= tuple(rel["python"])


def choose(gpus: list[Gpu], torch: str | None = None, cuda: str | None = None,
           python: tuple[int, ...] | None = None) -> Choice:
    """The build for a whole cluster: its lowest driver, every GPU kind it has.

    `torch`/`cuda` come from the spec: a named release is kept (NoFit when none of its
    builds fits); a named variant is checked too. Without them the default release is
    preferred and an older one is taken only when the default has no build that fits.
    `python`: the nodes' Python (a release needs at least its own minimum).
    """
    if torch and not python_ok(release(torch), python):
        assert python is not None  # python_ok holds without one
        raise NoFit(f"torch {torch} needs Python >= {'.'.join(map(str, release(torch)['python']))}; the nodes have "
                    f"{'.'.join(map(str, python[:2]))}: use a newer image (e.g. Ubuntu 22.04) or an older torch")
    if not gpus:
        return cpu_choice(torch)
    if cuda == "cpu":
        return replace(cpu_choice(torch), reason="the spec asks for the CPU build", source="spec")
    lowest = min(gpus, key=lambda g: version(g.driver))
    driver = lowest.driver
    caps = sorted({compute_cap(g) for g in gpus}, key=version)
    names = " + ".join(sorted({g.name for g in gpus if g.name})) or "GPU"
    on = f" (lowest, on {lowest.host})" if lowest.host and len({g.host for g in gpus}) > 1 else ""
    seen = f"driver {driver}{on}, {names} ({', '.join(caps)})"
    wanted = [release(torch)] if torch else [release(matrix()["default_torch"])]
    fallbacks = [] if torch else [r for r in matrix()["releases"] if version(r["torch"]) < version(wanted[0]["torch"])]

    if cuda and not any(b["variant"] == cuda for r in wanted + fallbacks for b in r["builds"]):
        have = sorted({b["variant"] for r in wanted + fallbacks for b in r["builds"]})
        raise NoFit(f"no torch {'release' if not torch else torch} in deployer/gpu_runtime.yaml has a {cuda} build "
                    f"(there are {', '.join(have)}, and cpu): change gpu_runtime.cuda")
    for rel in wanted + fallbacks:
        if not python_ok(rel, python):
            continue
        builds = [b for b in by_cuda(rel["builds"]) if cuda in (None, b["variant"])]
        for b in builds:
            if fits(b, driver, caps):
                rejected = [why_not(o, driver, caps) for o in by_cuda(wanted[0]["builds"]) if not fits(o, driver, caps)]
                because = ("" if rel is wanted[0] else f"; torch {wanted[0]['torch']} has no {cuda} build" if cuda
                           else f"; torch {wanted[0]['torch']}: " + "; ".join(rejected))
                newer = [o["variant"] for o in by_cuda(rel["builds"]) if o is not b and version(o["cuda"]) > version(b["cuda"])]
                skipped = f" (newer {', '.join(newer)} do not fit)" if newer and rel is wanted[0] else ""
                reason = (f"{seen}: torch {rel['torch']}+{b['variant']} — CUDA {b['cuda']} runs on driver >= "
                          f"{min_driver(b['cuda'])} and carries {', '.join(b['archs'])}{skipped}{because}")
                return _choice(rel["torch"], b, reason, source="spec" if cuda else "matrix")
    tried = "; ".join(f"torch {r['torch']}: " + "; ".join(why_not(b, driver, caps) for b in by_cuda(r["builds"])
                                                          if cuda in (None, b["variant"]))
                      for r in wanted + fallbacks)
    raise NoFit(f"{seen}: no published torch build fits ({tried}): {suggest_branch(caps, cuda)}"
                + (" or remove gpu_runtime.cuda from the spec" if cuda else ""))


def parse_smi(host: str, stdout: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=name,driver_version[,compute_cap] --format=csv,noheader` -> GPUs."""
    gpus = []
    for line in stdout.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 2:
            continue
        gpus.append(Gpu(name=fields[0], driver=fields[1], compute_cap=fields[2] if len(fields) > 2 else None, host=host))
    return gpus


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deployer.gpu_runtime",
                                description="the torch build for an NVIDIA driver and GPU (deployer/gpu_runtime.yaml)")
    p.add_argument("--driver", help="driver version, e.g. 535.104.05 (nvidia-smi --query-gpu=driver_version)")
    p.add_argument("--compute-cap", action="append", default=[],
                   help="compute capability, e.g. 7.0 (nvidia-smi --query-gpu=compute_cap); repeat for mixed GPUs")
    p.add_argument("--gpu-name", default="", help="product name, used when --compute-cap is not given")
    p.add_argument("--torch", help="keep this torch release (default: the matrix's, older when it does not fit)")
    p.add_argument("--cuda", help="keep this variant: cu118, cu126, cu130, ... or cpu")
    p.add_argument("--json", action="store_true", help="one JSON object")
    args = p.parse_args(argv)
    try:
        if args.driver is None and (args.compute_cap or args.gpu_name):
            raise NoFit("--driver is needed with a GPU (nvidia-smi --query-gpu=driver_version)")
        if args.driver is not None:
            version(args.driver)
        gpus = [] if args.driver is None else (
            [Gpu(name=args.gpu_name, driver=args.driver, compute_cap=cc) for cc in args.compute_cap]
            or [Gpu(name=args.gpu_name, driver=args.driver)])
        for g in gpus:
            version(compute_cap(g))
        choice = choose(gpus, torch=args.torch, cuda=args.cuda)
    except (NoFit, ValueError) as e:
        if args.json:
            print(json.dumps({"ok": False, "reason": str(e)}))
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"ok": True, **choice.as_dict()}))
    else:
        index = f" --extra-index-url {choice.index_url}" if choice.index_url else ""
        print(f"pip install '{choice.requirement}'{index}")
        print(choice.reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
