#!/usr/bin/env python3
"""Every GPU code path of deployer on this machine's NVIDIA GPUs, in one run (issue 45).

On a machine with NVIDIA GPUs and torch installed (no network needed), as root, from the
repository root:

    python3 scripts/gpu_proof.py --out gpu-proof

On a machine without GPUs, the same steps on the recordings under tests/fixtures/gpu/
(the MPI benchmarks run on CPU ranks with gloo where torch, mpi4py and numpy are there):

    python3 scripts/gpu_proof.py --dry-run --out /tmp/gpu-proof

or on a real machine's outputs kept from an earlier run (every slot as it was there):

    python3 scripts/gpu_proof.py --dry-run --replay tests/fixtures/gpu/proof-h200-2026-11-27/raw --out /tmp/gpu-proof

Steps, in this order, each with its own time-out inside one budget (--budget-s, 9
minutes by default: the run stays under 10), each recorded whatever happens, the next
one run regardless:

  environment   the Python packages of both interpreters, the tools present
  raw           nvidia-smi -q, -q -x, topo -m, --query-gpu; lspci -nn, -vmm -nn -d 10de:,
                -vvv; dcgmi discovery -l; /proc/driver/nvidia/version: kept under raw/ with
                where, when and how each was taken (raw/provenance.json)
  gpu_facts     deployer/gpu_facts.py on them: model, count, whole GPU or vGPU, NVSwitches,
                fabric; held against each output's own header, the XML and --query-gpu
  gpu_runtime   deployer/gpu_runtime.py's torch build for this driver and compute capability
  check         `deployer check`'s GPU findings and verdict: benchmarks/node_check.py's
                collection (nvidia-smi -q, lspci -vv, dcgmi diag -r 1 -j) read by
                deployer/check/analyse.py
  gpu_check     benchmarks/gpu_check.py, read by gpu_facts.check_problems
  node_checks   `deployer check`'s node program (benchmarks/node_check.py) at the quick and
                standard levels and the health timer's (benchmarks/node_health.py), as on a
                node (scripts/gpu_health_proof.sh): the check must not fail the machine, the
                health timer's GPU and Xid readings must pass
  torch_fit     the installed torch against the driver by the matrix's rules: does the
                chosen build's CUDA fit the driver, as far as this torch can prove it
  allreduce     the check's collective (cluster_checks.measure_collective): allreduce.py over
                every GPU with NCCL_ALGO=Ring, busbw read by collective_findings
  rank_watch    a rank of allreduce.py under NCCL stopped with SIGSTOP: rank_watch must name
                it within its quiet time, and nothing may be left running
  resnet_1, resnet_all
                `deployer bench`'s mpirun of resnet_synthetic.py with the horovod profile
                (ResNet-50, 224 px, batch 32, AMP, channels-last) on one GPU and on all,
                img/s against the NVIDIA figure the report uses (deployer/bench/report.py)

It leaves, in the output folder: summary.json (every figure and verdict), summary.md (the
table for docs/gpu.md), raw/ (the outputs, with provenance.json), shared/ (the benchmark
scripts as run, their hostfiles and NCCL logs), bin/python (the interpreter the ranks run).

Exit status: 0 every step held (or was skipped: a tool absent, the dry-run); 1 a finding
contradicts the code (a reader disagrees with the tool's own output, a GPU path failed);
3 nothing contradicts it but a step could not run (a time-out, a missing package): the
proof is incomplete.

What it needs: Python >= 3.11 and this repository (deployer is imported from here, not
installed). The readers need PyYAML (deployer/gpu_facts.py, gpu_runtime.py) and, for the
NVIDIA reference figure, pydantic and rich (deployer/bench/report.py) in the interpreter
that runs this script; a step whose package is missing says which and the rest go on. The
benchmarks run in --python (default: this interpreter), which needs torch (the vendor's),
numpy and mpi4py, and Open MPI's mpirun: each missing one is named, never a crash.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # deployer from this checkout: nothing needs installing on the GPU machine
    sys.path.insert(0, str(ROOT))

# Standard library only, all of them (checked: their module-level imports).
from deployer.bench.commands import hostfiles_cmd, mpirun_cmd, resnet_args  # noqa: E402
from deployer.bench.profiles import BenchOptions, make_options  # noqa: E402
from deployer.check import analyse, cluster_checks  # noqa: E402
from deployer.check.model import Finding, NodeReport  # noqa: E402
from deployer.cluster import Cluster, Node  # noqa: E402
from deployer.errors import OperationFailed  # noqa: E402
from deployer.launch.failure import diagnose, untag  # noqa: E402
from deployer.launch.mpirun import cleanup_cmd, mpirun_line, parse_json_line  # noqa: E402
from deployer.launch.rank_watch import HEARTBEAT_S, QUIET_S, run_watched  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "gpu"
BENCHMARKS = ROOT / "benchmarks"

# Seconds. Each step's own limit, and the whole run's: the slowest GPU machine must still
# finish every step inside 10 minutes, so a step gets the smaller of its limit and what is
# left of the budget, less what writing the summary takes.
BUDGET_S = 540
RESERVE_S = 15
MIN_STEP_S = 20  # less than this left: the step is skipped as out of time, not started to be killed
TOOL_TIMEOUT_S = 60  # one nvidia-smi / lspci / dcgmi discovery call
DCGM_DIAG_TIMEOUT_S = 150  # dcgmi diag -r 1: tens of seconds, more on 8 GPUs
PROBE_TIMEOUT_S = 120  # importing torch and asking CUDA the first time
GPU_CHECK_TIMEOUT_S = 240  # gpu_check.py's own NCCL deadline is 180 s
ALLREDUCE_TIMEOUT_S = 180
RANK_WATCH_EXTRA_S = 90  # on top of the quiet time: start-up of every rank and the stop
RESNET_TIMEOUT_S = 240
DRY_RUN_QUIET_S = 5.0  # the dry-run's quiet time: CPU ranks on a test machine, seconds not 30
DRY_RUN_RANKS = 2  # gloo ranks standing for "every GPU" in the dry-run


# --- the raw outputs ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Slot:
    """One raw output: its file under raw/ and the command that makes it on a GPU machine."""

    file: str
    argv: tuple[str, ...]


SLOTS = {
    "smi_q": Slot("nvidia-smi-q.txt", ("nvidia-smi", "-q")),
    "smi_x": Slot("nvidia-smi-q-x.xml", ("nvidia-smi", "-q", "-x")),
    "topo": Slot("nvidia-smi-topo-m.txt", ("nvidia-smi", "topo", "-m")),
    # The training_runtime role's own query: gpu_runtime.parse_smi reads these three fields.
    "query": Slot("nvidia-smi-query-gpu.csv", ("nvidia-smi", "--query-gpu=name,driver_version,compute_cap",
                                               "--format=csv,noheader")),
    "lspci_nn": Slot("lspci-nn.txt", ("lspci", "-nn")),
    # The nvidia_driver role's input to nvswitch_count and pci_virtualization.
    "lspci_nvidia": Slot("lspci-vmm-nn-d-10de.txt", ("lspci", "-vmm", "-nn", "-d", "10de:")),
    "lspci_vvv": Slot("lspci-vvv.txt", ("lspci", "-vvv")),
    "dcgm_discovery": Slot("dcgmi-discovery-l.txt", ("dcgmi", "discovery", "-l")),
    "dcgm_diag": Slot("dcgmi-diag-r1-j.json", ("dcgmi", "diag", "-r", "1", "-j")),  # taken by node_check.check_dcgm
    "driver_proc": Slot("proc-driver-nvidia-version.txt", ("cat", "/proc/driver/nvidia/version")),
}
# The recordings the dry-run reads (tests/fixtures/gpu/**/README.md says where each comes
# from). They are of several machines: an 8x H100 HGX as near as the recordings allow, with
# DCGM's only level-1 JSON (a GB10). Slots without a recording are skipped.
DRY_RUN_FIXTURES = {
    "smi_q": "health/nvidia-smi-q_h100-80gb-hbm3-x8_healthy_535.txt",
    "topo": "health/nvidia-smi-topo-m_h100-x8_nv18.txt",
    "lspci_nn": "lspci-nn.hgx-h100-nvswitch.txt",
    "lspci_nvidia": "lspci-nn.hgx-h100-nvswitch.txt",  # `lspci -nn` lines: the readers take both formats
    "lspci_vvv": "health/lspci-vvv_h100-sxm-x8_gpu-stanzas_healthy.txt",
    "dcgm_diag": "health/dcgm-json/dcgm4.2.3_gb10_r1_softwarefail.json",
}


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class RawStore:
    """raw/: each output as the tool printed it, and provenance.json beside them: the
    command, the host, the UTC time, the exit status, or the fixture it was copied from."""

    def __init__(self, folder: Path, host: str):
        self.folder, self.host = folder, host
        self.entries: dict[str, dict[str, Any]] = {}
        folder.mkdir(parents=True, exist_ok=True)

    def keep(self, name: str, text: str, **provenance: Any) -> None:
        file = SLOTS[name].file if name in SLOTS else name
        (self.folder / file).write_text(text)
        self.entries[name] = {"file": f"raw/{file}", **provenance}
        self._save()

    def absent(self, name: str, why: str) -> None:
        self.entries[name] = {"file": None, "why": why}
        self._save()

    def capture(self, name: str, timeout: float) -> str | None:
        """Run the slot's command here and keep what it printed (stdout, then stderr)."""
        argv = list(SLOTS[name].argv)
        if shutil.which(argv[0]) is None:
            self.absent(name, f"{argv[0]} is not installed")
            return None
        at, t0 = utc_now(), time.monotonic()
        rc, text = run_quiet(argv, timeout)
        self.keep(name, text, command=shlex.join(argv), host=self.host, utc=at, rc=rc,
                  seconds=round(time.monotonic() - t0, 2))
        return text if rc == 0 else None

    def copy_fixture(self, name: str, path: Path) -> str:
        text = path.read_text()
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        self.keep(name, text, stands_for=shlex.join(SLOTS[name].argv) if name in SLOTS else None, fixture=str(shown),
                  command=None, host=None, utc=None, rc=0,
                  recorded="elsewhere: the README beside the fixture says where, when and with which command")
        return text

    def text(self, name: str) -> str | None:
        entry = self.entries.get(name) or {}
        if not entry.get("file") or entry.get("rc", 0) != 0:
            return None
        return (self.folder.parent / str(entry["file"])).read_text()

    def _save(self) -> None:
        (self.folder / "provenance.json").write_text(json.dumps(self.entries, indent=1) + "\n")


