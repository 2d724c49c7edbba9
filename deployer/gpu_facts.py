"""What a GPU node's own tools say, read the same way everywhere: virtualization mode
(nvidia-smi -q, lspci before a driver) and the verdict on the after-install check.

Used by the Ansible roles through ansible/filter_plugins/deployer_gpu.py, so the
parsing is unit-tested on recorded outputs (tests/fixtures/gpu/) rather than in Jinja.

Why the virtualization mode matters: in an NVIDIA vGPU (GRID) guest the driver must match
the host's vGPU manager and comes from the operator's licensed package; a distribution
driver installed over it breaks the GPU. DCGM supports bare metal and pass-through only.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .gpu_runtime import runs_on

# nvidia-smi -q, section "GPU Virtualization Mode": None | Pass-Through | VGPU | Host VGPU | Host VSGA
_MODE = re.compile(r"^\s*Virtualization Mode\s*:\s*(.+?)\s*$", re.MULTILINE)
MODES = {"none": "none", "pass-through": "pass-through", "vgpu": "vgpu", "host vgpu": "host-vgpu", "host vsga": "host-vsga"}
# vGPU profiles as the guest's PCI subsystem names them (pci.ids): "GRID V100D-8C",
# "GRID A100-40C", "NVIDIA A100-4C"... a board name, a frame-buffer size, a series letter.
_PROFILE = re.compile(r"\bGRID\b|\b[A-Z]{1,2}\d{2,3}[A-Z]?[DX]?-\d{1,3}[ABCQ]\b")


def virtualization(smi_q: str) -> str:
    """The node's mode from `nvidia-smi -q`: vgpu if any GPU is a vGPU, else the first GPU's."""
    modes = [MODES.get(m.strip().lower(), "unknown") for m in _MODE.findall(smi_q)]
    if not modes:
        # Attached vGPUs appear only in a guest; older drivers print no mode section.
        return "vgpu" if re.search(r"^Attached vGPUs\s*:", smi_q, re.MULTILINE) else "unknown"
    return "vgpu" if "vgpu" in modes else modes[0]


def pci_vgpu(lspci: str) -> bool:
    """Before any driver answers: does `lspci -vmm -d 10de:` (or -v) name a vGPU profile?
    Only where pci.ids has the subsystem: Debian 12's and upstream's have none for today's
    datacenter vGPU profiles (a V100D-8C guest shows `SDevice: Device [1396]`)."""
    for line in lspci.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("subsystem", "sdevice") and _PROFILE.search(value):
            return True
    return False


# GPUs NVIDIA's vGPU software runs on (its "Supported GPUs" list: Tesla M/P/V/T, the A/L/H
# data-center boards, the RTX professional boards), as pci.ids names them. On these, a
# guest cannot tell from PCI alone whether it has the whole GPU or a vGPU of it: the
# device id is the physical GPU's either way.
_VGPU_CAPABLE = re.compile(
    r"\bTesla\b|\bGRID\b|\b(?:A100|A800|A30|A40|A16|A10G?|A2|L4|L40S?|L20|H100|H200|H800|H20|B200|GH200)\b|"
    r"\bRTX (?:A[456]000|A5500|[68]000|6000 Ada)\b|Quadro RTX [68]000")


def _nvidia_gpus(lspci: str) -> list[str]:
    """The GPUs' device names in `lspci -vmm -nn` records (class 03xx), or `lspci -nn` lines."""
    names = []
    for record in re.split(r"\n\s*\n", lspci.strip()):
        fields = dict(line.split(":\t", 1) for line in record.splitlines() if ":\t" in line)
        if fields.get("Class", "").endswith(("[0300]", "[0302]")):
            names.append(fields.get("Device", "?"))
    if not names:  # `lspci -nn` lines
        names = [line.split(": ", 1)[1] for line in lspci.splitlines() if re.search(r"\[030[02]\]: ", line)]
    return names


def pci_virtualization(lspci: str) -> str:
    """What a node's PCI devices say before a driver: "vgpu" (a vGPU profile named),
    "passthrough" (a GPU vGPU does not run on: the whole GPU), or "cannot-tell" (a GPU
    that could be either, or one pci.ids does not name yet: ask, do not guess)."""
    if pci_vgpu(lspci):
        return "vgpu"
    gpus = _nvidia_gpus(lspci)
    if any(_VGPU_CAPABLE.search(name) or re.match(r"Device \[?[0-9a-f]{4}", name) for name in gpus):
        return "cannot-tell"
    return "passthrough"



