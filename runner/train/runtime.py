"""Per-rank runtime: process group, device, determinism switches, log redirection and cancel signals."""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from runner.train.lifetime import signal_on_parent_death

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