def replay_raw(raw: RawStore, folder: Path) -> None:
    """The dry-run on an earlier proof's raw/ (a real machine's outputs, kept as fixtures):
    every slot as that machine gave it, and absent where it was absent there (no lspci on
    that machine stays no lspci here), not filled in from other machines' recordings."""
    kept = json.loads((folder / "provenance.json").read_text())
    for name in SLOTS:
        entry = kept.get(name) or {}
        if entry.get("file") and entry.get("rc", 0) == 0:
            raw.copy_fixture(name, folder / Path(str(entry["file"])).name)
        else:
            raw.absent(name, f"replayed proof: {entry.get('why') or 'not kept there'}")


def run_quiet(argv: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[int, str]:
    """rc and stdout+stderr; 124 on time-out, 127 when the program is missing (as node_check.run)."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not installed"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n{shlex.join(argv)}: no answer in {timeout:.0f} s"
    return p.returncode, p.stdout + p.stderr


# --- what the tools say, read plainly (the readers are held against these) -------------

def header_field(smi_q: str, key: str) -> str | None:
    """A top-level "Key : value" of `nvidia-smi -q` (Driver Version, CUDA Version, Attached GPUs)."""
    m = re.search(rf"^{re.escape(key)}\s*:\s*(.+?)\s*$", smi_q, re.MULTILINE)
    return m.group(1) if m else None


def xml_facts(xml_text: str) -> dict[str, Any]:
    """`nvidia-smi -q -x`: the same facts in NVML's XML, a second reading of the machine."""
    root = ET.fromstring(xml_text)
    gpus = root.findall("gpu")
    return {"driver": root.findtext("driver_version"), "cuda": root.findtext("cuda_version"),
            "attached": int(root.findtext("attached_gpus") or len(gpus)),
            "names": [g.findtext("product_name") for g in gpus],
            "virtualization": [g.findtext("gpu_virtualization_mode/virtualization_mode") for g in gpus]}


def topo_links(topo: str) -> dict[str, Any]:
    """`nvidia-smi topo -m`: the GPUs in its matrix and the kinds of link between them."""
    lines = [ln for ln in topo.splitlines() if ln.strip()]
    header = next((ln for ln in lines if re.search(r"\bGPU0\b", ln) and not ln.startswith("GPU")), "")
    k = len(re.findall(r"\bGPU\d+\b", header))
    links: Counter[str] = Counter()
    rows = 0
    for ln in lines:
        cells = ln.split()
        if re.match(r"GPU\d+\s", ln):  # a row starts the line; the header is indented
            rows += 1
            links.update(c for c in cells[1:1 + k] if c != "X")
    return {"gpus": rows, "links": dict(links), "all_nvlink": bool(links) and all(c.startswith("NV") for c in links)}


# --- the steps ---------------------------------------------------------------------------

class StepError(Exception):
    """The step could not run (a time-out, a missing package or tool): recorded as error."""


class Skip(Exception):
    """The step does not apply here (a tool absent, the dry-run): recorded as skipped."""


@dataclasses.dataclass
class Step:
    name: str
    status: str = "pass"  # pass, fail (contradicts the code or a GPU path failed), error, skipped
    detail: str = ""
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    contradictions: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def contradict(self, what: str) -> None:
        self.contradictions.append(what)
        self.status = "fail"

    def error(self, what: str) -> None:
        """A part of the step could not run; what it measured stays in the figures."""
        self.notes.append(what)
        if self.status == "pass":
            self.status = "error"


def import_reader(module: str) -> Any:
    """A deployer module whose third-party import may be missing on a GPU machine."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise StepError(f"{module} needs the Python package {e.name!r}, which {sys.executable} cannot import: "
                        f"install it there, or run this script with a Python that has it (PyYAML for "
                        f"deployer.gpu_facts and gpu_runtime; pydantic and rich for deployer.bench.report)") from None


def load_node_check() -> Any:
    """benchmarks/node_check.py as a module: the check's own collection (standard library only)."""
    spec = importlib.util.spec_from_file_location("node_check", BENCHMARKS / "node_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LocalRunner:
    """The master's shell that the check and bench run their commands through
    (deployer.remote.Runner), on this machine: each command in bash in a session of its
    own, stdout lines streamed. The rank watch's stop (cleanup_cmd: pkill over ssh on
    every node) kills the processes of that session by their ids instead, so nothing
    else on the machine is touched; so does the end of every command and its time-out."""

    def __init__(self, env: dict[str, str], cap_s: float, stops: set[str],
                 hook: Callable[[LocalRunner, str], None] | None = None):
        self.env, self.cap_s, self.stops, self.hook = env, cap_s, stops, hook
        self.proc: subprocess.Popen[str] | None = None
        self.stopped_at: float | None = None  # when the watch asked for the stop
        self.last: dict[str, Any] = {}

    def run(self, cmd: str, *, timeout: float, on_line: Callable[[str], None] | None = None) -> tuple[int, str, str]:
        if cmd in self.stops:
            self.stopped_at = time.monotonic()
            self.kill()
            return 0, "", ""
        limit = min(timeout, self.cap_s)
        proc = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, env=self.env, bufsize=1, start_new_session=True)
        self.proc = proc
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
        reader.start()
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            self.kill()

        timer = threading.Timer(limit, expire)
        timer.start()
        out: list[str] = []
        try:
            for line in proc.stdout or []:
                out.append(line)
                if self.hook:
                    self.hook(self, line.rstrip("\n"))
                if on_line:
                    on_line(line.rstrip("\n"))
            proc.wait()
        finally:
            timer.cancel()
            self.kill()  # a rank left behind (stopped, or orphaned by mpirun's end) goes with it
            proc.wait()
        reader.join(timeout=5)
        rc = 124 if expired.is_set() else proc.returncode
        self.last = {"command": cmd, "rc": rc, "stdout": "".join(out), "stderr": "".join(err)}
        return rc, self.last["stdout"], self.last["stderr"] + (f"\ntimed out after {limit:.0f}s" if expired.is_set() else "")

    def session_pids(self) -> list[int]:
        """Every live process of the current command's session (ranks set their own process
        group, not a session: Open MPI 4.1's, seen here)."""
        if self.proc is None:
            return []
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == self.proc.pid and fields[0] != "Z":
                pids.append(int(stat.parent.name))
        return pids

    def kill(self) -> None:
        for pid in self.session_pids():
            try:
                os.kill(pid, signal.SIGKILL)  # a stopped process too (TERM would wait for a SIGCONT)
            except ProcessLookupError:
                pass

    def survivors(self, wait_s: float = 5.0) -> list[int]:
        """What of the last command still runs once its killed processes had `wait_s` to die."""
        end = time.monotonic() + wait_s
        while (pids := self.session_pids()) and time.monotonic() < end:
            time.sleep(0.1)
        return pids

    def rank_pid(self, rank: int) -> int | None:
        """The process of MPI rank `rank` in the current command (Open MPI sets its rank in its environment)."""
        for pid in self.session_pids():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
                return pid
        return None


class Proof:
    """One run: the output folder, the budget, what the steps learnt of the machine, and the steps."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.dry = args, bool(args.dry_run)
        self.out: Path = args.out.resolve()
        self.host = socket.gethostname()
        self.started, self.t0 = utc_now(), time.monotonic()
        self.deadline: float = self.t0 + args.budget_s
        self.python = args.python
        self.quiet_s: float = args.quiet_s if args.quiet_s is not None else (DRY_RUN_QUIET_S if self.dry else QUIET_S)
        self._fresh_folder()
        self.raw = RawStore(self.out / "raw", self.host)
        self.facts: dict[str, Any] = {}
        self.steps: list[Step] = []

    def _fresh_folder(self) -> None:
        """Only what this script writes is removed: an earlier run's files would pass for this one's."""
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("raw", "shared", "bin"):
            shutil.rmtree(self.out / name, ignore_errors=True)
        for name in ("summary.json", "summary.md"):
            (self.out / name).unlink(missing_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    def limit(self, want_s: float) -> float:
        """A step's time-out: its own, or what is left of the budget."""
        return max(1.0, min(want_s, self.left()))

    def run(self, name: str, fn: Callable[[Proof, Step], None], *, needs_s: float = MIN_STEP_S) -> Step:
        step = Step(name)
        t0 = time.monotonic()
        print(f"[gpu-proof] {name} ...", flush=True)
        try:
            if self.left() < needs_s:
                raise Skip(f"out of time: {max(0, self.left()):.0f} s left of the {self.args.budget_s} s budget")
            fn(self, step)
        except Skip as e:
            step.status, step.detail = "skipped", str(e)
        except StepError as e:
            step.status, step.detail = "error", str(e)
        except Exception as e:  # noqa: BLE001 - a broken step is that step's error; the rest still run
            step.status, step.detail = "error", f"the step itself failed: {type(e).__name__}: {e}"
        step.seconds = round(time.monotonic() - t0, 1)
        self.steps.append(step)
        print(f"[gpu-proof] {name}: {step.status} ({step.seconds} s) {step.detail}", flush=True)
        for c in step.contradictions:
            print(f"[gpu-proof]   contradicts: {c}", flush=True)
        return step

    # -- the environment the benchmarks run in --------------------------------------------
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.out / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"  # `python` in mpirun_line: --python
        # One machine: every rank on loopback (what tests/unit/test_bench_mpi.py sets too). No
        # single-copy shared memory: a container's ptrace limits break it (the ranks' MPI
        # messages are small; the GPUs' data goes through NCCL).
        for key, value in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                           ("OMPI_MCA_btl_tcp_if_include", "lo"), ("OMPI_MCA_oob_tcp_if_include", "lo"),
                           ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
                           ("GLOO_SOCKET_IFNAME", "lo"), ("NCCL_SOCKET_IFNAME", "lo")):
            env.setdefault(key, value)
        for key in ("MASTER_ADDR", "MASTER_PORT"):  # rendezvous() would take them over rank 0's own
            env.pop(key, None)
        return env

    def cluster(self, slots: int) -> Cluster:
        """This machine as a one-node cluster with `slots` ranks (its GPUs; CPU ranks in the
        dry-run), its shared dir in the output folder with the scripts and the hostfile."""
        shared = self.out / "shared"
        if not (shared / "benchmarks").exists():
            shutil.copytree(BENCHMARKS, shared / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
        (shared / "hostfile").write_text(f"localhost slots={slots}\n")
        wrapper = self.out / "bin" / "python"
        wrapper.parent.mkdir(exist_ok=True)
        wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(self.python)} \"$@\"\n")
        wrapper.chmod(0o755)
        user = "root" if os.geteuid() == 0 else os.environ.get("USER", "user")
        node = Node(name=self.host, role="master", private_ip="127.0.0.1", gpus=slots)
        return Cluster(name="gpu-proof", provider="local", ssh_user=user, shared_dir=str(shared), nodes=(node,))

    def runner(self, cluster: Cluster, cap_s: float, hook: Callable[[LocalRunner, str], None] | None = None) -> LocalRunner:
        return LocalRunner(self.env(), cap_s, {cleanup_cmd(cluster), cleanup_cmd(cluster, "KILL")}, hook)

    def mpi_ready(self) -> None:
        """Skip (dry-run) or fail (GPU) a benchmark whose parts are missing, naming them."""
        if self.args.no_benchmarks:
            raise Skip("--no-benchmarks")
        missing = [m for m in ("torch", "numpy", "mpi4py") if not self.facts.get("packages", {}).get(m)]
        if shutil.which("mpirun") is None:
            missing.append("mpirun (Open MPI)")
        if missing:
            why = f"{', '.join(missing)} missing for {self.python}: the benchmarks take their ranks from MPI"
            raise Skip(why) if self.dry else StepError(why)
        if not self.slots():
            raise StepError("no GPU was counted (step raw): nothing to run the benchmarks on")

    def slots(self) -> int:
        return DRY_RUN_RANKS if self.dry else int(self.facts.get("gpu_count") or 0)