# An NVSwitch is an NVIDIA PCI device of class "Bridge, other" (0680); the GPUs are 0302.
# The class is the device's own (config space), so this holds whatever pci.ids names it
# (Debian 12's copy knows the A100's 1af1, not the H100's 22a3).
_NVSWITCH = re.compile(r"Bridge \[0680\]")


def nvswitch_count(lspci: str) -> int:
    """NVSwitches in `lspci -nn -d 10de:` or `lspci -vmm -nn -d 10de:` output: an HGX/DGX
    board passed through whole, whose GPUs need Fabric Manager before CUDA initialises."""
    return sum(1 for line in lspci.splitlines() if _NVSWITCH.search(line))


def fabricmanager_unavailable(distribution: str) -> str:
    """Why Fabric Manager cannot be installed from this distribution's archive ("": it can)."""
    if distribution.lower() == "ubuntu":
        return ""
    return (f"this node has NVSwitches and needs NVIDIA Fabric Manager, which {distribution}'s archive does not carry: "
            "use an Ubuntu image (nvidia-fabricmanager-<branch>), or an image with the driver and Fabric Manager "
            "installed (openstack.nvidia_driver_install: false)")


def fabricmanager_packages(distribution: str, driver_packages: list[str]) -> list[str]:
    """Fabric Manager and NSCQ for the driver branch the node gets (they must match the
    driver's version: Ubuntu's archive keeps them in step per -server branch). ValueError
    names the fix where the distribution has no such package."""
    why = fabricmanager_unavailable(distribution)
    if why:
        raise ValueError(why)
    branches = sorted({int(m) for p in driver_packages for m in re.findall(r"-(\d+)-server$", p)})
    if not branches:
        raise ValueError("this node has NVSwitches: Fabric Manager must match the driver's branch, and none was found "
                         "among the driver packages; set openstack.nvidia_driver_branch (e.g. 535)")
    return [f"nvidia-fabricmanager-{branches[-1]}", f"libnvidia-nscq-{branches[-1]}"]


_FABRIC = re.compile(r"^\s*Fabric\s*\n\s*State\s*:\s*(.+?)\s*\n\s*Status\s*:\s*(.+?)\s*$", re.MULTILINE)


def fabric_states(smi_q: str) -> list[tuple[str, str]]:
    """Per GPU, the NVSwitch fabric's (State, Status) from `nvidia-smi -q`: ("Completed",
    "Success") once Fabric Manager has trained the fabric; ("In Progress", ...) before."""
    return _FABRIC.findall(smi_q)


def fabric_ready(smi_q: str) -> bool:
    """Every GPU that reports a fabric state has it trained. NVML reports it on Hopper and
    newer; an A100 board says N/A (or older drivers print no Fabric section): there the
    running Fabric Manager is the evidence, and gpu_check's CUDA operation the proof."""
    reported = [(state, status) for state, status in fabric_states(smi_q) if state != "N/A"]
    return all(state == "Completed" and status == "Success" for state, status in reported)


def check_problems(host: str, record: dict[str, Any], choice: dict[str, Any]) -> list[str]:
    """What is wrong with a GPU node after the runtime is installed, one line per cause.

    `record`: benchmarks/gpu_check.py's JSON on that node; `choice`: the torch build the
    cluster chose (deployer.gpu_runtime.Choice.as_dict()).
    """
    if record.get("error"):
        return [f"{host}: {record['error']}"]
    problems = []
    want = choice.get("cuda")
    if want and record.get("torch_cuda") != want:
        problems.append(f"{host}: torch reports CUDA {record.get('torch_cuda')} but {choice.get('requirement')} "
                        f"(CUDA {want}) was chosen: another torch shadows it in the venv")
    if not record.get("cuda_available"):
        problems.append(f"{host}: torch sees no GPU ({record.get('cuda_error') or 'torch.cuda.is_available() is False'}); "
                        f"check the driver (nvidia-smi) and that CUDA {want} runs on it")
        return problems
    archs = [a.removeprefix("sm_").replace("_", "") for a in record.get("arch_list", [])]
    archs = [f"{a[:-1]}.{a[-1]}" for a in archs if a.isdigit()]
    for dev in record.get("devices", []):
        if not runs_on(dev["compute_cap"], archs):
            problems.append(f"{host}: GPU {dev['index']} ({dev['name']}, {dev['compute_cap']}) has no code in this "
                            f"torch build (arch list {', '.join(record.get('arch_list', []))})")
    if record.get("cuda_op") != "ok":
        problems.append(f"{host}: a CUDA operation failed: {record.get('cuda_op')}")
    if record.get("nccl") != "ok":
        problems.append(f"{host}: NCCL all-reduce between the node's GPUs failed: {record.get('nccl')}")
    return problems


