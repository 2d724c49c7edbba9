"""Slurm's node lines, gres.conf and plugin choice, from what each node reports.

The slurm role collects each node's raw facts (ansible/roles/slurm/files/slurm-node-facts:
`slurmd -C`, the memory limits it lives under, the cgroup file system, NVIDIA device
files) and hands them here through ansible/filter_plugins/deployer_slurm.py, so every
decision is a pure function the unit tests run on recorded output.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import Cluster

# What slurmd -C reports that slurm.conf's node line takes as is (its hardware layout).
LAYOUT_KEYS = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
# The first Slurm whose cgroup/v2 plugin exists (21.08 knows cgroup v1 only).
CGROUP_V2_SINCE = (22, 5)
# A cgroup v1 memory limit at or above this is "no limit" (the kernel's PAGE_COUNTER_MAX).
_UNLIMITED = 1 << 60


def parse_slurmd_c(text: str) -> dict[str, str]:
    """`slurmd -C` → its key=value pairs (NodeName, CPUs, ..., RealMemory, UpTime)."""
    pairs = dict(re.findall(r"(\w+)=(\S+)", text))
    missing = [k for k in (*LAYOUT_KEYS, "RealMemory") if k not in pairs]
    if missing:
        raise ValueError(f"slurmd -C printed no {', '.join(missing)}: {text.strip()[:200]!r}")
    return pairs


def memory_mb(facts: dict[str, Any]) -> int:
    """The node's own memory in MiB: the least of what slurmd saw and the node's limits.

    slurmd reads sysinfo(), which in a container is the host's RAM; the container's
    memory limit (cgroup v1 memory.limit_in_bytes or v2 memory.max) is what it really
    has. Configured above what slurmd sees, the node would be drained ("Low RealMemory")."""
    seen = int(parse_slurmd_c(facts["slurmd_c"])["RealMemory"])
    limits = []
    for raw in facts.get("memory_limits") or []:
        raw = str(raw).strip()
        if raw.isdigit() and int(raw) < _UNLIMITED:
            limits.append(int(raw) // (1024 * 1024))
    return min([seen, *limits])


def _version(text: str) -> tuple[int, int]:
    m = re.search(r"(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def cgroup_usable(facts: dict[str, Any]) -> tuple[bool, str]:
    """Whether Slurm's cgroup plugins can work on this node, and why (one phrase)."""
    fs = facts.get("cgroup_fs")
    if fs == "cgroup2fs":
        if _version(facts.get("slurm_version", "")) < CGROUP_V2_SINCE:
            return False, f"cgroup v2 only, and Slurm {facts.get('slurm_version')} has no cgroup/v2 plugin"
        missing = {"cpuset", "memory"} - set(str(facts.get("cgroup_controllers", "")).split())
        if missing:
            return False, f"cgroup v2 without the {', '.join(sorted(missing))} controller(s)"
        return True, "cgroup v2 with the cpuset and memory controllers"
    if fs == "tmpfs":
        if facts.get("cgroup_v1_writable"):
            return True, "cgroup v1 hierarchies Slurm can create its own cgroups in"
        return False, "cgroup v1 hierarchies Slurm cannot create cgroups in (a container's read-only view)"
    return False, f"no cgroup file system Slurm knows at /sys/fs/cgroup ({fs or 'none'})"


def _count(cpu_list: str) -> int:
    """ "0-3,8" → 5 (the kernel's CPU list syntax)."""
    n = 0
    for part in str(cpu_list).split(","):
        if part.strip():
            a, _, b = part.partition("-")
            n += int(b or a) - int(a) + 1
    return n


def own_cpus(facts: dict[str, Any]) -> int:
    """The CPUs the node may use: slurmd -C counts the machine's, a container may have
    a share of them (its cpuset; the local provider gives each node its own cores)."""
    seen = int(parse_slurmd_c(facts["slurmd_c"])["CPUs"])
    allowed = facts.get("cpus_allowed")
    return min(seen, _count(allowed)) if allowed else seen


def cores_partitioned(facts: dict[str, Any]) -> bool:
    """Whether the node has fewer CPUs than the machine slurmd -C describes."""
    return own_cpus(facts) < int(parse_slurmd_c(facts["slurmd_c"])["CPUs"])


def _cores_not_bindable(facts: dict[str, Any]) -> str | None:
    """Why Slurm must not bind this node's cores, or None where it may.

    Slurm names CPUs by the machine's ids: a node with a share of them (a cpuset) may not
    be given the others (EACCES writing the job's cpuset.cpus; task/affinity would pin to
    CPUs it lacks). A container's share is the host's to change (the local provider gives
    nodes their own cores or the shared ones as the cluster grows), so no container binds."""
    if cores_partitioned(facts):
        return f"has {own_cpus(facts)} of the machine's {parse_slurmd_c(facts['slurmd_c'])['CPUs']} CPUs"
    if facts.get("container", "none") != "none":
        return f"is in a container ({facts['container']}), whose CPUs the host places"
    return None