PROBE = """
import importlib, json
out = {}
for m in ("torch", "torchvision", "numpy", "mpi4py"):
    try:
        out[m] = getattr(importlib.import_module(m), "__version__", "?")
    except Exception as e:
        out[m], out[m + "_error"] = None, f"{type(e).__name__}: {e}"
if out["torch"]:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
print(json.dumps(out))
"""


def step_environment(p: Proof, step: Step) -> None:
    """The two interpreters' packages and the tools: what each later step can count on."""
    readers = {}
    for m in ("yaml", "pydantic", "rich"):
        found = importlib.util.find_spec(m) is not None
        readers[m] = getattr(importlib.import_module(m), "__version__", "?") if found else None
    rc, out = run_quiet([p.python, "-c", PROBE], p.limit(PROBE_TIMEOUT_S))
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if rc != 0 or not lines:
        raise StepError(f"{p.python} could not be asked for its packages: {(out.strip().splitlines() or [f'rc {rc}'])[-1]}")
    packages = json.loads(lines[-1])
    tools = {t: shutil.which(t) for t in ("nvidia-smi", "lspci", "dcgmi", "mpirun", "timeout")}
    p.facts["packages"] = packages
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        step.notes.append(f"CUDA_VISIBLE_DEVICES={visible}: torch sees only these GPUs, nvidia-smi every one")
    step.figures = {"host": p.host, "cuda_visible_devices": visible, "script_python": sys.executable,
                    "script_python_version": sys.version.split()[0], "reader_packages": readers,
                    "bench_python": p.python, "bench_packages": packages, "tools": tools}
    gaps = [f"{m} (script Python: {why})" for m, why in (("yaml", "gpu_facts, gpu_runtime"),
                                                         ("pydantic", "the NVIDIA reference"), ("rich", "the NVIDIA reference"))
            if not readers[m]]
    gaps += [f"{m} (benchmarks' Python: {packages.get(m + '_error')})" for m in ("torch", "numpy", "mpi4py") if not packages.get(m)]
    gaps += [f"{t} (tool)" for t in ("mpirun", "timeout") if not tools[t]]
    if not packages.get("torch"):
        step.notes.append(f"torch is not installed for {p.python}: gpu_check and the benchmarks cannot run "
                          f"({'skipped in the dry-run' if p.dry else 'install the vendor torch, or pass --python'})")
    if p.dry:
        step.detail = "dry-run: " + (f"missing {', '.join(gaps)}" if gaps else "every package and tool present")
        return
    if not tools["nvidia-smi"]:
        raise StepError("nvidia-smi is not installed: not a GPU machine (use --dry-run on a machine without GPUs)")
    if gaps:
        step.error(f"missing: {', '.join(gaps)}")
    step.detail = (f"torch {packages.get('torch')} (CUDA {packages.get('torch_cuda')}, sees {packages.get('device_count')} "
                   f"GPU(s))" if packages.get("torch") else "no torch") + (f"; missing {', '.join(gaps)}" if gaps else "")