# Debian 12's non-free archive: the default driver (535) and the Tesla branches it carries,
# each with nvidia-smi and the CUDA driver library. libcuda1 (libnvidia-tesla-<b>-cuda1)
# comes with the driver only through Recommends (nvidia-driver-libs -> libnvidia-encode1
# -> libnvcuvid1 -> libcuda1, read in bookworm's Packages), and the role installs
# without Recommends: named here, or torch finds no GPU on a node where nvidia-smi works.
DEBIAN_BRANCHES = {None: ("nvidia-driver", "nvidia-smi", "libcuda1"),
                   535: ("nvidia-tesla-535-driver", "nvidia-tesla-535-smi", "libnvidia-tesla-535-cuda1"),
                   470: ("nvidia-tesla-470-driver", "nvidia-tesla-470-smi", "libnvidia-tesla-470-cuda1")}


def driver_packages(distribution: str, branch: int | None) -> list[str]:
    """The apt packages of a datacenter driver with nvidia-smi, for a pinned `branch` (or the
    distribution's default when None). Ubuntu without a branch returns [] (ubuntu-drivers
    picks, then driver_utils_package adds its nvidia-smi). ValueError names the fix."""
    dist = distribution.lower()
    if dist == "ubuntu":
        return [] if branch is None else [f"nvidia-driver-{branch}-server", f"nvidia-utils-{branch}-server"]
    if dist == "debian":
        if branch not in DEBIAN_BRANCHES:
            have = ", ".join(str(b) for b in DEBIAN_BRANCHES if b)
            raise ValueError(f"Debian's non-free archive has driver branches {have} (and its default): set "
                             f"openstack.nvidia_driver_branch to one of them, or use an image with driver {branch}")
        return [*DEBIAN_BRANCHES[branch], "firmware-misc-nonfree"]  # the kernel headers: kernel_packages
    raise ValueError(f"no driver packages known for {distribution}: use Ubuntu or Debian images, an image with the "
                     "driver (openstack.nvidia_driver_install: false), or set the role's nvidia_driver_package")


# Ansible's ansible_architecture (uname -m) -> Debian's architecture name.
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def kernel_flavour(kernel: str, architecture: str) -> str:
    """Debian's flavour of the running kernel (`uname -r`: 6.1.0-28-cloud-amd64 ->
    cloud-amd64), else the machine's plain one (amd64, arm64: a GH200 node is arm64)."""
    arch = DEBIAN_ARCH.get(architecture, architecture)
    m = re.search(rf"-((?:cloud|rt)-)?{re.escape(arch)}$", kernel)
    return f"{(m.group(1) or '') if m else ''}{arch}"


def kernel_packages(kernel: str, architecture: str, running_headers_available: bool) -> dict[str, Any]:
    """What DKMS needs to build the module for the kernel the node will run (Debian).

    The running kernel's own headers (linux-headers-$(uname -r)) while the archive still
    has them (the flavour's metapackage alone brings the newest kernel's instead, and no
    module for the running one), with the flavour's. Once they are gone (an image older than the archive's
    kernel), the flavour's kernel and headers are upgraded together, and the reboot the
    driver needs starts the kernel the module was built for. upgrade: apt must upgrade
    them (state latest), not only install."""
    flavour = kernel_flavour(kernel, architecture)
    if running_headers_available:
        # The flavour's headers too: a newer kernel already installed (unattended-upgrades on
        # first boot) is the one the driver's reboot starts, and DKMS builds for every
        # installed kernel whose headers are there.
        return {"packages": [f"linux-headers-{kernel}", f"linux-headers-{flavour}"], "upgrade": False}
    return {"packages": [f"linux-image-{flavour}", f"linux-headers-{flavour}"], "upgrade": True}


