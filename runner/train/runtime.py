"""Per-rank runtime: process group, device, determinism switches, log redirection and cancel signals."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from runner.lifetime import signal_on_parent_death

# After a cancel signal, a rank stuck in a collective (a peer died) cannot reach the step boundary:
# leave this long for a clean stop, then exit hard so the launcher is never left waiting.
CANCEL_GRACE_S = 20.0


@dataclass
class Runtime:
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    device: str
    stop_requested: bool = False
    # SIGTERM / SIGUSR1 (a scheduler's stop or preemption warning) ask for a checkpoint at the stop, so the run
    # can be resumed even with train.checkpoint_every 0; SIGINT (a cancel) only stops.
    checkpoint_requested: bool = False
    _timer: threading.Timer | None = field(default=None, repr=False)

    def synchronize(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def mem_gib(self) -> float:
        """The peak so far: CUDA's allocated peak, or the process's peak resident memory on CPU."""
        if self.device == "cuda":
            return round(torch.cuda.max_memory_allocated() / 2**30, 3)
        return round(_peak_rss_bytes() / 2**30, 3)

    def peak_mem_gib(self) -> dict[str, float]:
        if self.device == "cuda":
            return {"allocated": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                    "reserved": round(torch.cuda.max_memory_reserved() / 2**30, 3)}
        return {"rss": round(_peak_rss_bytes() / 2**30, 3)}

    def request_stop(self, signum: int, _frame: object) -> None:
        self.stop_requested = True
        if signum != signal.SIGINT:
            self.checkpoint_requested = True
        if self._timer is None:
            self._timer = threading.Timer(CANCEL_GRACE_S, os._exit, args=(128 + signum,))
            self._timer.daemon = True
            self._timer.start()


def _peak_rss_bytes() -> int:
    """The largest resident set this process has had (the kernel's high-water mark): the step's peak, which the
    resident set read after the step (its activations freed) would miss."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def redirect_output(log_path: Path) -> None:
    """Send this rank's stdout/stderr (Python and native) to its own log file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def set_determinism(seed: int, deterministic: bool, device: str) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        # cuBLAS needs its workspace pinned before the first CUDA call for deterministic GEMMs; the launcher
        # exports CUBLAS_WORKSPACE_CONFIG, this is the fallback for direct runs.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=device == "cuda")
        if device == "cuda":
            torch.backends.cudnn.benchmark = False


M_MMAP_THRESHOLD = -3
"""mallopt's parameter number for the size above which glibc maps a block on its own."""


def hold_to(memory_gib: float | None, device: str, local_rank: int) -> None:
    """Keep this rank within hardware.memory_gib: CUDA's caching allocator refuses past it (an out-of-memory error),
    and on CPU the kernel refuses data memory past it (RLIMIT_DATA, set from what the rank holds now, so it caps
    the resident memory the rest of the run adds: an allocation past it fails as out of memory)."""
    if memory_gib is None:
        return
    limit = memory_gib * 2**30
    if device == "cuda":
        total = torch.cuda.get_device_properties(local_rank).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), local_rank)
        return
    import ctypes
    import resource

    import psutil

    # pyarrow (under datasets) allocates through mimalloc, which reserves its first arena as 1 GiB of untouched
    # writable memory: the limit counts it whole (the embedded model lost half of a 2 GiB cap to it). The system
    # allocator maps what it is asked for.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].set_memory_pool(sys.modules["pyarrow"].system_memory_pool())
    # The limit counts mapped data memory. By default glibc raises its mmap threshold each time a large block is
    # freed, then serves blocks up to 32 MiB from arenas whose freed pages leave the resident set but stay mapped:
    # the count drifts away from the resident memory it stands for (the embedded model hit a 2 GiB limit at 5k
    # tokens with ~1 GiB resident). A fixed threshold keeps large blocks mapped only while they live.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 1 << 20)
    data = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmData:"))
    # Mapped data memory runs ahead of the resident part by about what it does now (stacks, arenas): keep that gap.
    allowed = int(data + limit - psutil.Process().memory_info().rss)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (allowed if hard == resource.RLIM_INFINITY else min(allowed, hard), hard))


def init(device: str) -> Runtime:
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    node_rank = int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")))
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    rt = Runtime(rank=rank, local_rank=local_rank, world_size=world, node_rank=node_rank, device=device)
    signal.signal(signal.SIGTERM, rt.request_stop)
    signal.signal(signal.SIGINT, rt.request_stop)
    signal.signal(signal.SIGUSR1, rt.request_stop)
    # A SIGTERM when torchrun dies (even by SIGKILL): a rank never outlives its launcher.
    signal_on_parent_death(signal.SIGTERM)
    return rt