def step_raw(p: Proof, step: Step) -> None:
    """The raw outputs: the commands here, or the recordings in the dry-run."""
    if p.dry and p.args.replay:
        replay_raw(p.raw, p.args.replay)
    elif p.dry:
        fixtures = {**{k: FIXTURES / v for k, v in DRY_RUN_FIXTURES.items()}, **p.args.fixture}
        for name in SLOTS:
            if name in fixtures:
                p.raw.copy_fixture(name, fixtures[name])
            else:
                p.raw.absent(name, "dry-run: no recording of it under tests/fixtures/gpu/")
    else:
        for name in SLOTS:
            if name == "dcgm_diag":
                continue  # taken by the check's own collection (step check)
            p.raw.capture(name, p.limit(TOOL_TIMEOUT_S))
    smi = p.raw.text("smi_q")
    if smi is None:
        raise StepError("no `nvidia-smi -q` output: " + json.dumps(p.raw.entries.get("smi_q")))
    facts: dict[str, Any] = {"driver": header_field(smi, "Driver Version"), "cuda_driver": header_field(smi, "CUDA Version"),
             "attached": int(header_field(smi, "Attached GPUs") or 0)}
    query = p.raw.text("query")
    if query:
        rows = [[f.strip() for f in ln.split(",")] for ln in query.strip().splitlines() if ln.strip()]
        facts |= {"query_names": [r[0] for r in rows], "query_caps": [r[2] if len(r) > 2 else None for r in rows]}
    p.facts |= facts
    p.facts["gpu_count"] = len(facts.get("query_names") or []) or facts["attached"]
    step.figures = {"facts": facts, "files": {k: v.get("file") or v.get("why") for k, v in p.raw.entries.items()}}
    # DCGM's host engine not running is the machine's set-up, said in the check step, not a failed output
    failed = [f"{k} (rc {v['rc']})" for k, v in p.raw.entries.items() if v.get("rc") not in (None, 0) and k != "dcgm_discovery"]
    kept = sum(1 for v in p.raw.entries.values() if v.get("file"))
    step.detail = (f"{kept} output(s) kept; driver {facts['driver']}, CUDA {facts['cuda_driver']}, "
                   f"{p.facts['gpu_count']} GPU(s)") + (f"; failed: {', '.join(failed)}" if failed else "")
    if failed and not p.dry:
        step.error(f"commands that failed: {', '.join(failed)}")


def step_gpu_facts(p: Proof, step: Step) -> None:
    """deployer/gpu_facts.py on the outputs, held against what each output says itself."""
    gpu_facts = import_reader("deployer.gpu_facts")
    smi = p.raw.text("smi_q")
    if smi is None:
        raise StepError("no `nvidia-smi -q` output to read")
    gpus = gpu_facts.smi_gpus(smi)
    names = sorted({str(tree.get("Product Name", "?")) for _, tree in gpus})
    mode = gpu_facts.virtualization(smi)
    f: dict[str, Any] = {"count": len(gpus), "models": names, "buses": [bus for bus, _ in gpus], "virtualization": mode,
                         "whole_gpu": {"none": True, "pass-through": True, "vgpu": False}.get(mode),
                         "fabric_states": sorted(set(gpu_facts.fabric_states(smi))), "fabric_ready": gpu_facts.fabric_ready(smi)}
    p.facts |= {"gpu_names": p.facts.get("query_names") or [str(t.get("Product Name", "?")) for _, t in gpus],
                "virtualization": mode}
    if p.facts["attached"] and len(gpus) != p.facts["attached"]:
        step.contradict(f"gpu_facts.smi_gpus reads {len(gpus)} GPU(s); nvidia-smi -q's header says Attached GPUs: "
                        f"{p.facts['attached']}")
    if re.search(r"^\s*Virtualization Mode\s*:", smi, re.MULTILINE) and mode == "unknown":
        step.contradict("nvidia-smi -q names a virtualization mode gpu_facts.virtualization does not know: "
                        + ", ".join(sorted(set(re.findall(r"^\s*Virtualization Mode\s*:\s*(.+?)\s*$", smi, re.MULTILINE)))))
    _read_pci(gpu_facts, p, step, f)
    _read_topo(p, step, f)
    _read_xml(p, step, f)
    if p.facts.get("query_names") and sorted(set(p.facts["query_names"])) != names:
        step.contradict(f"the models read from nvidia-smi -q ({', '.join(names)}) are not --query-gpu's "
                        f"({', '.join(sorted(set(p.facts['query_names'])))})")
    if p.facts.get("query_names") and len(p.facts["query_names"]) != len(gpus):
        step.contradict(f"smi_gpus reads {len(gpus)} GPU(s), --query-gpu lists {len(p.facts['query_names'])}")
    step.figures = f
    kind = {True: "whole GPU", False: "vGPU"}.get(f["whole_gpu"], "mode unknown")
    pci = (f"PCI says {f['pci_virtualization']}; {f['nvswitches']} NVSwitch(es)" if "pci_virtualization" in f
           else "PCI not read (no lspci)")
    # N/A on every GPU: no NVSwitch fabric to train (a PCIe or single-GPU board, an A100 board)
    fabric = ("no fabric reported" if all(state == "N/A" for state, _ in f["fabric_states"])
              else "fabric ready" if f["fabric_ready"] else "fabric NOT ready")
    step.detail = f"{len(gpus)} x {', '.join(names)}; {mode} ({kind}); {pci}; {fabric}"


def _read_pci(gpu_facts: Any, p: Proof, step: Step, f: dict[str, Any]) -> None:
    """The nvidia_driver role's readings of lspci before a driver: they must not call a
    vGPU what NVML calls a whole GPU, nor the other way round."""
    lspci = p.raw.text("lspci_nvidia")
    if lspci is None:
        step.notes.append("no lspci output of the NVIDIA devices: the PCI readers did not run")
        return
    f["pci_virtualization"] = gpu_facts.pci_virtualization(lspci)
    f["nvswitches"] = p.facts["nvswitches"] = gpu_facts.nvswitch_count(lspci)
    vgpu = f["virtualization"] == "vgpu"
    if (f["pci_virtualization"] == "vgpu" and not vgpu) or (f["pci_virtualization"] == "passthrough" and vgpu):
        step.contradict(f"lspci reads as {f['pci_virtualization']}, nvidia-smi -q as {f['virtualization']}")
    if f["nvswitches"] and not f["fabric_ready"]:
        step.notes.append("NVSwitches and a fabric not trained: Fabric Manager is not running (the check fails it)")


def _read_topo(p: Proof, step: Step, f: dict[str, Any]) -> None:
    topo = p.raw.text("topo")
    if topo is None:
        return
    f["topo"] = links = topo_links(topo)
    if links["gpus"] != f["count"]:
        step.contradict(f"nvidia-smi topo -m shows {links['gpus']} GPU(s), gpu_facts reads {f['count']}")
    if links["all_nvlink"] and links["gpus"] >= 4 and not f.get("nvswitches"):
        step.notes.append("every GPU pair is NVLinked but lspci shows no NVSwitch: a host-managed fabric "
                          "(the guest needs no Fabric Manager), or NVSwitches the reader missed")


def _read_xml(p: Proof, step: Step, f: dict[str, Any]) -> None:
    xml_text = p.raw.text("smi_x")
    if xml_text is None:
        return
    try:
        x = xml_facts(xml_text)
    except ET.ParseError as e:
        step.error(f"nvidia-smi -q -x is not XML here: {e}")
        return
    f["xml"] = x
    if x["attached"] != f["count"]:
        step.contradict(f"nvidia-smi -q -x has {x['attached']} GPU(s), gpu_facts reads {f['count']} from -q")
    if x["driver"] != p.facts.get("driver"):
        step.contradict(f"driver {x['driver']} in the XML, {p.facts.get('driver')} in nvidia-smi -q's header")
    xml_modes = {gpu_facts_mode(m) for m in x["virtualization"] if m}
    if xml_modes and ("vgpu" in xml_modes) != (f["virtualization"] == "vgpu"):
        step.contradict(f"the XML's virtualization mode ({', '.join(sorted(xml_modes))}) is not gpu_facts' "
                        f"({f['virtualization']})")