def driver_utils_package(dpkg_list: str) -> list[str]:
    """After `ubuntu-drivers install --gpgpu`: nvidia-smi's package for the branch it chose,
    from `dpkg-query -W -f '${Package}\\n'` output (ubuntu-drivers leaves nvidia-smi out)."""
    branches = sorted({int(m) for m in re.findall(r"^(?:nvidia-headless-no-dkms|linux-modules-nvidia|nvidia-driver|"
                                                  r"nvidia-headless)-(\d+)-server", dpkg_list, re.MULTILINE)})
    return [f"nvidia-utils-{branches[-1]}-server"] if branches else []


# --- health (deployer check): nvidia-smi -q read as its indented tree --------------------

def smi_gpus(smi_q: str) -> list[tuple[str, dict[str, Any]]]:
    """`nvidia-smi -q` as (bus id, tree) per GPU: "Key : value" lines are leaves, a line
    without a colon opens a section holding the lines indented under it."""
    gpus: list[tuple[str, dict[str, Any]]] = []
    stack: list[tuple[int, dict[str, Any]]] = []
    for raw in smi_q.splitlines():
        if not raw.strip() or raw.startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        if indent == 0:
            stack = []
            if line.startswith("GPU "):
                tree: dict[str, Any] = {}
                gpus.append((line[4:].strip(), tree))
                stack = [(0, tree)]
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not stack:
            continue
        parent = stack[-1][1]
        key, sep, value = line.partition(":")
        if sep and value.strip():
            parent[key.strip()] = value.strip()
        else:
            section: dict[str, Any] = {}
            parent[key.strip()] = section
            stack.append((indent, section))
    return gpus


def _count(value: Any) -> int:
    try:
        return int(str(value).split()[0])
    except (ValueError, IndexError):
        return 0  # N/A: the GPU does not keep this counter


def _uncorrectable(ecc: dict[str, Any]) -> int:
    """Uncorrectable ECC errors of one ECC section: SRAM + DRAM (current drivers), or the
    Double Bit total (older ones)."""
    new = sum(_count(v) for k, v in ecc.items() if isinstance(v, str) and "Uncorrectable" in k)
    old = ecc.get("Double Bit")
    return new + (_count(old.get("Total")) if isinstance(old, dict) else 0)


def gpu_problems(tree: dict[str, Any]) -> list[tuple[str, str]]:
    """(status, what) of one GPU's tree: uncorrectable ECC errors since the driver loaded,
    or a failed row remap, fail; errors in the GPU's history, a remap or page retirement
    waiting for a reset, a PCIe link narrower than it can be, warn. The link's generation
    is not judged: an idle GPU drops it to save power and raises it under load."""
    out: list[tuple[str, str]] = []
    ecc = tree.get("ECC Errors") or {}
    volatile, aggregate = _uncorrectable(ecc.get("Volatile") or {}), _uncorrectable(ecc.get("Aggregate") or {})
    if volatile:
        out.append(("fail", f"{volatile} uncorrectable ECC error(s) since the driver loaded"))
    elif aggregate:
        out.append(("warn", f"{aggregate} uncorrectable ECC error(s) in its history"))
    rows = tree.get("Remapped Rows") or {}
    if isinstance(rows, dict):
        if str(rows.get("Remapping Failure Occurred", "")).lower() == "yes":
            out.append(("fail", "a row remapping failed: the GPU's memory is failing"))
        elif str(rows.get("Pending", "")).lower() == "yes":
            out.append(("warn", "a row remap is pending: reset the GPU (or reboot the node) to apply it"))
    pages = tree.get("Retired Pages") or {}
    if isinstance(pages, dict) and any(str(v).lower() == "yes" for k, v in pages.items() if k.startswith("Pending")):
        out.append(("warn", "a page retirement is pending: reset the GPU (or reboot the node) to apply it"))
    width = ((tree.get("PCI") or {}).get("GPU Link Info") or {}).get("Link Width") or {}
    if isinstance(width, dict) and _count(width.get("Current", "").rstrip("x")) < _count(width.get("Max", "").rstrip("x")):
        out.append(("warn", f"PCIe link x{width['Current'].rstrip('x')} of x{width['Max'].rstrip('x')}: a card or "
                            f"riser seated badly, or a slot narrower than the card"))
    return out


