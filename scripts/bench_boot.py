#!/usr/bin/env python3
"""First boot of N local nodes, alone: time until cloud-init has finished on every node,
and the CPU each node's container used for it, with the local image's trimmed cloud-init
(two stages, the user-data's modules: deployer/providers/local/image.py) against the stock one
(four stages, every module of Debian's cloud.cfg), side by side.

Run as root from the repo root: `sudo .venv/bin/python scripts/bench_boot.py [--nodes 1,8] [--rounds 2]`.
Nodes are made by the driver from the current image and real user-data (deployer/pipeline/boot.py),
on a bridge and subnet of their own (`bootbench`, 10.97.0.0/24), then started together,
as Terraform starts them; "stock" undoes the image's trim in each node's own layer. Done
means the node's boot-finished file exists, read from the host (a probe inside the node
would spend the CPU being measured). Everything is removed afterwards.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deployer.pipeline import boot  # noqa: E402
from deployer.providers.local import host, image, network, node  # noqa: E402
from deployer.spec import ClusterSpec  # noqa: E402
from deployer.state import ClusterState  # noqa: E402

CLUSTER, BRIDGE, SUBNET = "bootbench", "dplbootbench", "10.97.0"
# The cloud-init stages the image masks (the others it masks are not cloud-init's).
TRIMMED_UNITS = [u for u in image.MASKED_UNITS if u.startswith("cloud-")]


def stock(rootfs: Path) -> None:
    """Undo the trim in one node's layer: Debian's module lists and all four stages."""
    cfg = rootfs / "etc/cloud/cloud.cfg.d/90-deployer-local.cfg"
    kept = "".join(line for line in cfg.read_text().splitlines(True) if "_modules:" not in line)
    cfg.write_text(kept + "locale: C.UTF-8\n")  # the locale module's default needs locale-gen, absent here
    for unit in TRIMMED_UNITS:
        (rootfs / "etc/systemd/system" / unit).unlink()


def cpu_s(name: str) -> float:
    return int(Path(f"/sys/fs/cgroup/cpuacct/lxc.payload.{name}/cpuacct.usage").read_text()) / 1e9


def finished(name: str) -> bool:
    return any((host.LXC_PATH / name / "upper/var/lib/cloud/instances").glob("*/boot-finished"))


def boot_once(n: int, variant: str, work: Path) -> dict[str, float]:
    # The user-data and host keys as `up` makes them, in a state dir of the bench's own.
    spec = ClusterSpec(name=CLUSTER, provider="local", nodes=n)
    state = ClusterState(work / "state", CLUSTER)
    state.create()
    boot_dir = boot.write_user_data(spec, state)
    names = spec.node_names()
    shared = work / "shared"
    shared.mkdir(exist_ok=True)
    network.network_up(network.NetworkUp(CLUSTER, BRIDGE, f"{SUBNET}.0/24", f"{SUBNET}.1/24"))
    try:
        for i, name in enumerate(names):
            node.node_create(name, f"{SUBNET}.{10 + i}/24", f"{SUBNET}.1", BRIDGE, f"{shared}:/shared", 1024,
                            boot_dir / f"{name}.user-data")
            if variant == "stock":
                with node._mounted(name, image.base_rootfs().resolve()):
                    stock(host.LXC_PATH / name / "rootfs")
        t0 = time.perf_counter()
        for name in names:
            subprocess.run(["lxc-start", "-n", name, "-d"], check=True)
        done: dict[str, float] = {}
        cpu: dict[str, float] = {}
        while len(done) < n:
            if time.perf_counter() - t0 > 300:
                raise SystemExit(f"not booted in 300 s: {sorted(set(names) - set(done))}")
            for name in names:
                if name not in done and finished(name):
                    done[name], cpu[name] = time.perf_counter() - t0, cpu_s(name)
            time.sleep(0.05)
        status = {subprocess.run(["lxc-attach", "-n", name, "--", "cloud-init", "status"], text=True,
                                 capture_output=True).stdout.strip() for name in names}
        if status != {"status: done"}:
            raise SystemExit(f"{variant}: cloud-init ended with {status}")
        return {"wall_s": max(done.values()), "cpu_s": statistics.mean(cpu.values())}
    finally:
        for name in names:
            node.node_down(name)
        network.network_down(CLUSTER, BRIDGE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,8", help="comma-separated node counts")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    counts = [int(x) for x in a.nodes.split(",")]
    image.ensure_base_image()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-boot-") as tmp:
        for rnd in range(1, a.rounds + 1):
            for n in counts:
                for variant in ("trimmed", "stock"):  # interleaved: a noisy moment hits both
                    r = boot_once(n, variant, Path(tmp))
                    rows.append({"round": rnd, "nodes": n, "variant": variant, **r})
                    print(f"round {rnd}  N={n}  {variant:8}  all booted {r['wall_s']:5.2f} s  CPU per node {r['cpu_s']:.2f} s", flush=True)
    print()
    for n in counts:
        med = {v: statistics.median(r["wall_s"] for r in rows if r["nodes"] == n and r["variant"] == v) for v in ("trimmed", "stock")}
        cpu = {v: statistics.median(r["cpu_s"] for r in rows if r["nodes"] == n and r["variant"] == v) for v in ("trimmed", "stock")}
        print(f"N={n}: boot {med['trimmed']:.2f} s trimmed vs {med['stock']:.2f} s stock (x{med['trimmed'] / med['stock']:.2f}); "
              f"CPU per node {cpu['trimmed']:.2f} vs {cpu['stock']:.2f} s")


if __name__ == "__main__":
    main()