def gpu_facts_mode(xml_mode: str) -> str:
    """NVML's mode as the XML spells it (None, Pass-Through, VGPU...), in gpu_facts.MODES' words."""
    return {"none": "none", "pass-through": "pass-through", "vgpu": "vgpu"}.get(xml_mode.strip().lower(), xml_mode)


def step_gpu_runtime(p: Proof, step: Step) -> None:
    """gpu_runtime's choice for this driver and these GPUs, and its name table against nvidia-smi."""
    rt = import_reader("deployer.gpu_runtime")
    driver, names = p.facts.get("driver"), p.facts.get("gpu_names") or []
    if not driver or not names:
        raise StepError("no driver version or GPU model was read (steps raw and gpu_facts)")
    query = p.raw.text("query")
    # The training_runtime role's query, read by its own parser; else nvidia-smi -q's names
    # (a driver before 510 has no compute_cap field: the name table gives it).
    gpus = rt.parse_smi(p.host, query) if query else [rt.Gpu(name=n, driver=driver, host=p.host) for n in names]
    caps = [g.compute_cap for g in gpus]
    by_name: dict[str, str | None] = {}
    for g in gpus:
        try:
            by_name[g.name] = rt.compute_cap(rt.Gpu(name=g.name, driver=driver))
        except rt.NoFit:
            by_name[g.name] = None
        if g.compute_cap and by_name[g.name] and by_name[g.name] != g.compute_cap:
            step.contradict(f"gpu_runtime.yaml gives {g.name} compute capability {by_name[g.name]}, nvidia-smi "
                            f"says {g.compute_cap}")
    p.facts["compute_caps"] = sorted({c for c in caps if c} or {c for c in by_name.values() if c})
    step.figures = {"driver": driver, "driver_cuda": p.facts.get("cuda_driver"), "compute_cap_reported": caps,
                    "compute_cap_by_name": by_name}
    try:
        choice = rt.choose(gpus)
    except rt.NoFit as e:
        step.figures["choice"] = None
        step.detail = f"no published build fits: {e}"
        p.facts["no_fit"] = str(e)
        return
    fits = rt.driver_ok(driver, choice.cuda) if choice.cuda else True
    p.facts["choice"] = step.figures["choice"] = choice.as_dict()
    step.figures["choice_fits_driver"] = fits
    if not fits:
        step.contradict(f"choose() picked CUDA {choice.cuda}, which its own rule says driver {driver} cannot run")
    within = _cuda_within(rt, choice.cuda, p.facts.get("cuda_driver"))
    step.figures["choice_within_driver_cuda"] = within
    relation = {True: f"within the driver's CUDA {p.facts.get('cuda_driver')}",
                False: f"above the driver's CUDA {p.facts.get('cuda_driver')}: it relies on minor-version compatibility",
                None: "the driver does not say which CUDA it carries"}[within]
    step.detail = f"{choice.requirement} (CUDA {choice.cuda}) for driver {driver}; {relation}"


def _cuda_within(rt: Any, cuda: str | None, driver_cuda: str | None) -> bool | None:
    try:
        return bool(rt.version(cuda)[:2] <= rt.version(driver_cuda)[:2]) if cuda and driver_cuda else None
    except ValueError:  # "N/A": a driver that does not say
        return None


def step_check(p: Proof, step: Step) -> None:
    """`deployer check`'s GPU findings on this node: node_check's collection, analyse's verdict."""
    import_reader("deployer.gpu_facts")  # analyse.gpus and dcgm read with it
    nc = load_node_check()
    expected = int(p.facts.get("gpu_count") or 0)
    if p.dry:
        findings = _check_findings_from_fixtures(p, nc)
    else:
        findings = [nc.check_gpus(expected, p.limit(TOOL_TIMEOUT_S)), _dcgm_finding(p, nc)]
    how = "node_check.result on the recordings" if p.dry else "benchmarks/node_check.py check_gpus + check_dcgm(1)"
    p.raw.keep("check-findings.json", json.dumps(findings, indent=1) + "\n", command=how, host=p.host, utc=utc_now(), rc=0)
    node = NodeReport(p.host, [Finding.parse(f) for f in findings])  # as check/run.py reads each CHECK line
    analyse.gpus([node], {p.host: expected})
    analyse.dcgm([node])
    # analyse replaced the collected text (nvidia-smi -q, lspci, DCGM's JSON) by what it read of it
    step.figures = {"verdict": node.verdict, "reason": node.reason(), "expected_gpus": expected,
                    "findings": [dataclasses.asdict(f) for f in node.findings]}
    gpus = next(f for f in node.findings if f.check == "gpus")
    counted = (gpus.value or {}).get("count") if isinstance(gpus.value, dict) else None
    if counted is not None and counted != expected:
        step.contradict(f"the check counts {counted} GPU(s); the machine has {expected}")
    if node.verdict == "fail":
        step.contradict(f"the check fails this machine: {node.reason()} (a fault here, or a false alarm: "
                        f"the gpu_check step and DCGM's own lines say which)")
    step.detail = f"verdict {node.verdict}: {node.reason()}"


def _check_findings_from_fixtures(p: Proof, nc: Any) -> list[dict[str, Any]]:
    """What node_check.check_gpus and check_dcgm print, made of the recordings (node_check.result)."""
    smi, lspci, dcgm = p.raw.text("smi_q"), p.raw.text("lspci_vvv") or "", p.raw.text("dcgm_diag")
    findings = [nc.result("gpus", "pass", f"nvidia-smi answered (expecting {p.facts.get('gpu_count')} GPU(s))",
                          {"smi_q": smi, "lspci": lspci})]
    if dcgm is None:
        findings.append(nc.result("dcgm", "skip", "dry-run: no dcgmi diag recording"))
    else:
        findings.append(nc.result("dcgm", "pass", "dcgmi diag -r 1 answered (recording)", {"level": 1, "text": dcgm}))
    return findings


def _dcgm_finding(p: Proof, nc: Any) -> dict[str, Any]:
    """node_check.check_dcgm at level 1 (the quick check's), its output kept as the raw
    `dcgmi diag -r 1 -j`. Skipped where DCGM's host engine does not answer: a diagnostic
    that cannot start says nothing of the GPUs."""
    discovery = p.raw.entries.get("dcgm_discovery") or {}
    if shutil.which("dcgmi") and discovery.get("rc", 0) != 0:
        p.raw.absent("dcgm_diag", "dcgmi discovery -l failed: DCGM's host engine (nv-hostengine) does not answer")
        return dict(nc.result("dcgm", "skip", "DCGM's host engine does not answer (dcgmi discovery -l failed)"))
    at, t0 = utc_now(), time.monotonic()
    finding: dict[str, Any] = nc.check_dcgm(1, p.limit(DCGM_DIAG_TIMEOUT_S))
    if finding["status"] != "skip":
        text = (finding.get("value") or {}).get("text", finding["detail"])
        p.raw.keep("dcgm_diag", text, command="dcgmi diag -r 1 -j", host=p.host, utc=at,
                   rc=0 if finding["status"] == "pass" else 1, seconds=round(time.monotonic() - t0, 2))
    else:
        p.raw.absent("dcgm_diag", finding["detail"])
    return finding


HEALTH_SCRIPT = ROOT / "scripts" / "gpu_health_proof.sh"
NODE_CHECKS_TIMEOUT_S = 150  # the quick and standard checks (gpu_check.py inside) and one health run