# An NVIDIA GPU's first line in `lspci -vv -d 10de:` (class 0302 "3D controller", or 0300
# "VGA compatible controller"), with its revision: ff where config space reads all ones.
_LSPCI_GPU = re.compile(r"^(?P<bdf>[0-9a-f:.]+) (?:3D|VGA compatible) controller(?: \[030[02]\])?: NVIDIA", re.IGNORECASE)
# Anywhere on the line: with -v lspci prints the prog-if after it, "(rev ff) (prog-if ff)"
# for a GPU whose config space reads all ones, "(rev a1) (prog-if 00 [VGA controller])".
_REV = re.compile(r"\(rev ([0-9a-f]{2})\)", re.IGNORECASE)
_LNK = re.compile(r"^\s*Lnk(?P<kind>Cap|Sta):.*?Width x(?P<width>\d+)")


def pcie_links(lspci: str) -> list[dict[str, Any]]:
    """Each NVIDIA GPU in `lspci -vv -d 10de:`: its address, revision and PCIe link width,
    capable (LnkCap) and current (LnkSta); a width is None where lspci could not read the
    capability (not root: "Capabilities: <access denied>")."""
    gpus: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in lspci.splitlines():
        if line and not line[0].isspace():
            m, rev = _LSPCI_GPU.match(line), _REV.search(line)
            current = {"bdf": m["bdf"].lower(), "rev": rev[1].lower() if rev else "", "cap": None, "sta": None} if m else None
            if current is not None:
                gpus.append(current)
        elif current is not None and (lnk := _LNK.match(line)) and current[lnk["kind"].lower()] is None:
            current[lnk["kind"].lower()] = int(lnk["width"])  # the first: the GPU's own link, not a secondary capability
    return gpus


def pcie_problems(lspci: str) -> list[tuple[str, str, str]]:
    """(status, bus address, what) from the GPUs' PCI view, which holds without a driver: a
    GPU reading as revision ff has fallen off the bus (its config space answers all ones;
    nvidia-smi then fails or leaves it out), fail; a link narrower than the GPU can run, warn.
    Link speed is not judged: an idle GPU lowers it to save power."""
    out = []
    for g in pcie_links(lspci):
        if g["rev"] == "ff":
            out.append(("fail", g["bdf"], "reads as rev ff on the PCI bus: the GPU has fallen off the bus (reset it, "
                                          "or reboot the node; replace it if it happens again)"))
        elif g["cap"] and g["sta"] and g["sta"] < g["cap"]:
            out.append(("warn", g["bdf"], f"PCIe link x{g['sta']} of x{g['cap']} (lspci): a card or riser seated badly, "
                                          f"or a slot narrower than the card"))
    return out


