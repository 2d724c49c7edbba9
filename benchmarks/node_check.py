#!/usr/bin/env python3
"""One node's half of `deployer check`: what this node can say about itself.

    python3 - --shared /shared --token RUN [--level quick] [--gpus N] < node_check.py

The controller sends the script over SSH on stdin, so it runs whatever state the node's
shared dir is in (a node whose /shared went is what it must find); by hand,
`python3 /shared/benchmarks/node_check.py ...` does the same.

Prints, as it goes, `STEP <name>` when a check starts (the controller names the last one
should the node fall silent), `BEAT` every few seconds while one runs, and `CHECK {json}`
when it ends: {"check", "status" (pass,
warn, fail, skip), "detail", and "value" where there is a figure}. The controller
(deployer/check/) compares the nodes with each other and with what the cluster promises,
and gives the verdicts; this script only measures and says what it saw. Standard library
only: it runs on the node's own python3, before and whatever the training venv is.

Checks: the clock (time, NTP synchronised), free space on / and the shared dir, the shared
dir mounted and writable (a file per node under <shared>/.deployer-check/<token>/, read
back by the controller from the master: shared, not only local), CPUs and memory, the
training environment (torch and mpi4py import in a login shell's python), the interface
NCCL and gloo use. With --gpus N: nvidia-smi's GPUs, ECC and PCIe link (deployer's
gpu_facts reads the text), and at --level standard and full the GPU check
(benchmarks/gpu_check.py) and DCGM's diagnostics where dcgmi is installed (-r 2, -r 3).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

GIB = 1 << 30
BEAT_S = 5.0
# Free space below these fails or warns: a checkpoint or a dataset will not fit.
DISK_FAIL_BYTES, DISK_WARN_BYTES, DISK_WARN_FRACTION = 1 * GIB, 5 * GIB, 0.05
DCGM_LEVEL = {"quick": 1, "standard": 2, "full": 3}  # dcgmi diag -r: seconds, about 2 min, about 15 min per GPU


def emit(tag: str, payload: Any) -> None:
    print(f"{tag} {payload if isinstance(payload, str) else json.dumps(payload)}", flush=True)


def result(check: str, status: str, detail: str, value: Any = None) -> dict[str, Any]:
    return {"check": check, "status": status, "detail": detail, **({"value": value} if value is not None else {})}


def run(argv: list[str], timeout: float) -> tuple[int, str]:
    """rc and stdout+stderr of argv; 124 on timeout, 127 when it is not installed."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not installed"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv)}: no answer in {timeout:.0f}s"
    return p.returncode, (p.stdout + p.stderr).strip()


def check_clock() -> dict[str, Any]:
    """The node's time (the controller computes the offset from when it read it) and
    whether systemd-timesyncd or chrony says the clock is synchronised."""
    rc, out = run(["timedatectl", "show", "-p", "NTPSynchronized", "--value"], 10)
    synced = {"yes": True, "no": False}.get(out.strip()) if rc == 0 else None
    said = {True: "NTP synchronised", False: "NTP not synchronised", None: "NTP state unknown (no timedatectl answer)"}[synced]
    return result("clock", "pass", said, {"time": time.time(), "ntp_synchronized": synced})


def check_disk(name: str, path: str) -> dict[str, Any]:
    try:
        st = os.statvfs(path)
    except OSError as e:
        return result(name, "fail", f"{path}: {e.strerror}")
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    value = {"path": path, "free_bytes": free, "total_bytes": total}
    said = f"{path}: {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB"
    if free < DISK_FAIL_BYTES:
        return result(name, "fail", said, value)
    if free < DISK_WARN_BYTES or (total and free / total < DISK_WARN_FRACTION):
        return result(name, "warn", said, value)
    return result(name, "pass", said, value)


def _mount_point(path: str) -> str | None:
    """The mount point `path` is on (/proc/self/mountinfo), its source and type beside it."""
    real = os.path.realpath(path)
    best = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                point = fields[4].replace("\\040", " ")
                if real == point or real.startswith(point.rstrip("/") + "/"):
                    if best is None or len(point) >= len(best):
                        best = point
    except OSError:
        return None
    return best


def check_shared(shared: str, token: str) -> dict[str, Any]:
    """The shared dir is a mount of its own (not the root disk's directory, as on a node
    whose mount went) and takes a file, read back here; the controller reads every node's
    from the master."""
    point = _mount_point(shared)
    if point != os.path.realpath(shared):
        return result("shared_dir", "fail", f"{shared} is not mounted (it is a directory on {point or '?'}): "
                      f"the cluster's shared storage is missing on this node")
    mine = os.path.join(shared, ".deployer-check", token, socket.gethostname())
    try:
        os.makedirs(os.path.dirname(mine), exist_ok=True)
        with open(mine, "w") as f:
            f.write(socket.gethostname() + "\n")
        with open(mine) as f:
            ok = f.read().strip() == socket.gethostname()
    except OSError as e:
        return result("shared_dir", "fail", f"{shared}: cannot write ({e.strerror})")
    if not ok:
        return result("shared_dir", "fail", f"{shared}: a file written here reads back different")
    return result("shared_dir", "pass", f"{shared} mounted and writable", {"file": mine})