def step_node_checks(p: Proof, step: Step) -> None:
    """`deployer check`'s node program at the quick and standard levels and the health
    timer's (`deployer heal` reads it), as they run on a node: scripts/gpu_health_proof.sh,
    its outputs under raw/health/, read as check/run.py and the health readers read them. A
    node that passes neither may be a real fault: gpu_check and the raw outputs say which."""
    if p.dry:
        folder = replayed_health(p.args.replay)
        if folder is None:
            raise Skip("dry-run: the node's own checks need this machine (or --replay of a proof that kept them)")
    else:
        if not (p.facts.get("packages") or {}).get("torch"):
            raise StepError(f"torch is not installed for {p.python}: the node's checks would fail its runtime")
        folder = p.out / "raw" / "health"
        env = {**os.environ, "DEPLOYER_PROOF_PYTHON": p.python}
        at, t0 = utc_now(), time.monotonic()
        rc, out = run_quiet(["bash", str(HEALTH_SCRIPT), str(folder), str(p.facts.get("gpu_count") or 1)],
                            p.limit(NODE_CHECKS_TIMEOUT_S), env=env)
        p.raw.keep("node_checks.txt", out, command=f"bash scripts/gpu_health_proof.sh raw/health {p.facts.get('gpu_count')}",
                   host=p.host, utc=at, rc=rc, seconds=round(time.monotonic() - t0, 2))
        if rc != 0:
            raise StepError(f"gpu_health_proof.sh exited {rc}: {(out.strip().splitlines() or [''])[-1][:300]}")
    step.figures = read_node_checks(folder, int(p.facts.get("gpu_count") or 1))
    for level in ("quick", "standard"):
        got = step.figures[level]
        if got["verdict"] == "fail":
            step.contradict(f"deployer check ({level}) fails this machine: {got['reason']}")
    health = step.figures["health"]
    for check in ("gpus", "xid"):
        if health["checks"].get(check) not in ("pass", None):
            step.contradict(f"the health timer's {check} is {health['checks'].get(check)} on this machine: {health['reason']}")
    step.detail = (f"check quick {step.figures['quick']['verdict']} ({step.figures['quick'].get('seconds', '?')}), "
                   f"standard {step.figures['standard']['verdict']} ({step.figures['standard'].get('seconds', '?')}); "
                   f"health {health['verdict']} ({health['reason']}), gpus {health['checks'].get('gpus')}, "
                   f"xid {health['checks'].get('xid')}")


def replayed_health(replay: Path | None) -> Path | None:
    """A replayed proof's node checks: raw/health/, or health/ beside raw/ (the H200's run
    of 2026-11-27, taken by the script alone before this step existed)."""
    if replay is None:
        return None
    return next((d for d in (replay / "health", replay.parent / "health") if (d / "node_health_last.json").is_file()), None)


def read_node_checks(folder: Path, gpus: int) -> dict[str, Any]:
    """node_check.py's CHECK lines as check/run.py reads them, with analyse's GPU, DCGM and
    interface readings; the health run's own record."""
    figures: dict[str, Any] = {}
    for level in ("quick", "standard"):
        lines = (folder / f"node_check_{level}.txt").read_text().splitlines()
        node = NodeReport(socket.gethostname(), [Finding.parse(json.loads(ln.split(" ", 1)[1]))
                                                  for ln in lines if ln.startswith("CHECK ")])
        analyse.gpus([node], {node.name: gpus})
        analyse.dcgm([node])
        analyse.interface([node])
        seconds = folder / f"node_check_{level}.seconds"
        figures[level] = {"verdict": node.verdict, "reason": node.reason(),
                          "checks": {f.check: f.status for f in node.findings},
                          **({"seconds": seconds.read_text().strip()} if seconds.is_file() else {})}
    rec = json.loads((folder / "node_health_last.json").read_text())
    figures["health"] = {"verdict": rec["verdict"], "reason": rec["reason"],
                         "checks": {f["check"]: f["status"] for f in rec["findings"]}}
    return figures


def step_gpu_check(p: Proof, step: Step) -> None:
    """benchmarks/gpu_check.py with the installed torch, read by gpu_facts.check_problems:
    the reading must agree with the script's own exit status."""
    gpu_facts = import_reader("deployer.gpu_facts")
    if not p.dry and not (p.facts.get("packages") or {}).get("torch"):
        raise StepError(f"torch is not installed for {p.python}: gpu_check.py cannot run (install the vendor's torch, "
                        f"or pass --python)")
    env = {**p.env(), "DEPLOYER_GPU_CHECK_NCCL_TIMEOUT_S": str(int(max(10, min(180, p.left() - 30))))}
    at = utc_now()
    rc, out = run_quiet([p.python, str(BENCHMARKS / "gpu_check.py")], p.limit(GPU_CHECK_TIMEOUT_S), env=env)
    p.raw.keep("gpu_check.txt", out, command=f"{p.python} benchmarks/gpu_check.py", host=p.host, utc=at, rc=rc)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if not lines:
        raise StepError(f"gpu_check.py printed no record (rc {rc}): {(out.strip().splitlines() or [''])[-1][:300]}")
    record = json.loads(lines[-1])
    installed = {"cuda": record.get("torch_cuda"), "requirement": f"torch=={record.get('torch')}"}
    problems = gpu_facts.check_problems(p.host, record, installed)
    p.facts["gpu_check"] = record
    step.figures = {"rc": rc, "record": record, "problems": problems}
    if p.facts.get("choice"):  # what deployer up would say with the matrix's build expected
        step.figures["problems_against_choice"] = gpu_facts.check_problems(p.host, record, p.facts["choice"])
    if bool(problems) != (rc != 0):
        step.contradict(f"gpu_check.py exits {rc} but check_problems reads {problems or 'no problem'}")
    if p.dry:
        step.detail = ("; ".join(problems) or "torch runs") + " (dry-run: no GPU here, as expected)"
        return
    for problem in problems:
        step.contradict(problem)
    _held_against_machine(p, step, record)
    step.detail = "; ".join(problems) or (f"torch {record.get('torch')} (CUDA {record.get('torch_cuda')}) runs on "
                                          f"{len(record.get('devices', []))} GPU(s); NCCL {record.get('nccl_version')} ok")


def _held_against_machine(p: Proof, step: Step, record: dict[str, Any]) -> None:
    devices = record.get("devices") or []
    if record.get("cuda_available") and len(devices) != p.facts.get("gpu_count"):
        step.contradict(f"torch sees {len(devices)} GPU(s), nvidia-smi {p.facts.get('gpu_count')}")
    caps = p.facts.get("query_caps") or []
    for dev, cap in zip(devices, caps, strict=False):
        if cap and dev.get("compute_cap") != cap:
            step.contradict(f"GPU {dev['index']}: torch says compute capability {dev['compute_cap']}, nvidia-smi {cap}")


def step_torch_fit(p: Proof, step: Step) -> None:
    """The installed torch against the matrix's rules on this driver: where it runs, the
    rules must allow it; the chosen build's CUDA is proven where it is this torch's, or
    older within the same major (minor-version compatibility then covers it)."""
    rt = import_reader("deployer.gpu_runtime")
    record = p.facts.get("gpu_check")
    if not record or not record.get("torch"):
        raise (Skip if p.dry else StepError)("no torch record from gpu_check")
    if p.dry:
        raise Skip("dry-run: torch sees no GPU here; the choice against the recorded driver ran in gpu_runtime")
    driver, torch_cuda = p.facts.get("driver"), record.get("torch_cuda")
    works = record.get("cuda_op") == "ok"
    try:
        allowed = rt.driver_ok(driver, torch_cuda) if torch_cuda else None
    except KeyError:
        allowed = None
        step.error(f"gpu_runtime.yaml has no minimum driver for CUDA {torch_cuda}")
    archs = [a.removeprefix("sm_").replace("_", "") for a in record.get("arch_list", [])]
    archs = [f"{a[:-1]}.{a[-1]}" for a in archs if a.isdigit()]
    has_code = {d["name"]: rt.runs_on(d["compute_cap"], archs) for d in record.get("devices", [])}
    step.figures = {"driver": driver, "torch": record.get("torch"), "torch_cuda": torch_cuda, "cuda_op": record.get("cuda_op"),
                    "matrix_allows_torch_cuda": allowed, "arch_code_for_gpus": has_code}
    if works and allowed is False:
        step.contradict(f"torch's CUDA {torch_cuda} runs on driver {driver}, but gpu_runtime.yaml says it needs >= "
                        f"{rt.min_driver(torch_cuda)}")
    if not works and allowed and all(has_code.values()):
        step.contradict(f"gpu_runtime's rules allow CUDA {torch_cuda} on driver {driver} with code for every GPU, "
                        f"and the CUDA operation failed: {record.get('cuda_op')}")
    choice = p.facts.get("choice") or {}
    step.figures["choice"] = choice.get("requirement")
    if p.facts.get("no_fit") and works:
        step.notes.append(f"gpu_runtime found no published build for this machine ({p.facts['no_fit']}), yet this "
                          f"torch runs: a build the matrix does not list")
    proven = _choice_proven(rt, choice.get("cuda"), torch_cuda, works)
    step.figures["chosen_cuda_proven_on_driver"] = proven
    step.detail = (f"installed torch {record.get('torch')} (CUDA {torch_cuda}) {'runs' if works else 'does NOT run'}; "
                   f"the matrix allows it: {allowed}; chosen {choice.get('requirement')}: {proven}")