def _pci_address(address: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of 00000000:19:00.0, 0000:19:00.0 or 19:00.0 (domain 0)."""
    m = re.fullmatch(r"(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-7])", address.strip().lower())
    return (int(m[1] or "0", 16), int(m[2], 16), int(m[3], 16), int(m[4])) if m else None


def same_bus(smi_bus: str, lspci_bdf: str) -> bool:
    """nvidia-smi's 00000000:19:00.0 and lspci's 19:00.0 (or 0000:19:00.0) name one device;
    the domain counts (VMs that give each GPU a domain of its own: 0001:00:00.0, 0002:...)."""
    a, b = _pci_address(smi_bus), _pci_address(lspci_bdf)
    return a is not None and a == b


_ROW = re.compile(r"^\|\s*(?P<name>[^|]*?)\s*\|\s*(?P<value>.*?)\s*\|?\s*$")
_DCGM_STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "skip": "skip"}


_DCGM_WORST = ("fail", "warn", "pass", "skip")  # a test's status: the worst of its GPUs'


def dcgm_json_results(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """`dcgmi diag -r N -j` as (test, status, what it said). DCGM 3.x's top key is "DCGM
    GPU Diagnostic", 4.x's "DCGM Diagnostic" (NVIDIA/DCGM testing/python3/dcgm_diag_schema.json
    of each); under it, test_categories[].tests[] with a name and results[], one per GPU
    (gpu_ids, gpu_id or entity_id) or one for the node, each with a status and warnings[]
    ({"warning": text} objects; strings in older releases)."""
    root = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic") or {}
    if root.get("runtime_error"):  # it could not run (NVIDIA/DCGM dcgmi/Diag.cpp, HelperDisplayFailureMessage)
        return [("diagnostic", "fail", f"DCGM could not run it: {root['runtime_error']}")]
    out = []
    for category in root.get("test_categories") or []:
        for test in category.get("tests") or []:
            results = test.get("results") or [test.get("test_summary") or {}]
            by_status: dict[str, list[str]] = {}
            said: list[str] = []
            for r in results:
                word = str(r.get("status", "")).strip().lower()
                status = _DCGM_STATUS.get(word, "skip")  # "Not Run" and the like
                gpu = next((str(r[k]) for k in ("gpu_id", "gpu_ids", "entity_id") if r.get(k) not in (None, "")), "")
                by_status.setdefault(status, []).append(gpu)
                for w in r.get("warnings") or []:
                    text = str(w.get("warning", "") if isinstance(w, dict) else w).strip()
                    if text and text not in said:
                        said.append(text)
            status = next(s for s in _DCGM_WORST if s in by_status) if by_status else "skip"
            gpus = sorted({g for g in by_status.get(status, []) if g}, key=lambda g: (len(g), g))
            where = f" - GPU: {', '.join(gpus)}" if gpus and status in ("fail", "warn") else ""
            text = " ".join([f"{status.capitalize()}{where}", *said])
            if status == "fail" and said and all(w.startswith("Persistence Mode:") for w in said):
                # DCGM 4.x fails its software test where persistence mode is off (error 29).
                # The GPUs work (each CUDA start pays the driver's set-up): a warning with
                # DCGM's fix, not a failed node; images and drivers often ship with it off.
                status = "warn"
                text = " ".join([f"Warn{where}", *said]) + " (DCGM says Fail; a warning here: the GPUs work without it)"
            out.append((str(test.get("name", "?")), status, text))
    return out


def dcgm_results(text: str) -> list[tuple[str, str, str]]:
    """`dcgmi diag -r N`'s output, JSON (-j: dcgm_json_results) or its table, as (test,
    status, what it said). The table: a test's result lines
    (Pass, Fail - GPU: 0, Skip - All...), and the Warning or Error rows under it, which
    make it a warn or a fail. Metadata rows (versions, device ids) are not tests."""
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end and not text[:start].strip().startswith("+"):  # JSON, maybe after a line on stderr
        try:
            return dcgm_json_results(json.loads(text[start:end + 1]))
        except ValueError:
            pass
    tests: list[list[str]] = []  # [name, status, message]
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("+") or line.startswith("|-----") or line.startswith("|====="):
            continue
        m = _ROW.match(line)
        if not m:
            continue
        name, value = m.group("name"), m.group("value")
        word = value.split(" ")[0].lower() if value else ""
        if name in ("Warning", "Error") and current is not None:
            current[1] = "fail" if name == "Error" or current[1] == "fail" else "warn"
            current[2] = (current[2] + " " + value).strip()
            continue
        if name in ("Warning", "Error"):  # a finding with no test above it: a test of its own
            current = [name.lower(), "fail" if name == "Error" else "warn", value]
            tests.append(current)
            continue
        if name and word in _DCGM_STATUS:
            current = [name, _DCGM_STATUS[word], value]
            tests.append(current)
        elif not name and current is not None and value:
            if word == "fail" or (word == "warn" and current[1] == "pass"):
                current[1] = _DCGM_STATUS[word]
            current[2] = (current[2] + " " + value).strip() if word in _DCGM_STATUS else current[2] + value
        else:
            current = None if name else current  # a metadata row
    return [(n, s, m) for n, s, m in tests]