def plugins(all_facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The cluster's process tracking and task plugins: one choice for every node (slurmctld
    checks that every slurmd runs the same slurm.conf), cgroup only where all nodes can,
    cores bound only where every node lets them be."""
    verdicts = {name: cgroup_usable(f) for name, f in sorted(all_facts.items())}
    unbound = {name: why for name, f in sorted(all_facts.items()) if (why := _cores_not_bindable(f))}
    no = {name: why for name, (ok, why) in verdicts.items() if not ok}
    cores = "cores bound" if not unbound else "cores not bound: {} {}".format(*next(iter(unbound.items())))
    if not no:
        return {"cgroup": True, "proctrack": "proctrack/cgroup",
                "task": "task/cgroup" if unbound else "task/cgroup,task/affinity", "constrain_cores": not unbound,
                "why": f"every node has {next(iter(verdicts.values()))[1]}; {cores}"}
    name, why = next(iter(no.items()))
    return {"cgroup": False, "proctrack": "proctrack/linuxproc", "task": "task/none" if unbound else "task/affinity",
            "constrain_cores": False, "why": f"{name}: {why}; {cores}"}


def node_line(name: str, addr: str, facts: dict[str, Any], gpus: int = 0) -> str:
    """slurm.conf's NodeName line: the layout slurmd -C reports, the node's own memory,
    and its GPUs as a generic resource.

    The layout stays the machine's even where a container has a share of its CPUs:
    slurmctld aborts (requeues) running jobs on a node whose cores change in slurm.conf,
    and the local provider re-places containers' cores as the cluster grows."""
    seen = parse_slurmd_c(facts["slurmd_c"])
    parts = [f"NodeName={name}", f"NodeAddr={addr}", *(f"{k}={seen[k]}" for k in LAYOUT_KEYS),
             f"RealMemory={memory_mb(facts)}"]
    if gpus:
        parts.append(f"Gres=gpu:{int(gpus)}")
    return " ".join(parts)


def _device_index(path: str) -> int:
    return int(re.sub(r"\D", "", path) or 0)


def gres_line(name: str, facts: dict[str, Any], gpus: int) -> str | None:
    """gres.conf's line for a node: NVML's autodetection where this Slurm has the plugin,
    otherwise the device files (the first `gpus` of /dev/nvidiaN the node has; /dev/nvidia0..
    when the driver has made none yet). None for a node without GPUs."""
    if not gpus:
        return None
    if facts.get("nvml"):
        return f"NodeName={name} AutoDetect=nvml Name=gpu Count={int(gpus)}"
    found = sorted((d for d in facts.get("gpu_devices") or [] if re.fullmatch(r"/dev/nvidia\d+", d)), key=_device_index)
    indices = [_device_index(d) for d in found[: int(gpus)]] or list(range(int(gpus)))
    if len(indices) < int(gpus):
        indices = list(range(int(gpus)))
    return f"NodeName={name} Name=gpu File=/dev/nvidia{_brackets(indices)}"


def _brackets(indices: list[int]) -> str:
    """0 → "0"; [0, 1] → "[0-1]"; [0, 2, 3] → "[0,2-3]" (Slurm's host-list syntax)."""
    if len(indices) == 1:
        return str(indices[0])
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return "[" + ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs) + "]"


# sinfo's node states (%T) of a node that registered and answers: it takes work, or it
# is drained, a decision of an administrator's or of health's (docs/check.md, Health) that
# `up` neither waits for nor undoes. "*" (not responding) and the rest (down, unknown,
# ...) are not ready.
READY_STATES = {"idle", "mixed", "allocated", "completing", "drained", "draining"}


def not_ready(sinfo: str, names: list[str]) -> list[str]:
    """`sinfo --noheader --Node --format='%N %T'` → "node: state" for each of `names`
    that is not ready (missing from sinfo, down, not responding; a drained node is ready)."""
    seen: dict[str, str] = {}
    for line in sinfo.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            seen[parts[0]] = parts[1]  # a node in two partitions: one state for both
    return [f"{n}: {seen.get(n, 'not in sinfo')}" for n in names if seen.get(n) not in READY_STATES]


# The top switch of topology.conf: every host's switch hangs from it, so the network is
# one fabric and a job may span every node (Slurm: "Jobs can only span nodes connected by
# the same switch fabric").
TOP_SWITCH = "cloud"


def topology_conf(cluster: Cluster) -> str | None:
    """topology.conf (TopologyPlugin=topology/tree) from where the nodes run: a switch per
    host holding its nodes, one above them all, so Slurm gives a job nodes of as few hosts
    as it can (pairs on one host talk through its bridge, not the NIC). The switches are
    named host1, host2... in the hostfile's order, a comment naming each host (a hostId is
    56 characters). None when a node's host is not known: no topology beats a wrong one."""
    groups = cluster.host_groups()
    if not groups or None in groups:
        return None
    lines = ["# Rendered by deployer from where each node runs (the cluster record's host); do not edit."]
    for i, (host, nodes) in enumerate(groups.items(), 1):
        lines.append(f"# host{i}: {host}")
        lines.append(f"SwitchName=host{i} Nodes={','.join(n.name for n in nodes)}")
    lines.append(f"SwitchName={TOP_SWITCH} Switches=host[1-{len(groups)}]" if len(groups) > 1
                 else f"SwitchName={TOP_SWITCH} Switches=host1")
    return "\n".join(lines) + "\n"