def _choice_proven(rt: Any, chosen: str | None, installed: str | None, works: bool) -> str:
    if not chosen:
        return "no CUDA build was chosen"
    if not installed or not works:
        return "not proven here: the installed torch does not run CUDA"
    c, i = rt.version(chosen)[:2], rt.version(installed)[:2]
    if c == i:
        return f"proven: the installed torch is CUDA {installed} and runs"
    if c[0] == i[0] and c < i:
        return f"proven: CUDA {installed} of the same major runs, so {chosen} does (minor-version compatibility)"
    return f"not proven here: the installed torch is CUDA {installed}, the choice CUDA {chosen}"


def step_allreduce(p: Proof, step: Step) -> None:
    """The check's collective, as `deployer check --level standard` runs it, on this node's GPUs."""
    p.mpi_ready()
    cluster = p.cluster(p.slots())
    runner = p.runner(cluster, p.limit(ALLREDUCE_TIMEOUT_S))
    record, why, silent = cluster_checks.measure_collective(runner, cluster, quiet_s=p.quiet_s)
    _keep_run(p, "allreduce", runner)
    node = NodeReport(p.host)
    found = cluster_checks.collective_findings(record, why, silent, None, [node])
    f = found[0]
    step.figures = {"finding": {"status": f.status, "detail": f.detail, "value": f.value}, "ranks": p.slots(),
                    "record": {k: (record or {}).get(k) for k in ("library", "world_size", "rows", "avg_busbw_gb_s", "wrong")}}
    if f.status == "fail":
        step.contradict(f.detail)
    library = (record or {}).get("library")
    if record and library != ("gloo" if p.dry else "nccl"):
        step.contradict(f"the all-reduce ran on {library}, not {'gloo (CPU ranks)' if p.dry else 'NCCL'}")
    if record and record.get("world_size") != p.slots():
        step.contradict(f"{record.get('world_size')} rank(s) ran, {p.slots()} were started")
    one = " (one GPU: busbw is 0 by nccl-tests' formula; the NCCL path still ran)" if p.slots() == 1 else ""
    step.detail = f.detail + one


def _keep_run(p: Proof, name: str, runner: LocalRunner) -> None:
    last = runner.last
    if last:
        p.raw.keep(f"{name}.log", f"$ {last['command']}\n# exit {last['rc']}\n{last['stdout']}\n# --- stderr ---\n"
                                  f"{last['stderr']}", command=last["command"], host=p.host, utc=utc_now(), rc=last["rc"])


def step_rank_watch(p: Proof, step: Step) -> None:
    """A rank of the collective stopped with SIGSTOP once it beats inside a size: the rank
    watch must name that rank within its quiet time and leave nothing running."""
    p.mpi_ready()
    n = p.slots()
    target = n - 1
    cluster = p.cluster(n)
    stopped: dict[str, Any] = {}

    def stop_once_it_beats(runner: LocalRunner, line: str) -> None:
        rank, _, text = untag(line)
        if stopped or rank != target or not text.startswith("HEARTBEAT ") or "bytes" not in text:
            return
        pid = runner.rank_pid(target)
        if pid:
            os.kill(pid, signal.SIGSTOP)
            stopped.update(pid=pid, at=time.monotonic())

    runner = p.runner(cluster, p.limit(p.quiet_s + RANK_WATCH_EXTRA_S), stop_once_it_beats)
    # One size, iterations enough to outlast any quiet time: only a stop ends it.
    cmd = mpirun_line(cluster, f"{cluster.shared_dir}/hostfile", n, int(p.limit(p.quiet_s + RANK_WATCH_EXTRA_S)),
                      "allreduce.py", ["-b 1M -e 1M -n 100000000 -w 2", "--json", f"--heartbeat {HEARTBEAT_S:g}"],
                      env={"NCCL_ALGO": "Ring"})
    rc, _, err, silent = run_watched(runner, cluster, cmd, cluster.rank_nodes(1), quiet_s=p.quiet_s,
                                     timeout=p.limit(p.quiet_s + RANK_WATCH_EXTRA_S))
    _keep_run(p, "rank-watch", runner)
    left = runner.survivors()
    took = (runner.stopped_at - stopped["at"]) if stopped and runner.stopped_at else None
    step.figures = {"ranks": n, "stopped_rank": target if stopped else None, "quiet_s": p.quiet_s,
                    "named": silent.said() if silent else None, "named_rank": silent.rank if silent else None,
                    "named_step": silent.step if silent else None,
                    "seconds_from_stop_to_named": round(took, 1) if took is not None else None, "left_running": left}
    if not stopped:
        raise StepError(f"rank {target} never beat inside a size, so it was not stopped (rc {rc}): "
                        f"{(err.strip().splitlines() or [''])[-1][:300]}")
    # The watch polls every 0.5 s, and the rank's last beat came up to one beat before the stop.
    if silent is None or silent.rank != target:
        step.contradict(f"the rank watch did not name rank {target}: {silent.said() if silent else 'nobody named'}")
    elif took is None or took > p.quiet_s + 2:
        step.contradict(f"rank {target} was named {took} s after its stop; the quiet time is {p.quiet_s:g} s")
    if left:
        step.contradict(f"processes left running after the stop: {left}")
    step.detail = (f"rank {target} of {n} stopped; named after {took:.1f} s (quiet time {p.quiet_s:g} s) during "
                   f"{silent.step}" if silent and took is not None else step.detail or "not named")


def bench_options(p: Proof, cluster: Cluster) -> BenchOptions:
    """`deployer bench`'s options for GPU nodes (the horovod profile, AMP and channels-last
    chosen by the hardware); the dry-run's CPU ranks get a tiny step of the same flags."""
    opts = make_options(cluster, nodes="1", profile="horovod")
    if p.dry:
        opts = dataclasses.replace(opts, model="resnet18", image_size=32, batch_size=2, num_warmup_batches=1,
                                   num_batches_per_iter=1, num_iters=2)
    return opts


def step_resnet(all_gpus: bool) -> Callable[[Proof, Step], None]:
    def run(p: Proof, step: Step) -> None:
        p.mpi_ready()
        if all_gpus and p.slots() == 1:
            raise Skip("one GPU: resnet_1 ran on all of them")
        _resnet(p, step, p.slots() if all_gpus else 1)
    return run


def _resnet(p: Proof, step: Step, n: int) -> None:
    """bench's run of resnet_synthetic.py (mpirun_cmd + run_watched, as sweep.Session), then
    the report's reading of its img/s against NVIDIA's figure."""
    cluster = p.cluster(n)
    opts = bench_options(p, cluster)
    run_id = f"resnet-{n}"
    runner = p.runner(cluster, p.limit(RESNET_TIMEOUT_S))
    runner.run(hostfiles_cmd(cluster, run_id, (1,)), timeout=30)
    timeout = int(p.limit(RESNET_TIMEOUT_S))
    cmd = mpirun_cmd(cluster, run_id, 1, timeout, "resnet_synthetic.py", [*resnet_args(opts, "dp"), f"--heartbeat {HEARTBEAT_S:g}"])
    rc, out, err, silent = run_watched(runner, cluster, cmd, cluster.rank_nodes(1), quiet_s=p.quiet_s, timeout=timeout + 30)
    _keep_run(p, f"resnet-{n}", runner)
    if silent is not None:
        step.contradict(silent.said())
        return
    if rc != 0:
        raise StepError(diagnose(rc, out, err, cluster.rank_nodes(1), timeout))
    try:
        rec = parse_json_line(out, "resnet_synthetic")
    except OperationFailed as e:
        raise StepError(str(e)) from None
    v = rec.get("versions") or {}
    step.figures = {k: rec.get(k) for k in ("model", "device", "world_size", "batch_size", "image_size", "img_per_sec",
                                            "img_per_sec_per_rank", "conf")}
    step.figures |= {"amp": opts.amp, "channels_last": opts.channels_last,
                     **{k: v.get(k) for k in ("gpu", "gpu_count", "cuda", "cudnn", "nccl", "driver", "torch", "model_impl")}}
    _resnet_held(p, step, rec, n)
    try:
        step.figures["reference"] = reference_reading(rec, opts)
    except StepError as e:
        step.error(str(e))
        step.figures["reference"] = None
    ref = step.figures["reference"] or {"line": "NVIDIA's figure not read (see the notes)"}
    step.detail = (f"{rec['img_per_sec']:.1f} img/s on {n} {'GPU' if not p.dry else 'CPU rank'}(s), "
                   f"{rec['img_per_sec_per_rank']:.1f} per rank; {ref['line']}")