# A cgroup v1 memory limit at or above this is "no limit" (the kernel's PAGE_COUNTER_MAX
# in bytes, rounded down to a page, is just below 2**63).
NO_LIMIT = 1 << 62


def _first_line(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return None


def memory_limit(cgroup: str = "/sys/fs/cgroup") -> int | None:
    """The node's memory cap where a cgroup sets one: a container's /proc/meminfo is the
    host's, its limit is the cgroup's (v2 memory.max, v1 memory.limit_in_bytes, seen at the
    root of its cgroup namespace). None in a VM: its MemTotal is all it has."""
    for path in (f"{cgroup}/memory.max", f"{cgroup}/memory/memory.limit_in_bytes"):
        text = _first_line(path)
        if text and text.isdigit() and int(text) < NO_LIMIT:
            return int(text)
    return None


def cpu_limit(cgroup: str = "/sys/fs/cgroup") -> float | None:
    """CPUs' worth of time the node's cgroup may use (a CFS quota), None where none is set."""
    quota: str | None
    period: str | None
    v2 = _first_line(f"{cgroup}/cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        return int(quota) / int(period) if quota.isdigit() and period.isdigit() and int(period) else None
    for d in (f"{cgroup}/cpu", f"{cgroup}/cpu,cpuacct"):
        quota, period = _first_line(f"{d}/cpu.cfs_quota_us"), _first_line(f"{d}/cpu.cfs_period_us")
        if quota and period and quota.isdigit() and period.isdigit() and int(period):
            return int(quota) / int(period)  # -1 (no quota) is not isdigit()
    return None


def check_size(cgroup: str = "/sys/fs/cgroup", meminfo: str = "/proc/meminfo") -> dict[str, Any]:
    """CPUs this node may use and its memory, each capped by its cgroup's limit where it
    has one (a container: its /proc shows the host's); the controller compares the nodes
    and what the flavor or the spec promised."""
    cpus, quota = len(os.sched_getaffinity(0)), cpu_limit(cgroup)
    quoted = quota is not None and quota < cpus
    if quota is not None and quoted:
        cpus = max(1, math.ceil(quota))  # a quota of 1.5 CPUs runs on two, at most 1.5 at once
    mem = 0
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    limit = memory_limit(cgroup)
    capped = limit is not None and limit < mem
    if limit is not None and capped:
        mem = limit
    said = f"{cpus} CPU(s)" + (f" (a quota of {quota:g})" if quoted else "")
    said += f", {mem / GIB:.1f} GiB" + (" (its cgroup's limit)" if capped else "")
    return result("size", "pass", said, {"cpus": cpus, "memory_bytes": mem, "cpu_quota": quota,
                                         "memory_from": "cgroup" if capped else "meminfo"})


def check_runtime(timeout: float) -> dict[str, Any]:
    """torch and mpi4py import in the python a login shell finds (the training venv)."""
    code = "import json, torch, mpi4py; print(json.dumps({'torch': torch.__version__, 'mpi4py': mpi4py.__version__}))"
    rc, out = run(["bash", "-lc", f"python -c {json.dumps(code)}"], timeout)
    if rc != 0:
        return result("runtime", "fail", f"the training environment does not import: {out.splitlines()[-1] if out else rc}")
    versions = json.loads(out.splitlines()[-1])
    return result("runtime", "pass", f"torch {versions['torch']}, mpi4py {versions['mpi4py']}", versions)


def check_interface() -> dict[str, Any]:
    """The interface NCCL and gloo use (the login shell's NCCL_SOCKET_IFNAME) exists, is up
    and has an address; the controller checks it is the same on every node."""
    rc, out = run(["bash", "-lc", "echo ${NCCL_SOCKET_IFNAME:-}/${GLOO_SOCKET_IFNAME:-}"], 15)
    nccl, _, gloo = out.strip().partition("/")
    name = (nccl or gloo).split(",")[0]
    if not name:
        return result("interface", "warn", "NCCL_SOCKET_IFNAME is not set: NCCL and gloo pick an interface themselves")
    state_file = f"/sys/class/net/{name}/operstate"
    if not os.path.exists(state_file):
        return result("interface", "fail", f"NCCL_SOCKET_IFNAME={name}: no such interface on this node", {"name": name})
    with open(state_file) as f:
        state = f.read().strip()
    if state not in ("up", "unknown"):
        return result("interface", "fail", f"{name} is {state}", {"name": name})
    return result("interface", "pass", f"NCCL and gloo use {name} ({state})", {"name": name, "gloo": gloo or None})


def _sudo() -> list[str]:
    """The prefix that runs a command as root: none for root, else passwordless sudo."""
    return ["sudo", "-n"] if os.geteuid() != 0 and shutil.which("sudo") else []


def lspci_gpus(timeout: float) -> str:
    """`lspci -vv -d 10de:`: NVIDIA's devices as the PCI bus sees them, with or without a
    driver. The link registers need root (else "<access denied>"): through passwordless
    sudo where the cluster user has it. "" where lspci is missing."""
    if shutil.which("lspci") is None:
        return ""
    sudo = _sudo()
    rc, out = run([*sudo, "lspci", "-vv", "-d", "10de:"], timeout)
    if rc != 0 and sudo:
        rc, out = run(["lspci", "-vv", "-d", "10de:"], timeout)
    return out if rc == 0 else ""


def check_gpus(expected: int, timeout: float) -> dict[str, Any]:
    """nvidia-smi -q as text (the controller reads count, model, ECC and the PCIe link),
    and lspci's view of the same GPUs (a GPU that fell off the bus, the link's width)."""
    rc, out = run(["nvidia-smi", "-q"], timeout)
    pci = lspci_gpus(timeout)
    if rc != 0:
        return result("gpus", "fail", f"nvidia-smi failed: {out.splitlines()[-1] if out else rc}", {"lspci": pci})
    return result("gpus", "pass", f"nvidia-smi answered (expecting {expected} GPU(s))", {"smi_q": out, "lspci": pci})


def check_gpu_run(benchmarks: str, timeout: float) -> dict[str, Any]:
    """benchmarks/gpu_check.py in the training environment: CUDA works, NCCL inside the node."""
    rc, out = run(["bash", "-lc", f"python {benchmarks}/gpu_check.py"], timeout)
    lines = [x for x in out.splitlines() if x.startswith("{")]
    record = json.loads(lines[-1]) if lines else {}
    if rc != 0:
        return result("gpu_run", "fail", record.get("error") or (out.splitlines() or [f"rc {rc}"])[-1], record or None)
    return result("gpu_run", "pass", "CUDA and NCCL inside the node work", record)


def check_dcgm(level: int, timeout: float) -> dict[str, Any]:
    """DCGM's diagnostics at `level`, its table as printed (the controller reads it test by
    test: deployer/gpu_facts.py dcgm_results)."""
    if shutil.which("dcgmi") is None:
        return result("dcgm", "skip", "DCGM is not installed (monitoring.dcgm installs it on GPU nodes)")
    # Its deployment tests (permissions, persistence mode) want root: the cluster user has
    # passwordless sudo.
    sudo = _sudo()
    # -j: its JSON report (a failed test exits non-zero and still prints it); the table
    # without -j is read too (deployer/gpu_facts.py dcgm_results).
    rc, out = run([*sudo, "dcgmi", "diag", "-r", str(level), "-j"], timeout)
    if "{" not in out and "|" not in out:
        return result("dcgm", "fail", f"dcgmi diag -r {level}: {out.splitlines()[-1] if out else rc}")
    return result("dcgm", "pass", f"dcgmi diag -r {level} answered", {"level": level, "text": out})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--shared", required=True)
    p.add_argument("--token", required=True, help="this check's id: the shared dir's files are kept apart by it")
    p.add_argument("--level", choices=("quick", "standard", "full"), default="quick")
    p.add_argument("--gpus", type=int, default=0, help="GPUs the cluster says this node has")
    p.add_argument("--timeout", type=float, default=60, help="seconds one check may take")
    a = p.parse_args(argv)
    checks: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("clock", check_clock),
        ("disk_root", lambda: check_disk("disk_root", "/")),
        ("shared_dir", lambda: check_shared(a.shared, a.token)),
        ("disk_shared", lambda: check_disk("disk_shared", a.shared)),
        ("size", check_size),
        ("interface", check_interface),
        ("runtime", lambda: check_runtime(a.timeout)),
    ]
    if a.gpus:
        checks.append(("gpus", lambda: check_gpus(a.gpus, a.timeout)))
        if a.level != "quick":
            checks.append(("gpu_run", lambda: check_gpu_run(f"{a.shared}/benchmarks", a.timeout * 3)))
        checks.append(("dcgm", lambda: check_dcgm(DCGM_LEVEL[a.level], a.timeout * {"quick": 1, "standard": 5, "full": 30}[a.level])))
    # A beat every few seconds from a thread of its own, whatever a check waits for: the
    # controller names a node that falls silent (a frozen process, a dead connection); a
    # check that never returns is bounded by its own timeout instead.
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(BEAT_S):
            emit("BEAT", str(round(time.time())))

    threading.Thread(target=beat, daemon=True).start()
    for name, fn in checks:
        emit("STEP", name)
        try:
            emit("CHECK", fn())
        except Exception as e:  # a check that breaks is that check failing, named; the rest still run
            emit("CHECK", result(name, "fail", f"the check itself failed: {e.__class__.__name__}: {e}"))
    stop.set()
    emit("DONE", socket.gethostname())
    return 0


if __name__ == "__main__":
    sys.exit(main())
