"""What both benchmark scripts need and must do the same way: where rank 0 listens for
torch.distributed's rendezvous, the MPI library's name and NCCL's version for the version record.

Imported by resnet_synthetic.py, allreduce.py and gpu_check.py from their own directory, so each
stays runnable by hand: `mpirun ... python /shared/benchmarks/<script>.py`.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # annotations only: mpi4py is imported where MPI is needed
    from mpi4py import MPI


def iface_ip(name: str) -> str:
    """The IPv4 address of interface `name` (SIOCGIFADDR)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))[20:24])


def rendezvous(comm: MPI.Comm, hosts: list[str]) -> tuple[str, int]:
    """Rank 0's address and a free port, broadcast to every rank; MASTER_ADDR and
    MASTER_PORT win. `hosts`: every rank's hostname (allgather)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if comm.rank == 0:
        ifname = (os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME") or "").split(",")[0]
        if not addr:  # why not gethostbyname alone: Debian maps the hostname to 127.0.1.1
            addr = ("127.0.0.1" if len(set(hosts)) == 1 else
                    iface_ip(ifname) if ifname else socket.gethostbyname(socket.gethostname()))
        if not port:
            with socket.socket() as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
    addr, port = comm.bcast((addr, port))
    return addr, int(port)


def quiet_barrier(comm: MPI.Comm, poll_s: float = 0.05) -> None:
    """Wait for every rank without spinning: Open MPI's blocking calls busy-poll, so a rank
    done early would take CPU from one still working (the straggler step times each rank
    on its own), and it would sit in MPI_Finalize with its heartbeat stopped."""
    import time

    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(poll_s)


def mpi_library() -> str:
    """The MPI library's own first line (e.g. "Open MPI v4.1.4, ...")."""
    from mpi4py import MPI

    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def nccl_version_text(version: int | tuple[int, ...]) -> str:
    """torch.cuda.nccl.version() as "2.21.5": a (major, minor, patch) tuple on current torch, an
    int NCCL_VERSION_CODE on old torch (major*1000 + minor*100 + patch before NCCL 2.9,
    major*10000 + minor*100 + patch from 2.9 on, e.g. 2708 -> 2.7.8, 21805 -> 2.18.5)."""
    if isinstance(version, int):
        major, rest = divmod(version, 10000 if version >= 10000 else 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return ".".join(map(str, version))


class WholeLines:
    """stdout for a process with a second thread that prints: each thread's text goes out
    a whole line at a time. print() writes its text and its newline apart, and a large
    line's write releases the GIL, so another thread's line could land inside it (a
    HEARTBEAT in the middle of a rank's JSON record, seen here with 20 kB lines)."""

    def __init__(self, out: TextIO) -> None:
        import threading

        self._out, self._lock, self._local = out, threading.Lock(), threading.local()

    def write(self, text: str) -> int:
        pending = getattr(self._local, "text", "") + text
        lines, newline, rest = pending.rpartition("\n")
        self._local.text = rest
        if newline:
            with self._lock:
                self._out.write(lines + newline)
        return len(text)

    def flush(self) -> None:
        rest, self._local.text = getattr(self._local, "text", ""), ""
        with self._lock:
            if rest:
                self._out.write(rest)
            self._out.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


def beating_from_import(argv: list[str]) -> None:
    """MPI initialised, then the heartbeat started (given --heartbeat S in `argv`), before a
    script imports torch: seconds, over ten on a busy node with PyPI's CUDA build.

    Why this order: MPI_Init waits for every rank and holds the GIL while it waits, so a
    rank blocked there cannot beat. Had torch come first, a rank stopped in its imports
    would leave every other rank silent in MPI_Init, and the watch would name the lowest
    of them, on another node. Initialised first, MPI_Init waits only for the others'
    interpreters to start; a rank that stops later in its imports falls silent alone while
    the others beat in their first collective (mpi4py releases the GIL there)."""
    from mpi4py import MPI

    every_s = 0.0
    for i, arg in enumerate(argv):
        if arg == "--heartbeat" and i + 1 < len(argv):
            every_s = float(argv[i + 1])
        elif arg.startswith("--heartbeat="):
            every_s = float(arg.split("=", 1)[1])
    if every_s:
        Heartbeat.started(MPI.COMM_WORLD.rank, every_s, step="import")


_PROCESS_BEAT: "Heartbeat | None" = None  # the process's own, started once (Heartbeat.started)


class Heartbeat:
    """`HEARTBEAT {"rank": r, "step": s}` every `every_s` seconds from a thread of its own,
    with the step the rank's main thread last set. A rank blocked in a collective keeps
    beating (its thread runs); a stopped or frozen process does not: the rank that falls
    silent is the one that hangs (deployer/launch/rank_watch.py names it)."""

    def __init__(self, rank: int, every_s: float = 1.0, step: str = "start") -> None:
        import threading

        self.rank, self.step, self.every_s = rank, step, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    @classmethod
    def started(cls, rank: int, every_s: float, step: str = "start") -> "Heartbeat":
        """Beating until the process ends (every_s 0: never beats; `step` may still be set).
        The one beating_from_import started is the process's: it goes on, not a second."""
        import atexit

        global _PROCESS_BEAT
        if _PROCESS_BEAT is not None and _PROCESS_BEAT.rank == rank and _PROCESS_BEAT._thread.is_alive():
            return _PROCESS_BEAT
        beat = cls(rank, every_s or 1.0, step)
        if every_s:
            atexit.register(beat.__exit__)  # stopped before the interpreter's last flush of stdout
            beat.__enter__()
            _PROCESS_BEAT = beat
        return beat

    def __enter__(self) -> "Heartbeat":
        import sys

        if not isinstance(sys.stdout, WholeLines):
            sys.stdout = WholeLines(sys.stdout)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # Joined, not left to die with the process: a daemon thread frozen at exit while
        # it holds WholeLines' lock would hang the interpreter's last flush.
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def done_together(self, comm: MPI.Comm) -> None:
        """A rank's end: beat while it waits for every other rank (none sits silent in
        MPI_Finalize while a slower one works), then stop, and wait until every rank has
        stopped, so that none beats while rank 0 prints its record: Open MPI forwards output
        in 4 kB chunks, and another rank's beat could land inside a long line."""
        self.step = "done: waiting for the other ranks"
        quiet_barrier(comm)
        self.__exit__()
        comm.Barrier()

    def _beat(self) -> None:
        import json

        while not self._stop.is_set():
            print("HEARTBEAT " + json.dumps({"rank": self.rank, "step": self.step}), flush=True)  # sys.stdout: WholeLines
            self._stop.wait(self.every_s)