def _resnet_held(p: Proof, step: Step, rec: dict[str, Any], n: int) -> None:
    if rec.get("world_size") != n:
        step.contradict(f"{rec.get('world_size')} rank(s) ran, {n} were started")
    want = "CPU" if p.dry else "GPU"
    if rec.get("device") != want:
        step.contradict(f"the ranks ran on {rec.get('device')}, not {want}")
    seen = set(((rec.get("versions") or {}).get("gpu_count") or {}).values())
    if not p.dry and seen != {p.facts.get("gpu_count")}:
        step.contradict(f"the ranks saw {sorted(seen)} GPU(s) on this node, nvidia-smi {p.facts.get('gpu_count')}")


def reference_reading(rec: dict[str, Any], opts: BenchOptions) -> dict[str, Any]:
    """deployer/bench/report.py's reading: NVIDIA's 1-GPU figure for this GPU where it is
    comparable (ResNet-50, 224 px, AMP), else "no comparable figure" and why."""
    report_mod = import_reader("deployer.bench.report")
    versions = {"benchmark": rec.get("versions") or {}, "flags": dataclasses.asdict(opts)}
    report = report_mod.aggregate("gpu-proof", [(1, rec)], versions=versions)
    ref, line = report["reference"], report_mod.reference_line(report)
    if ref:
        return {"comparison": "NVIDIA figure", "nvidia_img_per_sec_per_gpu": ref["img_per_sec_per_gpu"],
                "share": round(report_mod.reference_share(report["results"][0], ref), 3), "line": line,
                "source": report_mod.reference_source(ref)}
    gpu = (rec.get("versions") or {}).get("gpu")
    return {"comparison": "no comparable figure", "line": line or
            f"no comparable figure: NVIDIA published none for {gpu or 'a CPU run'} in deployer/data/nvidia_resnet50_reference.json"}


# --- the summary --------------------------------------------------------------------------

EXIT = {"pass": 0, "fail": 1, "incomplete": 3}


def verdict(steps: list[Step]) -> str:
    if any(s.status == "fail" for s in steps):
        return "fail"
    return "incomplete" if any(s.status == "error" for s in steps) else "pass"


def machine_line(p: Proof) -> str:
    f = p.facts
    names = sorted(set(f.get("gpu_names") or [])) or ["?"]
    torch = (f.get("gpu_check") or {}).get("torch") or (f.get("packages") or {}).get("torch")
    return (f"{f.get('gpu_count', '?')} x {', '.join(names)}, driver {f.get('driver')} (CUDA {f.get('cuda_driver')}), "
            f"{f.get('virtualization', '?')}, torch {torch or 'absent'}")


def markdown(p: Proof, result: str, finished: str) -> str:
    mode = "dry-run on recorded fixtures, no GPU" if p.dry else "on this machine's GPUs"
    lines = [f"GPU proof ({mode}): {p.host}, {finished} UTC, `scripts/gpu_proof.py`: **{result}**", "",
             f"Machine: {machine_line(p)}", "", "| step | verdict | what it showed |", "| --- | --- | --- |"]
    for s in p.steps:
        said = "; ".join([s.detail, *s.contradictions, *s.notes]).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {s.name} | {s.status} | {said} |")
    return "\n".join(lines) + "\n"


def write_summary(p: Proof) -> int:
    result = verdict(p.steps)
    finished = utc_now()
    summary = {"schema": 1, "tool": "scripts/gpu_proof.py", "mode": "dry-run" if p.dry else "gpu", "host": p.host,
               "started_utc": p.started, "finished_utc": finished, "seconds": round(time.monotonic() - p.t0, 1),
               "budget_s": p.args.budget_s, "verdict": result, "exit_code": EXIT[result], "machine": machine_summary(p),
               "steps": [dataclasses.asdict(s) for s in p.steps], "raw": p.raw.entries,
               "files": {"summary_md": "summary.md", "raw": "raw/", "provenance": "raw/provenance.json", "shared": "shared/"}}
    (p.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    table = markdown(p, result, finished)
    (p.out / "summary.md").write_text(table)
    print("\n" + table)
    print(f"[gpu-proof] {result}: {p.out / 'summary.json'} (exit {EXIT[result]})", flush=True)
    return EXIT[result]


def machine_summary(p: Proof) -> dict[str, Any]:
    f, record = p.facts, p.facts.get("gpu_check") or {}
    return {"gpu_count": f.get("gpu_count"), "gpu_names": f.get("gpu_names"), "driver": f.get("driver"),
            "driver_cuda": f.get("cuda_driver"), "compute_caps": f.get("compute_caps"), "virtualization": f.get("virtualization"),
            "nvswitches": f.get("nvswitches"), "torch": record.get("torch") or (f.get("packages") or {}).get("torch"),
            "torch_cuda": record.get("torch_cuda"), "nccl": record.get("nccl_version")}


STEPS: list[tuple[str, Callable[[Proof, Step], None], float]] = [
    ("environment", step_environment, 0),
    ("raw", step_raw, 0),
    ("gpu_facts", step_gpu_facts, 0),
    ("gpu_runtime", step_gpu_runtime, 0),
    ("check", step_check, MIN_STEP_S),
    ("gpu_check", step_gpu_check, MIN_STEP_S),
    ("node_checks", step_node_checks, MIN_STEP_S),
    ("torch_fit", step_torch_fit, 0),
    ("allreduce", step_allreduce, 40),
    ("rank_watch", step_rank_watch, 60),
    ("resnet_1", step_resnet(all_gpus=False), 60),
    ("resnet_all", step_resnet(all_gpus=True), 60),
]


def fixture_arg(text: str) -> tuple[str, Path]:
    slot, sep, path = text.partition("=")
    if not sep or slot not in SLOTS:
        raise argparse.ArgumentTypeError(f"--fixture SLOT=PATH with SLOT one of {', '.join(SLOTS)}")
    return slot, Path(path).resolve()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join((__doc__ or "").splitlines()[1:]))
    ap.add_argument("--out", type=Path, default=Path("gpu-proof"), help="the folder everything goes into (default gpu-proof/)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: read the recordings under tests/fixtures/gpu/, CPU ranks")
    ap.add_argument("--fixture", type=fixture_arg, action="append", default=[], metavar="SLOT=PATH",
                    help=f"dry-run: read PATH for one output instead of its recording; SLOT: {', '.join(SLOTS)}")
    ap.add_argument("--replay", type=Path, default=None, metavar="RAW_DIR",
                    help="dry-run: read every output from an earlier proof's raw/ folder (its provenance.json says "
                         "which were there), e.g. tests/fixtures/gpu/proof-h200-2026-11-27/raw")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch the benchmarks run in (default: this one)")
    ap.add_argument("--budget-s", type=int, default=BUDGET_S, help=f"seconds for the whole run (default {BUDGET_S})")
    ap.add_argument("--quiet-s", type=float, default=None,
                    help=f"the rank watch's quiet time (default: deployer's {QUIET_S:g} s; {DRY_RUN_QUIET_S:g} s in the dry-run)")
    ap.add_argument("--no-benchmarks", action="store_true", help="skip the MPI benchmarks (allreduce, rank watch, ResNet)")
    args = ap.parse_args(argv)
    args.fixture = dict(args.fixture)
    if args.fixture and not args.dry_run:
        ap.error("--fixture is for --dry-run")
    if args.replay is not None:
        if not args.dry_run or args.fixture:
            ap.error("--replay is for --dry-run, without --fixture")
        if not (args.replay / "provenance.json").is_file():
            ap.error(f"--replay {args.replay}: no provenance.json there (give a proof's raw/ folder)")
        args.replay = args.replay.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    proof = Proof(args)
    try:
        for name, fn, needs_s in STEPS:
            proof.run(name, fn, needs_s=needs_s)
    except KeyboardInterrupt:
        proof.steps.append(Step("interrupted", "error", "stopped by Ctrl-C: the steps after it did not run"))
    return write_summary(proof)


if __name__ == "__main__":
    sys.exit(main())
